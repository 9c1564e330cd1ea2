"""A remote traceback as the user reads it: their own frames, without the engine's around them.

A job's traceback, formatted on the worker, starts with Celery's and gpulayer's frames (``trace_task``,
``__protected_call__``, the ``submit`` task) before the user's function. ``shown`` leaves out the frames
of the engine's packages (celery, kombu, billiard, vine, gpulayer) and says how many it left out; the
full text stays in ``JobFailed.traceback``. A frame is the engine's when its file, taken from the
package's name onwards, is a file of that package on this machine too (a worker's site-packages are
not the client's), so a user's own folder that happens to be called ``celery`` keeps its frames.
Pure: text in, text out.
"""

from __future__ import annotations

import importlib.util
import os
import re
from functools import lru_cache

ENGINE = ("celery", "kombu", "billiard", "vine", "gpulayer")
_FILE = re.compile(r'^  File "(?P<path>[^"]+)", line \d+')


@lru_cache(maxsize=None)
def _root(package: str) -> str | None:
    """Where ``package`` is installed on this machine (None if it is not)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or ()) if spec else []
    return locations[0] if locations else None


@lru_cache(maxsize=4096)
def engine_file(path: str) -> bool:
    """Is ``path`` (as a traceback names it, maybe another machine's) a file of one of the engine's packages?"""
    parts = path.replace("\\", "/").split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in ENGINE:
            root = _root(parts[i])
            if root is not None and os.path.isfile(os.path.join(root, *parts[i + 1:])):
                return True
    return False


def shown(text: str) -> str:
    """``text`` (a formatted traceback, maybe with chained ones) without the engine's frames.

    A traceback whose frames are all the engine's (a failure inside gpulayer itself) is shown whole.
    """
    lines = text.splitlines()
    out: list[str] = []
    hidden = 0
    frame: list[str] = []
    frame_hidden = False

    def close_frame() -> None:
        nonlocal frame, hidden
        if frame:
            if frame_hidden:
                hidden += 1
            else:
                out.extend(frame)
        frame = []

    for line in lines:
        m = _FILE.match(line)
        if m:
            close_frame()
            frame, frame_hidden = [line], engine_file(m["path"])
        elif frame and line.startswith("    "):  # the frame's source line and its ^^^ marks
            frame.append(line)
        else:
            close_frame()
            out.append(line)
    close_frame()
    if not hidden:
        return text
    if not any(_FILE.match(line) for line in out):  # nothing of the user's: the engine's frames are the story
        return text
    note = f"({hidden} frame{'s' if hidden != 1 else ''} of celery/gpulayer left out; the full traceback is in " \
           "the error's .traceback)"
    return "\n".join(out + [note]) + ("\n" if text.endswith("\n") else "")
