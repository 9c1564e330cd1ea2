"""``Trainer(num_nodes=N, devices=M).fit`` as one distributed job of the cluster.

The caller pickles the config, the module and the *recipes* for the data (the
module's own ``train_dataloader()``, a loader factory, a datamodule; a small
DataLoader may travel by value) and submits one gang of N x M ranks with
``gpulayer.distributed``. Every rank builds its data where it runs, calls
``fit_rank``, and rank 0 sends back the weights, counters and metrics that the
caller's model and trainer take. Datasets never pass through Redis.

>>> gpulayer.init()                                                      # doctest: +SKIP
>>> trainer = Trainer(num_nodes=2, devices=2, accelerator="cpu", max_epochs=3)
>>> trainer.fit(model, train_dataloaders=lambda: DataLoader(MyDataset(), batch_size=32))
>>> trainer.fit_info["grad_sync"], trainer.fit_info["placement"]
('two_level', 'placed on 2 workers in zone europe-west1-b')

With ``Trainer(max_restarts=K)`` a rank that fails or a worker that dies
restarts the whole gang (``distributed(max_restarts=K)``) on live workers, and
every rank of the restarted attempt (``TORCHELASTIC_RESTART_COUNT`` > 0)
resumes from the newest checkpoint this fit wrote (each carries the fit's id),
so at most one checkpoint interval is lost; with none written yet it starts
over. The checkpoint directory must be one every worker reads: the local disk
for workers on one machine, shared storage on a real cluster.
``fit_info["attempts"]`` says where each attempt ran and why it ended.

With ``Trainer(priority=P)`` the gang waits and preempts as ``distributed(priority=P)`` does. A
preempted fit's ranks get SIGTERM: ``trainer.received_sigterm`` turns True, rank 0 saves a full
checkpoint at the end of its batch (``preempted-step=N.ckpt`` in the first checkpoint callback's
directory, else ``<default_root_dir>/checkpoints``) and the attempt stops; requeued, the fit
resumes from it as a restart does (the preemption uses none of ``max_restarts``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from typing import Any, Callable, Iterator

import cloudpickle

from gpulayer.trainer.config import TrainerConfig
from gpulayer.trainer.errors import RankFailed, TrainerConfigError, TrainerError
from gpulayer.trainer.seed import SEED_ENV, SEED_WORKERS_ENV
from gpulayer.payload import in_library

# A loader passed as an object travels inside the job's payload (through Redis): only small ones.
MAX_LOADER_BYTES = 4 << 20


def fit_on_cluster(fit_rank: Callable[..., Any], config: TrainerConfig, module: Any, train: Any, val: Any,
                   datamodule: Any, ckpt_path: str | None) -> dict[str, Any]:
    """Run the fit as ``num_nodes x devices`` ranks of ``fit_rank`` on the connected cluster; rank 0's result.

    The caller hands ``fit_rank`` in (``trainer.fit_rank``, pickled by reference), so this module never
    imports the Trainer back.
    """
    import gpulayer  # the client layer, only to submit this fit
    from gpulayer.errors import JobFailed
    from gpulayer.output import watch

    with _user_code_by_value():
        for what, obj in (("train_dataloaders", train), ("val_dataloaders", val), ("datamodule", datamodule)):
            _check_travels(what, obj, config)
        try:
            blob = cloudpickle.dumps((fit_rank, config, module, train, val, datamodule, ckpt_path, _seed_env(),
                                      uuid.uuid4().hex))
        except Exception as err:
            raise TrainerError(
                f"the model, callbacks or data recipes could not be pickled for the cluster ({type(err).__name__}: "
                f"{err}); open files, locks, sockets and generators cannot travel: create them inside "
                "train_dataloader() or a loader factory"
            ) from err
    job = gpulayer.distributed(
        run_rank, blob, nodes=config.num_nodes, procs_per_node=config.devices, resources=_resources(config),
        backend="nccl" if config.accelerator == "cuda" else "gloo", max_restarts=config.max_restarts,
        priority=config.priority,
        on_output=show_as_local if watch.enabled() else None,
    )
    try:
        results = job.get()
    except JobFailed as err:
        rank = getattr(err, "rank", None)
        if rank is None:
            raise
        failed = RankFailed(rank, f"{err.message}\n{err.traceback or ''}".rstrip())
        failed.attempts = _attempts(job)
        raise failed from err
    except KeyboardInterrupt:
        job.cancel()  # stop every rank everywhere before giving the terminal back
        raise
    result = results[0]
    result["fit_info"] = {**result.get("fit_info", {}), "job_id": job.id, "placement": job.placement.reason,
                          "workers": list(job.placement.workers), "restarts": job.attempt,
                          "attempts": _attempts(job)}
    return result


def show_as_local(rank: int, stream: str, line: str) -> None:
    """A rank's output line, printed here: rank 0's as a local fit prints it (its model summary, its progress
    lines, its warnings), any other rank's prefixed ``(rank R)``."""
    out = sys.stdout if stream == "stdout" else sys.stderr
    try:
        out.write(f"{line}\n" if rank == 0 else f"(rank {rank}) {line}\n")
        out.flush()
    except (ValueError, OSError):
        pass


def _attempts(job: Any) -> list[dict[str, Any]]:
    """Where each attempt ran and how it ended: ``attempt``, ``workers`` (index = node), ``placement``,
    ``outcome``, ``failure`` (the first failure's message), ``failed_rank``, ``lost_workers``."""
    return [dict(a) for a in job.attempts]


def run_rank(blob: bytes) -> dict[str, Any] | None:
    """One rank of a cluster fit (runs on a worker, torchrun's environment set): rank 0 returns the result."""
    from gpulayer.trainer.seed import seed_everything

    fit_rank, config, module, train, val, datamodule, ckpt_path, seed_env, fit_id = cloudpickle.loads(blob)
    if SEED_ENV in seed_env:  # as the local launcher does: the caller's seed, in every rank
        seed_everything(int(seed_env[SEED_ENV]), workers=seed_env.get(SEED_WORKERS_ENV) == "1")
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0  # the gang was restarted after a failure
    return fit_rank(config, module, train, val, datamodule, ckpt_path, fit_id=fit_id, resume=restarted)


def _resources(config: TrainerConfig) -> Any:
    """The user's ``cluster_resources`` plus ``cuda=True`` (a GPU per process) for a CUDA fit."""
    from gpulayer import Resources

    res = config.cluster_resources
    res = Resources(**res) if isinstance(res, dict) else (res or Resources())
    if config.accelerator == "cuda" and not res.cuda:
        res = Resources(**{**res.model_dump(), "cuda": True, "gpus": max(res.gpus, 1)})
    return res


def _check_travels(what: str, obj: Any, config: TrainerConfig) -> None:
    """Factories and ``None`` are built in the ranks; a loader object must be small enough to send by value."""
    if obj is None or (callable(obj) and not hasattr(obj, "__iter__")):
        return
    if isinstance(obj, (list, tuple)):
        for item in obj:
            _check_travels(what, item, config)
        return
    fix = (f"pass a function that builds it (fit(model, {what}=make_loader)) or define "
           f"{'train' if what.startswith('train') else 'val'}_dataloader() on the module, so each rank builds its "
           "own data")
    head = f"Trainer(num_nodes={config.num_nodes}).fit got a {type(obj).__name__} for {what}"
    try:
        size = len(cloudpickle.dumps(obj))
    except Exception as err:
        raise TrainerConfigError(f"{head} that cannot be pickled ({type(err).__name__}: {err}); {fix}") from err
    if size > MAX_LOADER_BYTES:
        raise TrainerConfigError(
            f"{head} that pickles to {size / 2**20:.1f} MiB (more than {MAX_LOADER_BYTES / 2**20:.0f} MiB would "
            f"travel through Redis to every rank); {fix}"
        )


def _seed_env() -> dict[str, str]:
    return {k: os.environ[k] for k in (SEED_ENV, SEED_WORKERS_ENV) if k in os.environ}


@contextlib.contextmanager
def _user_code_by_value() -> Iterator[None]:
    """Pickle classes and functions of the user's own modules by value while the fit is packed.

    Workers have gpulayer and the libraries, not the user's source tree (a
    script's modules, a test file); cloudpickle sends ``__main__`` by value on
    its own, this covers the modules it imports.
    """
    already = set(cloudpickle.list_registry_pickle_by_value())
    added = []
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if (name == "__main__" or name in already or name.partition(".")[0] == "gpulayer" or not path
                or not path.endswith(".py") or in_library(path)):
            continue
        cloudpickle.register_pickle_by_value(mod)
        added.append(mod)
    try:
        yield
    finally:
        for mod in added:
            cloudpickle.unregister_pickle_by_value(mod)
