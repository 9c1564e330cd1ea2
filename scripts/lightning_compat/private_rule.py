"""The rule that sets apart the Lightning tests which reach Lightning's private internals.

A test function is "private" when the text it runs matches one of ``PRIVATE_PATTERNS``. The text is the
function's source with its decorators (and its class's decorators), plus, transitively, the source of every
module-level class, function or fixture of the same file it names (a test that builds a ``class Model(BoringModel)``
whose hook reads ``trainer._results`` reaches the internals as surely as one that reads it inline). The text is
Lightning's original, before any rewrite. On top of the fixed patterns, a file-specific one: any private name
(``_Loop``, ``_load``...) the file imports from ``lightning``/``pytorch_lightning``/``lightning_fabric``, except
dunder names (``__version__``) and the environment facts the runner computes itself (``rewrite.ENV_FACT``).

Private functions are reported apart whatever their outcome: gpulayer is not bent to satisfy them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from lightning_compat.rewrite import ENV_FACT

_LIGHTNING_MODULE = r"(?:lightning|pytorch_lightning|lightning_fabric)(?:\.\w+)*"

# (regex, reason). Applied with re.search to the text described above.
PRIVATE_PATTERNS: list[tuple[str, str]] = [
    (r"(?<![\w.])trainer(?:\.\w+)*\._[A-Za-z]\w*",
     "reads a private attribute reached through the Trainer (trainer._x, trainer.strategy._x, ...)"),
    (r"\.(?:fit_loop|validate_loop|test_loop|predict_loop|_evaluation_loop|epoch_loop|val_loop)\b",
     "reaches the Trainer's loop objects (fit_loop, validate_loop, epoch_loop, ...)"),
    (r"\b(?:_checkpoint_connector|_logger_connector|_data_connector|_accelerator_connector|_callback_connector"
     r"|_signal_connector|_results|_ResultCollection|_ResultMetric)\b",
     "reaches a Trainer connector or the result collection"),
    (r"\b(?:optim_progress|epoch_progress|batch_progress|_batches_that_stepped)\b",
     "reads the loops' progress counters"),
    (r"""(?:patch(?:\.object|\.dict)?|setattr|setitem)\(\s*["']""" + _LIGHTNING_MODULE + r"""\._\w*""",
     "patches a name in a private Lightning module or a private Lightning name"),
    (r"""(?:patch\.object|setattr)\(\s*[\w.]+\s*,\s*["']_[A-Za-z]\w*["']""",
     "patches a private attribute of a Lightning object"),
    (r"\b(?:from|import)\s+" + _LIGHTNING_MODULE + r"\._\w*",
     "imports a private Lightning module"),
    (r"\b(?:cuda_count_\d+|mps_count_\d+|xla_available|tpu_available|mock_cuda_count|mock_mps_count"
     r"|mock_xla_available|mock_tpu_available)\b",
     "simulates accelerators by patching Lightning's private device probes (conftest fixtures)"),
]
_COMPILED = [(re.compile(p), reason) for p, reason in PRIVATE_PATTERNS]


@dataclass(frozen=True)
class TestFunction:
    key: str            # "test_x" or "TestClass::test_x": the nodeid part after the file, without parameters
    lineno: int
    text: str           # the source the rule reads (see the module docstring)


def private_imported_names(tree: ast.Module) -> set[str]:
    """Private names the file imports from a Lightning package (anywhere in the file)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and re.match(_LIGHTNING_MODULE + "$", node.module):
            for alias in node.names:
                dunder = alias.name.startswith("__") and alias.name.endswith("__")  # __version__ is public
                if alias.name.startswith("_") and not dunder and not ENV_FACT.match(alias.name):
                    names.add(alias.asname or alias.name)
    return names


def _segment(lines: list[str], node: ast.AST) -> str:
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "".join(lines[start - 1:node.end_lineno])


def _names_used(node: ast.AST) -> set[str]:
    used = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            used.add(sub.id)
        elif isinstance(sub, ast.arg):
            used.add(sub.arg)  # fixtures are requested by argument name
        elif isinstance(sub, ast.Attribute):
            used.add(sub.attr)  # self.helper(...) inside a test class
    return used


def test_functions(source: str) -> list[TestFunction]:
    """Every test function pytest would collect by its default rules, with the text the rule reads."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    module_defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}

    def closure(roots: list[ast.AST], scope: dict[str, ast.AST]) -> str:
        seen, todo, parts = set(), list(roots), []
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            parts.append(_segment(lines, node))
            for name in _names_used(node):
                for table in (scope, module_defs):
                    if name in table and id(table[name]) not in seen:
                        todo.append(table[name])
        return "".join(parts)

    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            found.append(TestFunction(node.name, node.lineno, closure([node], {})))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            members = {m.name: m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
            decorators = "".join(_segment(lines, d) + "\n" for d in node.decorator_list)
            for name, member in members.items():
                if name.startswith("test"):
                    scope = {k: v for k, v in members.items() if k != name}
                    text = decorators + closure([member], scope)
                    found.append(TestFunction(f"{node.name}::{name}", member.lineno, text))
    return found


def private_reason(text: str, private_names: set[str]) -> str | None:
    """The first rule the text matches, as "reason: matched text", or None."""
    for pattern, reason in _COMPILED:
        match = pattern.search(text)
        if match:
            return f"{reason}: {match.group(0).strip()}"
    if private_names:
        match = re.search(r"\b(" + "|".join(sorted(map(re.escape, private_names))) + r")\b", text)
        if match:
            return f"uses a private name imported from Lightning: {match.group(0)}"
    return None


def classify_file(source: str) -> dict[str, str | None]:
    """key -> private reason (None when public), for every test function of a Lightning test file."""
    names = private_imported_names(ast.parse(source))
    return {fn.key: private_reason(fn.text, names) for fn in test_functions(source)}
