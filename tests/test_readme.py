"""Every ```python and ```bash block of README.md and of the guide in docs/ runs as written, against the embedded cluster.

Each block is its own test case, named after its page (none for the README), its section and its place in it. A block runs unless an
HTML comment on the line just above its opening fence says otherwise:

- ``<!-- not-run: REASON -->``: illustrative (a placeholder, a remote host, a reinstall); only parsed.
- ``<!-- needs-gpu: REASON -->``: needs a CUDA worker, which the embedded cluster's workers never are
  (they run with ``--cuda off``); carries the ``cuda`` marker, so it runs only under ``pytest -m cuda``.
- ``<!-- continues: WHAT -->``: a python block that builds on the previous python block (its classes,
  its imports); the two run as one script.
- ``<!-- file: NAME -->``: a file the blocks after it use (a script for ``gpulayer train``): written as
  NAME into the scratch directory before any block runs; its own case only compiles it.

Python blocks run as scripts in a subprocess; bash blocks under ``bash -euo pipefail``, with this
interpreter's ``bin`` first on ``PATH``. Both run in a scratch directory with ``GPULAYER_HOME`` pointing
at one ``gpulayer up`` cluster of the default shape (the shape a reader gets), started before each block
if it is not running (a block may stop it: ``gpulayer down``), and stopped by pid at the end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .test_local import wait_gone

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The pages whose blocks run: the README and every page of docs/ but LIGHTNING.md, whose blocks are the
# Lightning suite runner's commands (hours of Lightning's own tests, not a reader's first steps).
NOT_RUN_PAGES = {"LIGHTNING.md"}
PAGES = [README] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in NOT_RUN_PAGES)
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"^<!--\s*([\w-]+)\s*:\s*(.*?)\s*-->\s*$")
KNOWN_MARKERS = {"not-run", "needs-gpu", "continues", "file"}
BLOCK_TIMEOUT_S = 900


@dataclass
class Block:
    lang: str
    code: str
    line: int  # of the opening fence, 1-based
    section: str
    page: str = "README.md"  # relative to the repository root
    marker: str | None = None
    reason: str = ""
    previous: Block | None = None  # the python block a "continues" block builds on

    @property
    def name(self) -> str:
        prefix = "" if self.page == "README.md" else f"{Path(self.page).stem}-"
        return f"{prefix}{self.section}-{self.lang}-L{self.line}"

    def script(self) -> str:
        head = self.previous.script() + "\n\n" if self.marker == "continues" and self.previous else ""
        return head + self.code


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "top"


def readme_blocks(text: str | None = None, page: str = "README.md") -> list[Block]:
    """The python and bash blocks of one page (the README by default), with their markers and sections."""
    text = (ROOT / page).read_text() if text is None else text
    blocks, last_python = [], None
    fences = list(FENCE.finditer(text))
    for i, m in enumerate(fences):
        if m.group(1) not in ("python", "bash"):
            continue
        before = text[:m.start()].splitlines()
        # The heading above, read between the fences only (a "# comment" inside a block is no heading).
        prose = "".join(text[(fences[j - 1].end() if j else 0):fences[j].start()] for j in range(i + 1))
        section = next((ln.lstrip("#").strip() for ln in reversed(prose.splitlines()) if ln.startswith("#")),
                       "top")
        above = next((ln for ln in reversed(before) if ln.strip()), "")
        block = Block(m.group(1), m.group(2), len(before) + 1, _slug(section), page)
        marker = MARKER.match(above.strip())
        if marker:
            block.marker, block.reason = marker.group(1), marker.group(2)
        if block.lang == "python" and block.marker != "file":  # a file is no script to continue
            block.previous, last_python = last_python, block
        blocks.append(block)
    return blocks


BLOCKS = [b for p in PAGES for b in readme_blocks(page=str(p.relative_to(ROOT)))]


def test_the_readme_blocks_are_found_and_their_markers_are_known():
    assert len(BLOCKS) >= 6, [b.name for b in BLOCKS]
    assert sum(b.marker not in ("not-run", "needs-gpu") for b in BLOCKS) >= 4, "most blocks must run"
    assert len({b.name for b in BLOCKS}) == len(BLOCKS)
    for b in BLOCKS:
        assert b.marker is None or b.marker in KNOWN_MARKERS, f"{b.name}: unknown marker {b.marker!r}"
        assert b.marker is None or b.reason, f"{b.name}: a {b.marker} marker needs its reason"
        assert b.marker != "continues" or (b.lang == "python" and b.previous), f"{b.name}: continues nothing"
        assert b.marker != "file" or re.fullmatch(r"[\w.-]+", b.reason), f"{b.name}: file needs a plain name"


def test_the_readme_starts_with_its_quick_start_and_a_first_example():
    """The two commands of the quick start come first (`.ci/run` and the Makefile are built around them), then
    a python block that runs."""
    readme = [b for b in BLOCKS if b.page == "README.md"]
    assert readme[0].section == "quick-start" and "make demo" in readme[0].code and "make test" in readme[0].code
    assert readme[1].lang == "python" and readme[1].marker is None
    assert readme[0].line < 25, "the quick start is on the first screen"


def test_the_block_parser_reads_markers_sections_and_continuations():
    text = ("# T\n## Sec one\n<!-- not-run: a remote host -->\n```bash\n# not a heading\necho hi\n```\n"
            "```python\nx = 1\n```\n<!-- continues: x -->\n```python\nprint(x)\n```\n```\nplain\n```\n")
    a, b, c = readme_blocks(text)
    assert (a.lang, a.marker, a.reason, a.section, a.line) == ("bash", "not-run", "a remote host", "sec-one", 4)
    assert b.section == c.section == "sec-one"
    assert b.marker is None and c.marker == "continues" and c.script() == "x = 1\n\n\nprint(x)\n"


class ReadmeCluster:
    """The `gpulayer up` cluster the blocks share, in a scratch GPULAYER_HOME."""

    def __init__(self, root: Path):
        self.home, self.workdir = root / "home", root / "work"
        self.workdir.mkdir(parents=True)
        for block in BLOCKS:
            if block.marker == "file":
                (self.workdir / block.reason).write_text(block.code)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
        self.env.update(GPULAYER_HOME=str(self.home), PYTHONUNBUFFERED="1",
                        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        self.pids: set[int] = set()

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=self.workdir, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def ensure_up(self) -> None:
        out = self.run([sys.executable, "-m", "gpulayer", "up"], timeout=180)
        assert out.returncode == 0, f"gpulayer up failed:\n{out.stdout}{out.stderr}"
        self.note_pids()

    def note_pids(self) -> None:
        try:
            state = json.loads((self.home / "cluster.json").read_text())
        except (OSError, ValueError):
            return
        self.pids |= {state["supervisor_pid"], state["redis_pid"], *state["worker_pids"].values()}

    def stop(self) -> None:
        self.note_pids()
        self.run([sys.executable, "-m", "gpulayer", "down"], timeout=120)
        wait_gone(sorted(self.pids), timeout=60)


@pytest.fixture(scope="module")
def readme_cluster(tmp_path_factory):
    cluster = ReadmeCluster(tmp_path_factory.mktemp("readme"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.marker == "not-run"],
                         ids=[b.name for b in BLOCKS if b.marker == "not-run"])
def test_readme_blocks_that_do_not_run_still_parse(block: Block):
    """A block marked not-run (a reinstall, a remote host) is not run, but a typo in it still fails."""
    if block.lang == "python":
        compile(block.code, f"{block.page}:{block.line}", "exec")
    else:
        check = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
        assert check.returncode == 0, f"{block.page} line {block.line}: {check.stderr}"


# A block that needs a GPU carries the cuda marker (deselected by default; `pytest -m cuda` on a GPU machine).
_RUN = [pytest.param(b, id=b.name, marks=[pytest.mark.cuda] if b.marker == "needs-gpu" else [])
        for b in BLOCKS if b.marker != "not-run"]


@pytest.mark.timeout(BLOCK_TIMEOUT_S + 240)
@pytest.mark.parametrize("block", _RUN)
def test_readme_block_runs(block: Block, readme_cluster: ReadmeCluster):
    if block.marker == "file":
        compile(block.code, block.reason, "exec")  # written by the fixture; used by the blocks after it
        assert (readme_cluster.workdir / block.reason).read_text() == block.code
        return
    readme_cluster.ensure_up()
    path = readme_cluster.workdir / f"{block.name}.{'py' if block.lang == 'python' else 'sh'}"
    path.write_text(block.script())
    cmd = [sys.executable, str(path)] if block.lang == "python" else ["bash", "-euo", "pipefail", str(path)]
    try:
        out = readme_cluster.run(cmd, timeout=BLOCK_TIMEOUT_S)
    finally:
        readme_cluster.note_pids()  # a bash block may have started a cluster of its own
    assert out.returncode == 0, (f"{block.page} block at line {block.line} ({block.lang}) exited with "
                                 f"{out.returncode}:\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n"
                                 f"{out.stderr[-5000:]}")
