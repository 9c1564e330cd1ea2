"""multiprocessing's temporary directory (``pymp-*`` in ``TMPDIR``), removed by the process that made it even when
that process ends with ``os._exit``.

multiprocessing makes the directory the first time something in a process needs it (billiard's pool does, for the
counters it shares with its processes) and removes it at the interpreter's exit, which a process ending with
``os._exit`` skips: the worker (``exit_at_once``), the warm template, a Trainer's ranks. Each left one empty
directory per life. A process forked from its maker shares it and leaves it alone: only the maker removes it.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil

_inherited: str | None = None  # the directory this process had from its parent (not its to remove)


def _note_inherited() -> None:
    global _inherited
    _inherited = multiprocessing.current_process()._config.get("tempdir")


_note_inherited()
os.register_at_fork(after_in_child=_note_inherited)


def remove_made_here() -> None:
    """Before ``os._exit``: remove multiprocessing's temporary directory if this process made it."""
    made = multiprocessing.current_process()._config.get("tempdir")
    if made and made != _inherited:
        shutil.rmtree(made, ignore_errors=True)
