#!/usr/bin/env python
"""Run Lightning's own test files against gpulayer.trainer and measure how many pass.

    python scripts/lightning_suite.py --lightning-src /path/to/lightning-checkout [--files trainer/flags/*.py]

Lightning's tests are read from the checkout the user points at, never stored here. Each file runs twice,
each time in its own pytest process in a temporary tree: as Lightning wrote it, under the installed
``lightning`` (the reference: which functions pass on this machine), and rewritten to import
``gpulayer.trainer`` (see scripts/lightning_compat/rewrite.py). A test function that reaches Lightning's private
internals is counted apart by the rule in scripts/lightning_compat/private_rule.py. The figure printed last:
gpulayer passed / (public functions that pass under Lightning). It measures, it does not gate: exit status 0.
docs/LIGHTNING.md describes it and holds the latest figures.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lightning_compat.private_rule import classify_file  # noqa: E402
from lightning_compat.runner import FileRun, build_tree, kill_running, run_files  # noqa: E402
from lightning_compat.suite_files import NAMED_SETS, expand_files, render_exclusions, whole_suite  # noqa: E402
from lightning_compat.tally import (  # noqa: E402
    FileResult, FunctionResult, function_key, per_file_summary, render_markdown, render_text, tally_file, totals)

REPO = Path(__file__).resolve().parent.parent

def lightning_commit(src: Path, given: str | None) -> str:
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown (not a git checkout: give --lightning-commit)"


def installed_lightning(python: str) -> str:
    probe = "import importlib.metadata as m; print(m.version('lightning'))"
    result = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    return result.stdout.strip() or "not installed"


class BaselineCache:
    """The Lightning side's per-case outcomes, keyed by test file (path and content), lightning version and -k."""

    def __init__(self, path: Path | None):
        self.path = path
        self.lock = threading.Lock()  # --jobs: read-modify-write of the file, one thread at a time
        self.data = {"entries": {}}
        if path and path.exists():
            self.data = json.loads(path.read_text())

    @staticmethod
    def key(tests_pytorch: Path, rel: str, k: str | None, lightning_version: str) -> str:
        """The file's content and that of what it runs with (conftest, helpers) name the entry: a checkout
        that is not a git repository, or a renamed one, still finds it; an edited file does not."""
        support = sorted([tests_pytorch / "conftest.py", tests_pytorch / "__init__.py",
                          *(tests_pytorch / "helpers").glob("*.py")])
        digest = hashlib.sha256((tests_pytorch / rel).read_bytes())
        for path in support:
            digest.update(path.read_bytes())
        return f"{rel}|{digest.hexdigest()[:16]}|lightning {lightning_version}|-k {k or ''}"

    def get(self, key: str) -> FileRun | None:
        entry = self.data["entries"].get(key)
        return FileRun.from_dict(entry) if entry else None

    def put(self, key: str, run: FileRun) -> None:
        if not self.path or run.note:  # a killed or crashed run is no baseline
            return
        with self.lock:
            self._write(key, run)

    def _write(self, key: str, run: FileRun) -> None:
        fresh = json.loads(self.path.read_text()) if self.path.exists() else {"entries": {}}
        fresh["entries"][key] = run.to_dict()  # re-read first: several runners may share the file
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(fresh, indent=1, sort_keys=True))
        tmp.replace(self.path)
        self.data = fresh


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lightning-src", type=Path, help="a Lightning checkout (holds tests/tests_pytorch); required")
    chosen = p.add_mutually_exclusive_group()
    chosen.add_argument("--files", nargs="+",
                        help="paths under tests/tests_pytorch, globs allowed (default: every file a CPU machine can\n"
                             "run, by the rule in scripts/lightning_compat/suite_files.py)")
    chosen.add_argument("--set", dest="named_set", choices=sorted(NAMED_SETS),
                        help="a named list of files earlier figures were quoted over (issue26: its 45 files)")
    p.add_argument("--gpulayer-root", type=Path, default=REPO,
                   help="the gpulayer checkout to test (first on the tests' PYTHONPATH; default: this one)")
    p.add_argument("--against", choices=["gpulayer", "lightning", "both"], default="both",
                   help="which side to run; the Lightning side decides the denominator (default: both)")
    p.add_argument("--baseline-cache", type=Path,
                   help="JSON file of the Lightning side's outcomes: reused when present, filled when not")
    p.add_argument("--lightning-commit", help="the checkout's commit, when it is not a git repository")
    p.add_argument("--python", default=sys.executable, help="interpreter with pytest, pytest-timeout and lightning")
    p.add_argument("--timeout", type=float, default=180, help="seconds per test (pytest-timeout; default 180)")
    p.add_argument("--file-timeout", type=float, default=2400, help="seconds per file's pytest process")
    p.add_argument("--first", nargs="+", default=[], metavar="GLOB",
                   help="run the chosen files matching these globs first, in this order (the report keeps the\n"
                        "files' own order): what an interrupted run must have covered")
    p.add_argument("--jobs", type=int, default=1,
                   help="files run at once, each file's sides one after the other (default 1: one pytest at a time)")
    p.add_argument("--files-per-process", type=int, default=1, metavar="N",
                   help="files run in one pytest process (default 1); more saves start-up time on a loaded\n"
                        "machine; a crash then loses the unfinished files of that process")
    p.add_argument("-k", dest="k", help="pytest -k expression, passed to both sides")
    p.add_argument("--json", type=Path, help="write every function's outcome on both sides here")
    p.add_argument("--markdown", type=Path, help="write the per-file table and the failures grouped by kind here; in a file holding\n"
                        "the generated-table markers (docs/LIGHTNING.md), only the part between them")
    p.add_argument("--before", type=Path, nargs="+",
                   help="JSONs earlier runs wrote with --json: --markdown adds their per-file passes as columns")
    p.add_argument("--from-json", type=Path,
                   help="run nothing: print (and --markdown) the results a --json of an earlier run saved")
    p.add_argument("--show-private", action="store_true", help="list each private function with the rule it matched")
    p.add_argument("--keep-temp", action="store_true", help="leave the temporary trees (their path is printed)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # `timeout` and job control end a run with SIGTERM: as SystemExit, it still kills the current file's pytest
    # process group and removes the temporary trees (the finally blocks), instead of leaving both behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.from_json:
        data = json.loads(args.from_json.read_text())
        results = [FileResult(e["file"], [FunctionResult(**f) for f in e["functions"]], e.get("note", ""))
                   for e in data["files"]]
        header = {k: data.get(k) for k in ("lightning_commit", "lightning_version", "gpulayer_root", "against",
                                           "gpulayer_commit", "run_at", "partial", "wall_s", "jobs", "files_per_process",
                                           "default_set")}
    else:
        if args.lightning_src is None:
            raise SystemExit("--lightning-src is required (or --from-json to render a saved run)")
        results, header = run(args)
    report(args, results, header)
    return 0


def chosen_files(args: argparse.Namespace, tests_pytorch: Path) -> list[str]:
    """--files, --set, or by default the whole CPU-runnable suite."""
    if args.files:
        return expand_files(tests_pytorch, args.files)
    if args.named_set:
        return expand_files(tests_pytorch, NAMED_SETS[args.named_set])
    return whole_suite(tests_pytorch)


def run_order(files: list[str], first: list[str]) -> list[str]:
    """``files`` with those matching a glob of ``first`` moved ahead, by the first glob each matches."""
    def rank(rel: str) -> int:
        return next((i for i, pattern in enumerate(first) if fnmatch.fnmatch(rel, pattern)), len(first))
    return sorted(files, key=rank)  # stable: within a rank, the files' own order


def run(args: argparse.Namespace) -> tuple[list, dict]:
    """Both sides over every file; the per-file results and what identifies the run.

    Interrupted (Ctrl-C, SIGTERM), it returns the files that finished, and the header says how many of how many:
    the report of a partial run is still written, marked as such.
    """
    tests_pytorch = args.lightning_src / "tests" / "tests_pytorch"
    if not tests_pytorch.is_dir():
        raise SystemExit(f"{tests_pytorch} is not a directory: --lightning-src must be a Lightning checkout")
    files = chosen_files(args, tests_pytorch)
    commit = lightning_commit(args.lightning_src, args.lightning_commit)
    version = installed_lightning(args.python)
    cache = BaselineCache(args.baseline_cache)
    gpulayer_root = str(args.gpulayer_root.resolve())
    tested = gpulayer_commit(args.gpulayer_root)  # at the start: what a long run measured, not what came after

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log(f"Lightning tests: {tests_pytorch} (commit {commit}); reference: lightning {version}; "
        f"gpulayer: {gpulayer_root}; {len(files)} files, {args.jobs} at a time")
    temp = Path(tempfile.mkdtemp(prefix="lightning-suite-"))
    done: dict[str, FileResult] = {}
    stopping = threading.Event()
    started = time.monotonic()
    try:
        trees = {}
        for side in ("lightning", "gpulayer"):
            if args.against in (side, "both"):
                trees[side] = build_tree(side, tests_pytorch, files, temp / side)

        def one_batch(rels: list[str]) -> None:
            """Both sides of these files, each side in one pytest process (one file unless --files-per-process)."""
            if stopping.is_set():
                return
            side_args = dict(python=args.python, timeout=args.timeout, file_timeout=args.file_timeout, k=args.k,
                             log=log)
            light: dict[str, FileRun] = {}
            whole: dict[str, FileRun] = {}
            for rel in rels:
                if args.baseline_cache:
                    found = cache.get(cache.key(tests_pytorch, rel, args.k, version))
                    if found is None and args.k:  # the whole file's baseline serves any -k
                        found = cache.get(cache.key(tests_pytorch, rel, None, version))
                        if found is not None:
                            whole[rel] = found
                    elif found is not None:
                        light[rel] = found
            missing = [rel for rel in rels if rel not in light and rel not in whole]
            if missing and "lightning" in trees:
                log(f"[lightning] {' '.join(missing)}")
                fresh = run_files(trees["lightning"], missing, pythonpath=[], **side_args)
                if stopping.is_set():
                    return  # killed under us: neither a baseline nor a result
                for rel, light_run in fresh.items():
                    cache.put(cache.key(tests_pytorch, rel, args.k, version), light_run)
                light.update(fresh)
            gpu: dict[str, FileRun] = {}
            if "gpulayer" in trees:
                log(f"[gpulayer] {' '.join(rels)}")
                gpu = run_files(trees["gpulayer"], rels, pythonpath=[gpulayer_root], **side_args)
                if stopping.is_set():
                    return
            for rel in rels:
                private = classify_file((tests_pytorch / rel).read_text(encoding="utf-8"))
                light_run, gpu_run = light.get(rel), gpu.get(rel)
                if rel in whole:
                    light_run = whole[rel].restricted_to(gpu_run.collected) if gpu_run and gpu_run.collected \
                        else whole[rel]
                if args.k:  # only the functions -k selected
                    selected = {function_key(c) for side_run in (light_run, gpu_run) if side_run
                                for c in side_run.collected}
                    private = {key: reason for key, reason in private.items() if key in selected}
                done[rel] = tally_file(rel, private, light_run, gpu_run)

        pool = ThreadPoolExecutor(max_workers=max(1, args.jobs), thread_name_prefix="lsr")
        try:
            order = run_order(files, args.first)
            per = max(1, args.files_per_process)
            futures = [pool.submit(one_batch, order[i:i + per]) for i in range(0, len(order), per)]
            for future in futures:
                future.result()
        except BaseException:
            # Ctrl-C or SIGTERM reaches the main thread only: stop the workers (run_file kills their pytest
            # process groups as it unwinds) and report what finished.
            stopping.set()
            for future in futures:
                future.cancel()
            log(f"interrupted: stopping {kill_running()} running pytest process(es)")
            pool.shutdown(wait=True)
            if len(done) == len(files):
                raise
            log(f"interrupted: {len(done)} of {len(files)} files finished")
        else:
            pool.shutdown(wait=True)
    finally:
        if args.keep_temp:
            log(f"temporary trees kept in {temp}")
        else:
            shutil.rmtree(temp, ignore_errors=True)

    results = [done[rel] for rel in files if rel in done]
    header = {"lightning_commit": commit, "lightning_version": version, "gpulayer_root": gpulayer_root,
              "gpulayer_commit": tested, "against": args.against,
              "run_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "files": files,
              "files_done": [rel for rel in files if rel in done], "jobs": args.jobs,
              "files_per_process": args.files_per_process,
              "wall_s": round(time.monotonic() - started), "default_set": not (args.files or args.named_set)}
    if len(results) < len(files):
        header["partial"] = f"{len(results)} of {len(files)} files finished (the run was interrupted)"
    return results, header


def report(args: argparse.Namespace, results: list, header: dict) -> None:
    print(render_text(results, verbose_private=args.show_private))
    if args.json:
        payload = header | {"totals": totals(results), "per_file": per_file_summary(results), "files": [
            {"file": fr.file, "note": fr.note, "functions": [f.__dict__ for f in fr.functions]} for fr in results]}
        args.json.write_text(json.dumps(payload, indent=1))
    if args.markdown:
        intro = (f"Lightning tests at commit `{header['lightning_commit']}`, reference lightning "
                 f"{header['lightning_version']}, gpulayer at `{header.get('gpulayer_commit') or header['gpulayer_root']}`, "
                 f"`--against {header['against']}`, run {header.get('run_at') or 'at an unrecorded time'}"
                 + (f" in {header['wall_s'] / 60:.0f} min, {header.get('jobs') or 1} process(es) at a time, "
                    f"{header.get('files_per_process') or 1} file(s) per process" if header.get("wall_s") else "")
                 + ".\n\n")
        if header.get("partial"):
            intro += f"**Partial run: {header['partial']}.** The figures below are over those files only.\n\n"
        if header.get("default_set"):
            intro += render_exclusions(args.lightning_src / "tests" / "tests_pytorch" if args.lightning_src else None)
        before = [read_before(path) for path in args.before or []]
        for label, _, path in before:
            intro += f"\"passed at {label}\": gpulayer at `{path}`.\n\n"
        before = [(label, summary) for label, summary, _ in before]
        write_markdown(args.markdown, intro + render_markdown(results, before))


def read_before(path: Path) -> tuple[str, dict, str]:
    """(short commit, {file: {"counted", "passed"}}, description) from a --json output or a summary of one."""
    data = json.loads(path.read_text())
    description = str(data.get("gpulayer_commit") or data.get("gpulayer_root") or path.name)
    label = description.split()[0][:12]
    if "per_file" in data:
        return label, data["per_file"], description
    summary = {}
    for entry in data["files"]:
        counted = [f for f in entry["functions"] if not f["private"] and f["lightning"] == "passed"]
        summary[entry["file"]] = {"counted": len(counted), "passed": sum(f["gpulayer"] == "passed" for f in counted)}
    return label, summary, description


BEGIN, END = "<!-- lightning_suite: begin generated table -->", "<!-- lightning_suite: end generated table -->"


def write_markdown(path: Path, table: str) -> None:
    """Replace the generated part of ``path`` (between BEGIN and END) or, without those markers, the whole file."""
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        path.write_text(f"{head}{BEGIN}\n{table}{END}{tail}")
    else:
        path.write_text(table)


def gpulayer_commit(root: Path) -> str:
    result = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (result.stdout.strip()[:60] or "unknown") + (" + uncommitted changes" if dirty else "")


if __name__ == "__main__":
    sys.exit(main())
