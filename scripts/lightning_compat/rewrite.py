"""Turn a Lightning test file into one that imports gpulayer.trainer.

Two steps, both pure text -> text:

1. ``rewrite_names``: every spelling of Lightning's package becomes ``gpulayer.trainer``, in imports, in
   attribute chains and in strings (``mock.patch("lightning.pytorch.trainer.Trainer.fit")`` must patch ours).
   ``lightning.fabric`` / ``lightning_fabric`` map there too: the few Fabric names a Trainer user touches
   (``seed_everything``, ``PossibleUserWarning``, ``MisconfigurationException``) are part of the Trainer's
   surface, and importing the real Fabric would import Lightning's trainer beside ours (``lightning/__init__``
   pulls in ``lightning.pytorch``). A Fabric name gpulayer lacks fails the tests that use it, with its name.
2. ``guard_imports``: each module-level ``from gpulayer.trainer... import a, b`` becomes one line that binds
   ``a`` and ``b`` through ``lsr_runtime.lsr_import``: a name gpulayer lacks is bound to a placeholder that raises
   ``ImportError: cannot import name 'a' ...`` when used. So a missing name fails the functions that use it,
   not every function of the file. Line numbers are kept (the statement's other lines become blank).
   Environment facts Lightning keeps in ``utilities.imports`` (``_IS_WINDOWS``, ``_TORCH_GREATER_EQUAL_2_8``,
   ``_RICH_AVAILABLE``...) are computed by ``lsr_env`` instead: they describe this machine, not an API.
"""

from __future__ import annotations

import ast
import re

from lightning_compat.sandbox.lsr_env import _FACT

TARGET = "gpulayer.trainer"

# (pattern, replacement), applied in order to the whole text of a file.
NAME_REWRITES: list[tuple[str, str]] = [
    (r"\bimport lightning as (\w+)", rf"import {TARGET} as \1"),
    (r"\bfrom lightning import\b", f"from {TARGET} import"),
    (r"(?<![\w.])lightning\.pytorch\b", TARGET),
    (r"(?<![\w.])pytorch_lightning\b", TARGET),
    (r"(?<![\w.])lightning\.fabric\b", TARGET),
    (r"(?<![\w.])lightning_fabric\b", TARGET),
]

# A name imported from a Lightning module whose value is a fact about this machine: served by lsr_env.
ENV_FACT = _FACT


def rewrite_names(text: str) -> str:
    for pattern, replacement in NAME_REWRITES:
        text = re.sub(pattern, replacement, text)
    return text


def guard_imports(text: str) -> str:
    """Rewrite module-level ``from gpulayer.trainer... import ...`` statements into guarded bindings."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    for node in reversed(tree.body):  # from the bottom so earlier line numbers stay valid
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                and (node.module == TARGET or node.module.startswith(TARGET + "."))):
            continue
        if any(alias.name == "*" for alias in node.names):
            continue
        targets = [alias.asname or alias.name for alias in node.names]
        names = [alias.name for alias in node.names]
        bound = ", ".join(targets) + ("," if len(targets) == 1 else "")
        stmt = f"{bound} = _lsr_import({node.module!r}, {names!r})"
        start, end = node.lineno - 1, node.end_lineno
        lines[start:end] = [stmt + "\n"] + ["\n"] * (end - start - 1)
    guarded = "".join(lines)
    if guarded == text:
        return text
    # The helper's own import goes on the first guarded line so no line moves.
    first_line = next(n.lineno for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 0
                      and n.module and (n.module == TARGET or n.module.startswith(TARGET + "."))
                      and all(a.name != "*" for a in n.names))
    out = guarded.splitlines(keepends=True)
    out[first_line - 1] = "from lsr_runtime import lsr_import as _lsr_import; " + out[first_line - 1].lstrip()
    return "".join(out)


def rewrite_test_source(text: str) -> str:
    """The whole transformation the gpulayer side applies to a test file or a helper module."""
    return guard_imports(rewrite_names(text))
