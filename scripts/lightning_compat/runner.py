"""Build a temporary test tree for one side and run each Lightning test file in its own pytest process.

The Lightning side gets Lightning's files unchanged (its conftest, its helpers, the installed lightning). The
gpulayer side gets the same files rewritten (``rewrite.rewrite_test_source``), with our conftest, RunIf and
``tests_pytorch/__init__`` from ``sandbox/`` in place of Lightning's. Both trees live under one temporary
directory outside any repository, removed at the end; each pytest runs in a new session and its whole process
group is killed when it ends, so nothing it started outlives it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from lightning_compat.rewrite import rewrite_test_source

SANDBOX = Path(__file__).parent / "sandbox"

# Lightning's pyproject.toml also turns FutureWarning into an error: not here, on either side. Its CI pins the
# torch it tests with; on this machine's newer torch, torch's own deprecation notices would fail Lightning's
# tests and gpulayer's alike for reasons neither Trainer controls. Strict xfail is kept (an unexpected pass fails).
PYTEST_INI = """[pytest]
addopts = -p no:cacheprovider -p lsr_plugin --color=no -q --disable-pytest-warnings
xfail_strict = true
"""


@dataclass
class FileRun:
    """What one pytest process reported for one test file."""
    file: str                                   # path under tests_pytorch
    rc: int | None = None
    wall_s: float = 0.0
    collected: list[str] = field(default_factory=list)       # case ids ("test_x[a]", "TestC::test_y")
    collect_errors: list[str] = field(default_factory=list)  # one-line causes
    cases: dict[str, dict] = field(default_factory=dict)     # case id -> {"outcome", "cause"}
    note: str = ""                                            # why the process ended early, if it did

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def restricted_to(self, case_ids: list[str]) -> "FileRun":
        """The same run, keeping only the given cases (a whole-file baseline seen through a -k selection)."""
        keep = set(case_ids)
        return FileRun(self.file, self.rc, self.wall_s, [c for c in self.collected if c in keep],
                       list(self.collect_errors), {c: r for c, r in self.cases.items() if c in keep}, self.note)

    @classmethod
    def from_dict(cls, data: dict) -> "FileRun":
        return cls(**data)


def _copy(src: Path, dst: Path, transform) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.suffix == ".py" and transform is not None:
        dst.write_text(transform(src.read_text(encoding="utf-8")), encoding="utf-8")
    else:
        shutil.copyfile(src, dst)


_TEST_MODULE_IMPORT = re.compile(r"^\s*(?:from|import)\s+tests_pytorch\.([\w.]+)", re.MULTILINE)


def imported_test_modules(tests_pytorch: Path, files: list[str]) -> set[Path]:
    """The other test modules the files import (``from tests_pytorch.utilities.test_model_summary import
    UnorderedModel`` in ``models/test_onnx.py``), transitively, with their packages' ``__init__.py``: a file
    must collect whether or not the module it borrows from is among those run. Their tests are not run."""
    found: set[Path] = set()
    todo = [Path(rel) for rel in files]
    while todo:
        src = tests_pytorch / todo.pop()
        if not src.is_file():
            continue
        for dotted in _TEST_MODULE_IMPORT.findall(src.read_text(encoding="utf-8")):
            rel = Path(*dotted.split(".")).with_suffix(".py")
            if rel.parts[0] == "helpers" or rel in found or not (tests_pytorch / rel).is_file():
                continue
            found.add(rel)
            found |= {parent / "__init__.py" for parent in rel.parents
                      if (tests_pytorch / parent / "__init__.py").is_file()}
            todo.append(rel)
    return found


def build_tree(side: str, tests_pytorch: Path, files: list[str], root: Path) -> Path:
    """Lay out ``root/tests/tests_pytorch`` for ``side`` ("lightning" or "gpulayer"); return ``root/tests``."""
    tests = root / "tests"
    dst = tests / "tests_pytorch"
    transform = rewrite_test_source if side == "gpulayer" else None
    wanted = {Path("__init__.py"), Path("conftest.py")}
    wanted |= {p.relative_to(tests_pytorch) for p in (tests_pytorch / "helpers").glob("*.py")}
    for rel in files:
        wanted.add(Path(rel))
        for parent in Path(rel).parents:
            for name in ("__init__.py", "conftest.py"):
                if (tests_pytorch / parent / name).exists():
                    wanted.add(parent / name)
    wanted |= imported_test_modules(tests_pytorch, files)
    for rel in sorted(wanted):
        if (tests_pytorch / rel).exists():
            _copy(tests_pytorch / rel, dst / rel, transform)
    if side == "gpulayer":
        shutil.copyfile(SANDBOX / "tests_pytorch_init.py", dst / "__init__.py")
        shutil.copyfile(SANDBOX / "conftest.py", dst / "conftest.py")
        shutil.copyfile(SANDBOX / "runif.py", dst / "helpers" / "runif.py")
        for name in ("lsr_runtime.py", "lsr_env.py"):
            shutil.copyfile(SANDBOX / name, tests / name)
    # tests/legacy: the list of released versions checkpointing/test_legacy_checkpoints.py reads at import, and
    # the checkpoints a Lightning checkout may hold (downloaded separately): data, the same on both sides.
    legacy = tests_pytorch.parent / "legacy"
    if legacy.is_dir():
        shutil.copytree(legacy, tests / "legacy", ignore=shutil.ignore_patterns("*.py", "*.sh"), dirs_exist_ok=True)
    shutil.copyfile(SANDBOX / "lsr_plugin.py", tests / "lsr_plugin.py")
    (tests / "pytest.ini").write_text(PYTEST_INI)
    return tests


_RUNNING: set[subprocess.Popen] = set()  # the pytest processes run_file is waiting on (several with --jobs)
_RUNNING_LOCK = threading.Lock()


def kill_running() -> int:
    """Kill the process group of every pytest run_file is waiting on (an interrupted run); how many."""
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for proc in running:
        _kill_group(proc)
    return len(running)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_file(tests: Path, rel: str, *, python: str, pythonpath: list[str], timeout: float, file_timeout: float,
             k: str | None, log=None) -> FileRun:
    """Run one file in its own pytest process; parse the plugin's JSON lines into a FileRun."""
    return run_files(tests, [rel], python=python, pythonpath=pythonpath, timeout=timeout,
                     file_timeout=file_timeout, k=k, log=log)[rel]


def run_files(tests: Path, rels: list[str], *, python: str, pythonpath: list[str], timeout: float,
              file_timeout: float, k: str | None, log=None) -> dict[str, FileRun]:
    """Run the files in one pytest process (killed after ``file_timeout`` per file); a FileRun per file.

    One file per process is the default: a crash or a hang loses only that file's remaining cases. Several
    (``--files-per-process``) save the interpreter's and the Trainer's start-up, which dominates the run of a
    small file on a loaded machine; the files then run one after the other as in Lightning's own CI, a
    collection error fails only its file (``--continue-on-collection-errors``), and when the process dies, the
    files it had finished keep their outcomes and only the unfinished ones get the note.
    """
    name = rels[0].replace("/", "_") + (f"+{len(rels) - 1}" if len(rels) > 1 else "")
    # Outside the tests' root: Lightning's conftest fails a test that leaves a new file under it, and with --jobs
    # another process's outcome file appears there while a test runs.
    logs = tests.parent / "lsr-out"
    logs.mkdir(exist_ok=True)
    out = logs / f"{name}.jsonl"
    out.unlink(missing_ok=True)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PL_", "PYTEST_", "LSR_")) and key != "PYTHONPATH"}
    env.update(PYTHONPATH=os.pathsep.join(pythonpath + [str(tests)]), LSR_OUT=str(out), PYTHONDONTWRITEBYTECODE="1",
               MPLBACKEND="Agg")
    cmd = [python, "-m", "pytest", *(f"tests_pytorch/{rel}" for rel in rels), "-c", str(tests / "pytest.ini"),
           "--rootdir", str(tests), "--timeout", str(int(timeout))]
    if len(rels) > 1:
        cmd.append("--continue-on-collection-errors")
    if k:
        cmd += ["-k", k]
    runs = {rel: FileRun(file=rel) for rel in rels}
    rc, note = None, ""
    limit = file_timeout * len(rels)
    started = time.monotonic()
    with open(logs / f"{name}.log", "w") as stdout:
        proc = subprocess.Popen(cmd, cwd=tests, env=env, stdout=stdout, stderr=subprocess.STDOUT,
                                start_new_session=True)
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            note = f"the file's pytest process was killed after {limit:.0f}s"
        finally:
            _kill_group(proc)  # also whatever it spawned (DDP workers, data loader workers)
            proc.wait()
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
    wall_s = round(time.monotonic() - started, 1)
    read_outcomes(out, runs)
    if rc not in (0, 1, 5, None) and not note:
        tail = (logs / f"{name}.log").read_text(errors="replace").strip().splitlines()[-3:]
        note = f"pytest exited with {rc}: " + " | ".join(tail)[-300:]
    for rel, run in runs.items():
        run.rc, run.wall_s = rc, round(wall_s / len(rels), 1)
        finished = len(rels) > 1 and run.collected and all(case in run.cases for case in run.collected)
        if note and not finished:
            run.note = note
        if log:
            shared = f" (1/{len(rels)} of one process)" if len(rels) > 1 else ""
            log(f"  {rel}: rc={run.rc} {len(run.collected)} cases in {run.wall_s}s{shared} {run.note}")
    return runs


def read_outcomes(out: Path, runs: dict[str, FileRun]) -> None:
    """Fill each file's FileRun (keyed by its path under tests_pytorch) from the plugin's JSON lines in ``out``."""
    rels = list(runs)
    for line in out.read_text(encoding="utf-8").splitlines() if out.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the last line of a killed process
        nodeid = record["nodeid"]
        owners = [rel for rel in rels if nodeid == f"tests_pytorch/{rel}" or nodeid.startswith(f"tests_pytorch/{rel}::")]
        if not owners and record["event"] == "collect_error":
            # a conftest or a directory that failed to collect: every file under it
            owners = [rel for rel in rels if f"tests_pytorch/{rel}".startswith(nodeid.rstrip("/") + "/")] or rels
        for rel in owners:
            run = runs[rel]
            case = nodeid.removeprefix(f"tests_pytorch/{rel}::")
            if record["event"] == "collected":
                run.collected.append(case)
            elif record["event"] == "collect_error":
                run.collect_errors.append(record["cause"])
            else:
                previous = run.cases.get(case)
                if previous is None or previous["outcome"] == "passed" or \
                        (previous["outcome"] == "skipped" and record["outcome"] == "failed"):
                    run.cases[case] = {"outcome": record["outcome"], "cause": record["cause"], "when": record["when"]}
