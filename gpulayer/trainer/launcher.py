"""Start the ranks of a multi-process fit on this machine and collect what they return.

Each rank is a fresh ``python`` process with the environment torchrun would give
it (``gpulayer.gang.launch.rank_env``: the direct launcher, no elastic agent). The
function and its arguments travel by cloudpickle through a private temporary
directory, so closures and classes defined in ``__main__`` work. The first rank
to fail stops the others, and the caller gets ``RankFailed`` with that rank's
traceback; no process outlives ``run_ranks``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from typing import Any, Callable

import cloudpickle

from gpulayer.gang.launch import RankLayout, free_port, rank_env
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
        procs: dict[int, subprocess.Popen] = {}
        try:
            for node in range(nodes):
                for local in range(procs_per_node):
                    layout = RankLayout(node, local, nodes, procs_per_node)
                    rank_environ = rank_env(layout, master_addr="127.0.0.1", master_port=port, run_id=run_id,
                                            base_env=base)
                    procs[layout.rank] = subprocess.Popen([sys.executable, "-c", _BOOT, tmp], env=rank_environ)
            _wait(procs, tmp, timeout_s)
            results = []
            for rank in range(world):
                with open(os.path.join(tmp, f"result_{rank}.pkl"), "rb") as f:
                    results.append(cloudpickle.load(f))
            return results
        finally:
            _stop(procs)


def _wait(procs: dict[int, subprocess.Popen], tmp: str, timeout_s: float | None) -> None:
    deadline = time.monotonic() + timeout_s if timeout_s else None
    while True:
        codes = {rank: p.poll() for rank, p in procs.items()}
        failed = {rank: rc for rank, rc in codes.items() if rc not in (None, 0)}
        if failed:
            time.sleep(0.3)  # let the other ranks write their errors, then blame the first one
            raise _root_cause(procs, tmp)
        if all(rc == 0 for rc in codes.values()):
            return
        if deadline is not None and time.monotonic() > deadline:
            raise TrainerError(f"the ranks did not finish within {timeout_s:.0f} s; they were stopped")
        time.sleep(0.02)


def _root_cause(procs: dict[int, subprocess.Popen], tmp: str) -> RankFailed:
    """The rank whose error was written first: the others usually fail because it left the collective."""
    errors = []
    for rank in procs:
        path = os.path.join(tmp, f"error_{rank}.txt")
        if os.path.exists(path):
            errors.append((os.stat(path).st_mtime_ns, rank, path))
    if errors:
        _, rank, path = min(errors)
        with open(path) as f:
            return RankFailed(rank, f.read())
    rank, rc = next((r, p.poll()) for r, p in procs.items() if p.poll() not in (None, 0))
    how = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
    return RankFailed(rank, f"the process ended with {how} before reporting an error (out of memory? killed?)")


def _stop(procs: dict[int, subprocess.Popen]) -> None:
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + _GRACE_S
    for p in procs.values():
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# -- inside a rank --------------------------------------------------------------------------------
def _exit_with_parent() -> None:
    """A rank whose launcher died exits too (the launcher cannot clean up after a SIGKILL)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="gpulayer-parent-watch").start()


def rank_main(tmp: str) -> None:
    _exit_with_parent()
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
    except BaseException:
        with open(os.path.join(tmp, f"error_{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: process-group destructors can hang after the parent has the result


def fit_in_processes(fit_rank: Callable[..., Any], config, module, train, val, datamodule,
                     ckpt_path) -> dict[str, Any]:
    """``Trainer(devices=M).fit`` on this machine: ``fit_rank`` in M ranks, rank 0's result back.

    The caller hands ``fit_rank`` in (``trainer.fit_rank``), so this module never imports the Trainer back.
    """
    return run_ranks(fit_rank, (config, module, train, val, datamodule, ckpt_path),
                     nodes=1, procs_per_node=config.devices)[0]


def stage_in_processes(stage_rank: Callable[..., Any], config, stage, module, loaders, datamodule, ckpt_path,
                       kw) -> dict[str, Any]:
    """``Trainer(devices=M).validate / test / predict`` on this machine: ``stage_rank`` in M ranks, rank 0's
    result back."""
    return run_ranks(stage_rank, (config, stage, module, loaders, datamodule, ckpt_path, kw),
                     nodes=1, procs_per_node=config.devices)[0]
