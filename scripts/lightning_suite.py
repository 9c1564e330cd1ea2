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
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lightning_compat.private_rule import classify_file  # noqa: E402
from lightning_compat.runner import FileRun, build_tree, run_file  # noqa: E402
from lightning_compat.tally import (  # noqa: E402
    function_key, per_file_summary, render_markdown, render_text, tally_file, totals)

REPO = Path(__file__).resolve().parent.parent

# The files issue 26 names, under tests/tests_pytorch of the checkout.
DEFAULT_FILES = [
    "models/test_hooks.py",
    "trainer/logging_/test_train_loop_logging.py",
    "trainer/logging_/test_eval_loop_logging.py",
    "trainer/flags/*.py",
    "trainer/test_dataloaders.py",
    "trainer/test_trainer.py",
    "trainer/optimization/*.py",
    "callbacks/test_early_stopping.py",
    "callbacks/test_lr_monitor.py",
    "callbacks/test_model_checkpoint*.py",
    "checkpointing/*.py",
    "core/test_datamodules.py",
    "core/test_lightning_module.py",
    "loops/*.py",
]


def expand_files(tests_pytorch: Path, patterns: list[str]) -> list[str]:
    """Globs under tests_pytorch -> sorted test files (test_*.py), each once, in the order given."""
    files: list[str] = []
    for pattern in patterns:
        pattern = pattern.removeprefix("tests/tests_pytorch/").removeprefix("tests_pytorch/")
        matches = sorted(glob.glob(str(tests_pytorch / pattern)))
        if not matches:
            raise SystemExit(f"--files {pattern!r} matches nothing under {tests_pytorch}")
        for match in matches:
            rel = str(Path(match).relative_to(tests_pytorch))
            if Path(rel).name.startswith("test_") and rel.endswith(".py") and rel not in files:
                files.append(rel)
    return files


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
        fresh = json.loads(self.path.read_text()) if self.path.exists() else {"entries": {}}
        fresh["entries"][key] = run.to_dict()  # re-read first: several runners may share the file
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(fresh, indent=1, sort_keys=True))
        tmp.replace(self.path)
        self.data = fresh


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lightning-src", required=True, type=Path, help="a Lightning checkout (holds tests/tests_pytorch)")
    p.add_argument("--files", nargs="+", default=DEFAULT_FILES,
                   help="paths under tests/tests_pytorch, globs allowed (default: issue 26's list)")
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
    p.add_argument("-k", dest="k", help="pytest -k expression, passed to both sides")
    p.add_argument("--json", type=Path, help="write every function's outcome on both sides here")
    p.add_argument("--markdown", type=Path, help="write the per-file table and the failures grouped by kind here; in a file holding\n"
                        "the generated-table markers (docs/LIGHTNING.md), only the part between them")
    p.add_argument("--before", type=Path,
                   help="a JSON an earlier run wrote with --json: --markdown adds its per-file passes as a column")
    p.add_argument("--show-private", action="store_true", help="list each private function with the rule it matched")
    p.add_argument("--keep-temp", action="store_true", help="leave the temporary trees (their path is printed)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tests_pytorch = args.lightning_src / "tests" / "tests_pytorch"
    if not tests_pytorch.is_dir():
        raise SystemExit(f"{tests_pytorch} is not a directory: --lightning-src must be a Lightning checkout")
    files = expand_files(tests_pytorch, args.files)
    commit = lightning_commit(args.lightning_src, args.lightning_commit)
    version = installed_lightning(args.python)
    cache = BaselineCache(args.baseline_cache)
    gpulayer_root = str(args.gpulayer_root.resolve())

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    log(f"Lightning tests: {tests_pytorch} (commit {commit}); reference: lightning {version}; "
        f"gpulayer: {gpulayer_root}; {len(files)} files")
    temp = Path(tempfile.mkdtemp(prefix="lightning-suite-"))
    results = []
    try:
        trees = {}
        for side in ("lightning", "gpulayer"):
            if args.against in (side, "both"):
                trees[side] = build_tree(side, tests_pytorch, files, temp / side)
        for rel in files:
            source = (tests_pytorch / rel).read_bytes()
            private = classify_file(source.decode("utf-8"))
            light = gpu = whole = None
            if args.baseline_cache:
                light = cache.get(cache.key(tests_pytorch, rel, args.k, version))
                if light is None and args.k:  # the whole file's baseline serves any -k
                    whole = cache.get(cache.key(tests_pytorch, rel, None, version))
            if light is None and whole is None and "lightning" in trees:
                log(f"[lightning] {rel}")
                light = run_file(trees["lightning"], rel, python=args.python, pythonpath=[],
                                 timeout=args.timeout, file_timeout=args.file_timeout, k=args.k, log=log)
                cache.put(cache.key(tests_pytorch, rel, args.k, version), light)
            if "gpulayer" in trees:
                log(f"[gpulayer] {rel}")
                gpu = run_file(trees["gpulayer"], rel, python=args.python, pythonpath=[gpulayer_root],
                               timeout=args.timeout, file_timeout=args.file_timeout, k=args.k, log=log)
            if whole is not None:
                light = whole.restricted_to(gpu.collected) if gpu and gpu.collected else whole
            if args.k:  # only the functions -k selected
                selected = {function_key(c) for run in (light, gpu) if run for c in run.collected}
                private = {key: reason for key, reason in private.items() if key in selected}
            results.append(tally_file(rel, private, light, gpu))
    finally:
        if args.keep_temp:
            log(f"temporary trees kept in {temp}")
        else:
            import shutil
            shutil.rmtree(temp, ignore_errors=True)

    print(render_text(results, verbose_private=args.show_private))
    header = {"lightning_commit": commit, "lightning_version": version, "gpulayer_root": gpulayer_root,
              "against": args.against, "files": files}
    if args.json:
        payload = header | {"totals": totals(results), "per_file": per_file_summary(results), "files": [
            {"file": fr.file, "note": fr.note, "functions": [f.__dict__ for f in fr.functions]} for fr in results]}
        args.json.write_text(json.dumps(payload, indent=1))
    if args.markdown:
        intro = (f"Lightning tests at commit `{commit}`, reference lightning {version}, gpulayer at "
                 f"`{gpulayer_commit(args.gpulayer_root)}`, `--against {args.against}`, run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n\n")
        before = read_before(args.before) if args.before else None
        if args.before:
            intro += f"\"passed before\": {args.before.name}.\n\n"
        write_markdown(args.markdown, intro + render_markdown(results, before))
    return 0


def read_before(path: Path) -> dict:
    """{file: {"counted", "passed"}} from a --json output (its per_file, or recounted from its functions)."""
    data = json.loads(path.read_text())
    if "per_file" in data:
        return data["per_file"]
    summary = {}
    for entry in data["files"]:
        counted = [f for f in entry["functions"] if not f["private"] and f["lightning"] == "passed"]
        summary[entry["file"]] = {"counted": len(counted), "passed": sum(f["gpulayer"] == "passed" for f in counted)}
    return summary


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
