"""``gpulayer train``: run a training script as a distributed job, from the command line.

The working directory travels with the job as every job's code does (``gpulayer/workspace/``: one
content-addressed archive, ``.git``, caches, virtual environments, ``.gitignore``'s names and large
files left out). Every rank of one node runs the script
as ``__main__`` with torchrun's environment, in one shared copy of that
directory; a restart (``--max-restarts``) starts every node from node 0's files
at the end of the failed attempt (``--restart-from``, ``gpulayer/gang/workdir.py``)
and is announced in one line. Every rank's output streams back live, prefixed
with its rank; at the end the files node 0's ranks created or changed come back
into the client's directory (``--no-pull`` turns it off), and the command exits
with the job's status. Ctrl-C cancels the job (exit status 130) unless ``--detach`` was given; so does the
reader of its output going away (`gpulayer train ... | head`; exit status 141, as a Unix tool's).
"""

from __future__ import annotations

import _thread
import os
import runpy
import signal
import sys
import threading
from pathlib import Path

from ..errors import ConfigError, JobFailed
from ..gang.workdir import ShippedDir, unpack_pulled
from ..terminal_progress import GangProgress
from ..workspace import archive

MAX_ARCHIVE_BYTES = 48 * 2**20  # the packaged directory, uncompressed; under the 64 MiB message limit
MAX_FILE_BYTES = 8 * 2**20  # single files above this stay behind (datasets, checkpoints)
MAX_FILES = 50_000


def package_workdir(workdir: Path, max_bytes: int = MAX_ARCHIVE_BYTES,
                    max_file: int = MAX_FILE_BYTES) -> tuple[bytes, list[str]]:
    """A gzipped tar of ``workdir`` (``workspace/archive.py``, the code every job ships) and the files left out
    for their size; version control, caches, hidden directories and what ``.gitignore`` names stay behind."""
    try:
        found = archive.build(workdir, max_file=max_file, max_bytes=max_bytes, max_files=MAX_FILES)
    except ConfigError as err:
        raise ConfigError(f"--workdir {workdir} is too large to ship: {err}; keep data and checkpoints out of it "
                          "(read them from shared storage) or point --workdir at the code only") from None
    return found.blob, list(found.left_out)


def run_script(script: str, argv: list[str]) -> int:
    """Runs in every rank, in its node's working directory (the agent unpacked it): ``script`` as ``__main__``."""
    where = Path(os.environ.get("GPULAYER_WORKDIR") or os.getcwd())
    os.chdir(where)
    sys.path.insert(0, str(where))
    sys.argv = [script, *argv]
    try:
        runpy.run_path(str(where / script), run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            raise
    return 0


_FLAGS = {"nodes": "--nodes", "procs_per_node": "--procs-per-node", "max_restarts": "--max-restarts",
          "timeout": "--timeout", "priority": "--priority"}


def check_flags(**values) -> None:
    """Refuse a value no distributed job can have, naming its flag (the limits are ``GangSpec``'s)."""
    from pydantic import ValidationError

    from ..models import GangSpec

    try:
        GangSpec(gang_id="-", **values)
    except ValidationError as e:
        first = e.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        flag = _FLAGS.get(field, field)
        rule = first["msg"].replace("Input should be", "must be")
        raise ConfigError(f"{flag} {values.get(field)}: {rule} (see `gpulayer train --help`)") from None


def check_fits(nodes: int, procs_per_node: int, resources) -> None:
    """Refuse, in the flags' words (``--nodes``, ``--cuda``), a job the live fleet can never hold
    (``distributed()`` would say the same in Python's: ``nodes=``, ``cuda=True``)."""
    from .. import app as app_mod
    from ..models import GangSpec
    from ..placement import FLAGS, check_gang_fits_fleet

    spec = GangSpec(gang_id="-", nodes=nodes, procs_per_node=procs_per_node, resources=resources,
                    backend="nccl" if resources.cuda else "gloo")
    check_gang_fits_fleet(spec, app_mod.registry().current(), FLAGS)


def train(script: str, args: list[str], *, nodes: int = 1, procs_per_node: int = 1, launcher: str = "direct",
          cuda: bool = False, zone: str | None = None, workdir: str | None = None, max_restarts: int = 0,
          priority: int = 0, timeout: float | None = None, keep_workdir: bool = False, pull: bool = True, detach: bool = False,
          restart_from: str = "node0", out=None, err=None) -> int:
    """The ``gpulayer train`` command; returns its exit status.

    Ctrl-C cancels the job (every rank everywhere) and returns 130; with ``detach``, the job keeps running
    and the line says how to cancel it later (`gpulayer cancel <id>`).
    """
    import gpulayer
    from gpulayer import Resources, distributed

    check_flags(nodes=nodes, procs_per_node=procs_per_node, max_restarts=max_restarts, timeout=timeout,
                priority=priority)
    out, err = out or sys.stdout, err or sys.stderr
    wd = Path(workdir or ".").resolve()
    if not wd.is_dir():
        raise ConfigError(f"--workdir {wd} is not a directory")
    path = (wd / script).resolve() if not Path(script).is_absolute() else Path(script)
    if not path.is_file():
        raise ConfigError(f"script {script} not found (looked for {path}); give a path inside --workdir {wd}")
    try:
        rel = path.relative_to(wd)
    except ValueError as e:
        raise ConfigError(f"script {path} is outside --workdir {wd}; run from its directory or set --workdir") from e
    archive, left_out = package_workdir(wd)
    for item in left_out:
        print(f"gpulayer train: left out (too large): {item}", file=err)
    gpulayer.init(workers=max(nodes, 2), slots=max(procs_per_node, 2))
    resources = Resources(cuda=cuda, zone=zone)
    check_fits(nodes, procs_per_node, resources)
    sink = {"stdout": out, "stderr": err}  # the bar's wrapped streams once it is up

    reader_gone = threading.Event()

    def show(rank: int, stream: str, line: str) -> None:
        if reader_gone.is_set():
            return
        try:
            print(f"[rank {rank}] {line}", file=sink[stream], flush=True)
        except BrokenPipeError:  # `gpulayer train ... | head`: the command ends, as a Unix tool does, like a Ctrl-C
            reader_gone.set()
            _thread.interrupt_main()

    # on_output subscribes before the gang can start: warm ranks print their first lines within milliseconds.
    job = distributed(run_script, str(rel), list(args), nodes=nodes, procs_per_node=procs_per_node,
                      launcher=launcher, resources=resources, timeout=timeout,
                      max_restarts=max_restarts, priority=priority, backend="nccl" if cuda else "gloo",
                      workdir=ShippedDir(archive, keep=keep_workdir, pull=pull, restart_from=restart_from),
                      on_output=show)
    # Each restart in one line, as it happens: which attempt failed and why, where the next one starts.
    job.on_restart(lambda entry, line: print(f"gpulayer train: {line}", file=sink["stderr"], flush=True))
    # At a terminal, a bar shows the gang's state and ranks; rank output is printed above it.
    bar = GangProgress(job, file=out, enabled=None if out is sys.stdout else False)
    out, err = bar.wrap(out), bar.wrap(err)
    sink.update(stdout=out, stderr=err)
    with bar:
        try:
            # Why it waits for slots, each time that changes: in the bar at a terminal, else a line.
            waiting = None if bar.enabled else (lambda why: print(f"gpulayer train: {job.id} {nodes} x "
                                                                  f"{procs_per_node} waits: {why}", file=err, flush=True))
            placement = job.wait_placement(on_waiting=waiting)
            print(f"gpulayer train: {job.id} {nodes} x {procs_per_node} ({launcher}): {placement}", file=err)
            job.get()
            return 0
        except KeyboardInterrupt:
            if reader_gone.is_set():
                print("gpulayer train: the reader of its output went away; stopping as Ctrl-C would", file=err)
            code = _interrupted(job, detach, err)
            return 128 + signal.SIGPIPE if reader_gone.is_set() else code
        except JobFailed as failure:
            print(f"gpulayer train: {failure.message}", file=err)
            code = getattr(failure, "exit_code", None)
            return code if isinstance(code, int) and 0 < code < 256 else 1
        finally:
            try:
                _after_job(job, wd, err)
            except Exception as e:  # the job's status stands
                print(f"gpulayer train: could not bring node 0's files back ({type(e).__name__}: {e}); "
                      "rerun with --keep-workdir to copy them from the worker", file=err)


def _interrupted(job, detach: bool, err) -> int:
    """Ctrl-C: cancel the job, or (``detach``) leave it running; exit status 130 (128 + SIGINT) either way."""
    if detach:
        print(f"gpulayer train: stopped watching; job {job.id} keeps running on the cluster: cancel it with "
              f"`gpulayer cancel {job.id}`", file=err)
        return 130
    _ignore_interrupts()  # a second Ctrl-C must not cut the cancel short and leave ranks running
    from ..distributed_job import cancel_gang
    from .cancel import gang_line

    rec = cancel_gang(job.id)
    line = gang_line(rec)[0] if rec is not None else f"job {job.id} has no record left in Redis"
    print(f"gpulayer train: {line}", file=err, flush=True)
    return 130


def _ignore_interrupts() -> None:
    """SIGINT ignored from now on (the command ends after the cancel); retried if one lands during the call."""
    while True:
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            return
        except KeyboardInterrupt:
            continue


def _after_job(job, wd: Path, err) -> None:
    """What came back from node 0's working directory goes into ``wd``; kept directories are named."""
    from ..signing import verify

    pulled = job.store.take_pulled(job.id)
    if pulled and "error" in pulled:
        print(f"gpulayer train: nothing came back: {pulled['error'].decode()}", file=err)
    elif pulled:
        names = unpack_pulled(verify(pulled["archive"]), wd)
        if names:
            shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            print(f"gpulayer train: {len(names)} file{'s' if len(names) != 1 else ''} came back from node 0 "
                  f"({pulled['worker'].decode()}) into {wd}: {shown}", file=err)
    for node, report in sorted(job.store.nodes(job.id, job.attempt).items()):
        if report.get("workdir"):
            print(f"gpulayer train: kept node {node}'s working directory on {report['worker']}: "
                  f"{report['workdir']}", file=err)


