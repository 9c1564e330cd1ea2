"""No import cycles among gpulayer's modules, function-level imports included.

A cycle is how a lower layer ends up calling a higher one (DESIGN.md: "calls never go up"):
``tasks/submit.py`` imported ``client.py`` back for ``ensure_connected``, and the Trainer's
launcher imported ``trainer.py`` back for ``fit_rank``. The graph is read from the source
with ``ast`` (nothing is imported), so a lazy import inside a function counts as much as
one at the top. An edge goes to the module an import names (``from .store import keys``:
``gpulayer.store.keys``), not to the packages above it, whose ``__init__`` runs first but
is not what the importer uses.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import gpulayer

PACKAGE = Path(gpulayer.__file__).parent

ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"

# Imports that go up the layers on purpose: (importer prefix, imported prefix) -> the reason. None today:
# docs/ARCHITECTURE.md names none either (pass what a lower module needs in, or move it down).
UPWARD: dict[tuple[str, str], str] = {}

# Cycles allowed on purpose, each as the set of modules it joins, with the reason. None today.
ALLOWED: dict[frozenset[str], str] = {}


def module_files(package: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Every module of the package: dotted name -> (file, is a package ``__init__``)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _absolute(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports_of(source: str, module: str, is_pkg: bool, known: set[str]) -> set[str]:
    """The package's modules that ``source`` (the text of ``module``) imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_pkg, node.level, node.module)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != module}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    files = module_files(package)
    known = set(files)
    return {name: imports_of(path.read_text(), name, is_pkg, known) for name, (path, is_pkg) in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_table(text: str) -> list[tuple[int, str, list[str]]]:
    """(rank, layer name, module prefixes) for each row of ARCHITECTURE.md's layer table."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|", line)
        if not m:
            continue
        prefixes = []
        for path in re.findall(r"`([^`]+)`", m.group(3)):
            path = path.rstrip("/")
            if path.endswith("/__init__.py"):
                path = path[: -len("/__init__.py")]
            prefixes.append(path.removesuffix(".py").replace("/", "."))
        rows.append((int(m.group(1)), m.group(2), prefixes))
    return rows


def layer_of(module: str, rows: list[tuple[int, str, list[str]]]) -> tuple[int, str] | None:
    """The row that claims ``module``: the longest prefix (a folder claims all below it)."""
    best = None
    for rank, name, prefixes in rows:
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), rank, name)
    return None if best is None else best[1:]


def upward_imports(graph: dict[str, set[str]], rows, allowed: dict[tuple[str, str], str]):
    """(importer, imported, why) for every edge that goes up, minus ``allowed``; and the allowances unused."""
    bad, used = [], set()
    for src in sorted(graph):
        for dst in sorted(graph[src]):
            (a, a_name), (b, b_name) = layer_of(src, rows), layer_of(dst, rows)
            if b <= a:
                continue
            key = next((k for k in allowed if (src == k[0] or src.startswith(k[0] + "."))
                        and (dst == k[1] or dst.startswith(k[1] + "."))), None)
            if key:
                used.add(key)
            else:
                bad.append(f"{src} ({a_name}) imports {dst} ({b_name})")
    return bad, sorted(set(allowed) - used)


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    return "; ".join(f"{m} imports {', '.join(sorted(graph[m] & members))}" for m in component)


def test_gpulayer_has_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50 and "gpulayer.client" in graph["gpulayer"]  # the graph was really read
    found = [c for c in cycles(graph) if frozenset(c) not in ALLOWED]
    assert not found, "import cycles (move the shared part into a module below both, or pass the function in): " + \
        " | ".join(describe(c, graph) for c in found)


def test_the_named_pairs_stay_apart():
    """The two cycles this test was written for, edge by edge: the lower module never imports the higher."""
    graph = import_graph()
    assert "gpulayer.client" not in graph["gpulayer.tasks.submit"]
    assert "gpulayer.session" in graph["gpulayer.tasks.submit"] and "gpulayer.session" in graph["gpulayer.client"]
    for lower in ("gpulayer.trainer.launcher", "gpulayer.trainer.cluster"):
        assert "gpulayer.trainer.trainer" not in graph[lower], lower


def test_the_checker_finds_a_function_level_cycle(tmp_path):
    """The failure path: a lazy import inside a function closes a cycle, and the checker reports it."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import g\n    return g\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    graph = import_graph(pkg)
    assert graph["pkg.sub.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]
    assert describe(cycles(graph)[0], graph) == "pkg.a imports pkg.sub.b; pkg.sub.b imports pkg.a"


def test_every_import_goes_down_the_layers():
    """A module imports only from its own layer or one below, as docs/ARCHITECTURE.md's table says."""
    rows = layer_table(ARCHITECTURE.read_text())
    assert len(rows) >= 10 and rows[0][0] == 0  # the table was really read
    graph = import_graph()
    unclaimed = sorted(m for m in graph if layer_of(m, rows) is None)
    assert not unclaimed, f"modules no row of docs/ARCHITECTURE.md claims (add them to a layer): {unclaimed}"
    bad, stale = upward_imports(graph, rows, UPWARD)
    assert not bad, "imports that go up a layer (move the shared part down, or pass it in): " + "; ".join(bad)
    assert not stale, f"exceptions that no import needs any more (remove them): {stale}"
    assert not UPWARD


def test_the_product_never_imports_the_labs():
    graph = import_graph()
    users = sorted(src for src, dsts in graph.items() if not src.startswith("gpulayer.lab")
                   and any(d == "gpulayer.lab" or d.startswith("gpulayer.lab.") for d in dsts))
    assert not users, f"product modules importing the labs: {users}"


def test_the_layer_check_finds_an_upward_import(tmp_path):
    """The failure path: a store module importing the client is reported, an allowance is honoured."""
    rows = layer_table("| 0 | low | `pkg/store/` |\n| 1 | high | `pkg/client.py` |\n")
    graph = {"pkg.store.keys": {"pkg.client"}, "pkg.client": {"pkg.store.keys"}}
    bad, stale = upward_imports(graph, rows, {})
    assert bad == ["pkg.store.keys (low) imports pkg.client (high)"] and stale == []
    assert upward_imports(graph, rows, {("pkg.store", "pkg.client"): "why"}) == ([], [])
    assert upward_imports({"pkg.client": set()}, rows, {("pkg.store", "pkg.client"): "why"})[1] == \
        [("pkg.store", "pkg.client")]


def test_no_module_shadows_a_public_name():
    """``gpulayer.distributed`` is a function: a submodule of that name, once imported, would replace it
    on the package (the import system sets the attribute), and ``gpulayer.distributed(...)`` would call a module."""
    files = module_files()
    shadowed = sorted(name for name in gpulayer.__all__ if f"gpulayer.{name}" in files)
    assert not shadowed, f"submodules named like public names of gpulayer (rename the module): {shadowed}"
