"""Which directory is the user's project: the one shipped to the workers unless told otherwise.

The directory of ``__main__``'s file (the script that was run), or the working directory in an
interactive session. Never ``/`` or ``$HOME`` (whole home directories are not projects), never a
directory inside an installed environment (``python -m pytest``'s ``__main__`` is pytest's own).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..payload import in_library

_ENV_MARKERS = ("site-packages", "dist-packages")


def script_root() -> Path | None:
    """The project root of this process, or None where there is none to ship."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    cwd = Path(os.getcwd()).resolve()
    if spec is not None and spec.name not in ("__main__", None):  # python -m pkg.mod: the directory it ran from
        if spec.name.partition(".")[0] == "gpulayer" or not path:
            return None  # gpulayer's own commands (a worker) ship nothing of their own
        file = Path(path).resolve()
        root = cwd if cwd in file.parents else None
        if root is None:
            return None  # an installed module's __main__ (pytest's): not a project
    elif path:
        root = Path(path).resolve().parent
    else:  # python -c, the REPL, a notebook
        root = cwd
    return root if shippable(root) else None


def shippable(root: Path) -> bool:
    """May ``root`` be shipped on its own initiative (not ``/``, ``$HOME``, nor inside an environment)?"""
    if root == Path(root.anchor) or root == Path.home().resolve():
        return False
    if in_library(root) or any(m in root.parts for m in _ENV_MARKERS):
        return False
    if (root / "pyvenv.cfg").exists() or any((p / "pyvenv.cfg").exists() for p in root.parents):
        return False  # inside a virtual environment (its bin/, say)
    return not _on_path(root)  # a command's entry point (/usr/bin/pytest, ~/.local/bin/jupyter): not a project


def _on_path(root: Path) -> bool:
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        try:
            if entry and Path(entry).resolve() == root:
                return True
        except OSError:
            continue
    return False
