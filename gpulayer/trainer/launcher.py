"""Start the ranks of a multi-process fit on this machine and collect what they return.

Each rank gets the environment torchrun would give it (``gpulayer.procs.env.rank_env``:
the direct launcher, no elastic agent) and is started by the rank runner
(``gpulayer.procs.runner``): forked from a warm template that has imported torch
and gpulayer once (``gpulayer.procs.warm``), or a fresh interpreter with
``GPULAYER_WARM_RANKS=0``. The function and its arguments travel by cloudpickle
through a private temporary directory, so closures and classes defined in
``__main__`` work. The first rank to fail stops the others, and the caller gets
``RankFailed`` with that rank's traceback; no process outlives ``run_ranks``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
import uuid
from typing import Any, Callable

import cloudpickle

from gpulayer.procs import warm
from gpulayer.procs.env import RankLayout, free_port, rank_env
from gpulayer.procs.tempdir import remove_made_here
from gpulayer.procs.runner import RankCommand, RankRunner, report_failure
from gpulayer.trainer.errors import RankFailed, TrainerError

_BOOT = "import sys; from gpulayer.trainer.launcher import rank_main; rank_main(sys.argv[1])"
_GRACE_S = 3.0


def run_ranks(fn: Callable[..., Any], args: tuple = (), *, nodes: int = 1, procs_per_node: int = 1,
              timeout_s: float | None = None, env: dict[str, str] | None = None) -> list[Any]:
    """Run ``fn(*args)`` in ``nodes x procs_per_node`` local processes; return the values by rank.

    ``nodes > 1`` simulates several machines on this one (GROUP_RANK differs),
    which is how the two-level gradient sync is tested without a cluster.
    """
    world = nodes * procs_per_node
    with tempfile.TemporaryDirectory(prefix="gpulayer-ranks-") as tmp:
        try:
            payload = cloudpickle.dumps((fn, args))
        except Exception as err:
            raise TrainerError(
                f"the model, loaders or function could not be pickled for the worker processes ({type(err).__name__}: "
                f"{err}). Pass a function that builds the DataLoader instead of the loader "
                "(fit(model, train_dataloaders=make_loader)), or define train_dataloader() on the module; "
                "open files, locks, sockets and generators cannot travel to other processes"
            ) from err
        with open(os.path.join(tmp, "payload.pkl"), "wb") as f:
            f.write(payload)
        base = dict(os.environ if env is None else env)
        # the ranks import what this process imports, from the same places (test modules, scripts' dirs)
        paths = [p for p in dict.fromkeys([os.getcwd(), *sys.path]) if p]
        base["PYTHONPATH"] = os.pathsep.join(paths)
        port, run_id = free_port(), f"gpulayer-{uuid.uuid4().hex[:12]}"
        commands = []
        for node in range(nodes):
            for local in range(procs_per_node):
                layout = RankLayout(node, local, nodes, procs_per_node)
                commands.append(RankCommand((layout.rank,), ("-c", _BOOT, tmp),
                                            rank_env(layout, master_addr="127.0.0.1", master_port=port,
                                                     run_id=run_id, base_env=base)))
        # A template of our own, for this call: it imports torch while this process pickles, and
        # it is gone when run_ranks returns (nothing outlives the call).
        template = warm.WarmTemplate(base, restart=False).start() if warm.warm_enabled() and world > 1 else None
        runner = RankRunner(commands, template=template, capture=False)
        try:
            runner.start()
            outcome = runner.wait(timeout_s)
            if outcome is None:
                runner.stop(_GRACE_S, reason="timeout")
                raise TrainerError(f"the ranks did not finish within {timeout_s:.0f} s; they were stopped")
            if outcome.state != "succeeded":
                first = outcome.failures[0] if outcome.failures else None
                if first is None:
                    raise TrainerError(f"the ranks ended {outcome.state} (exit codes {outcome.exit_codes})")
                raise RankFailed(first.rank, first.traceback or first.message)
            results = []
            for rank in range(world):
                with open(os.path.join(tmp, f"result_{rank}.pkl"), "rb") as f:
                    results.append(cloudpickle.load(f))
            return results
        finally:
            if runner.started_at is not None:
                runner.stop(_GRACE_S, reason="interrupted")  # a no-op once they all ended
            if template is not None:
                template.close()


# -- inside a rank --------------------------------------------------------------------------------
def rank_main(tmp: str) -> None:
    rank = int(os.environ["RANK"])
    try:
        from gpulayer.trainer.seed import SEED_ENV, seed_everything
        if SEED_ENV in os.environ:
            seed_everything(int(os.environ[SEED_ENV]), workers=os.environ.get("GPULAYER_SEED_WORKERS") == "1")
        with open(os.path.join(tmp, "payload.pkl"), "rb") as f:
            fn, args = cloudpickle.load(f)
        result = fn(*args)
        out = os.path.join(tmp, f"result_{rank}.pkl")
        with open(out + ".tmp", "wb") as f:
            cloudpickle.dump(result, f)
        os.replace(out + ".tmp", out)
    except BaseException as exc:
        report_failure(exc, tb=traceback.format_exc())
        sys.stderr.flush()
        remove_made_here()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    remove_made_here()  # multiprocessing's pymp-* directory, if the rank made one (a DataLoader's workers)
    os._exit(0)  # skip interpreter teardown: process-group destructors can hang after the parent has the result


def _refuse_launch_from_a_child(config) -> None:
    """A ``plugins=[ClusterEnvironment]`` that says this process is not a launched one, while its local rank is
    not 0: launching here would start a second set of ranks from inside the first (Lightning's check)."""
    env = getattr(config, "cluster_environment", None)
    if env is not None and not env.creates_processes_externally and env.local_rank() != 0:
        raise RuntimeError(
            "Lightning attempted to launch new distributed processes with `local_rank > 0`. This should not happen. "
            "Possible reasons: 1) LOCAL_RANK environment variable was incorrectly modified by the user, "
            f"2) `{type(env).__name__}.creates_processes_externally` incorrectly implemented.")


def fit_in_processes(fit_rank: Callable[..., Any], config, module, train, val, datamodule,
                     ckpt_path) -> dict[str, Any]:
    """``Trainer(devices=M).fit`` on this machine: ``fit_rank`` in M ranks, rank 0's result back.

    The caller hands ``fit_rank`` in (``trainer.fit_rank``), so this module never imports the Trainer back.
    """
    _refuse_launch_from_a_child(config)
    return run_ranks(fit_rank, (config, module, train, val, datamodule, ckpt_path),
                     nodes=1, procs_per_node=config.devices)[0]


def stage_in_processes(stage_rank: Callable[..., Any], config, stage, module, loaders, datamodule, ckpt_path,
                       kw) -> dict[str, Any]:
    """``Trainer(devices=M).validate / test / predict`` on this machine: ``stage_rank`` in M ranks, rank 0's
    result back."""
    _refuse_launch_from_a_child(config)
    return run_ranks(stage_rank, (config, stage, module, loaders, datamodule, ckpt_path, kw),
                     nodes=1, procs_per_node=config.devices)[0]
