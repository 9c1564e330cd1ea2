"""The local cluster's state file (``$GPULAYER_HOME/cluster.json``): where it is, reading and writing it.

Apart from ``config.py`` (which re-exports what it reads) so that ``gpulayer up`` / ``down`` and the
supervisor find their cluster without importing pydantic: a command run dozens of times a day pays for
every import.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import ConfigError

STATE_FILE_NAME = "cluster.json"


def home_dir() -> Path:
    """``$GPULAYER_HOME`` or ``~/.gpulayer``: the embedded cluster's data and state."""
    return Path(os.environ.get("GPULAYER_HOME") or "~/.gpulayer").expanduser()


def state_path() -> Path:
    return home_dir() / STATE_FILE_NAME


def read_state(path: Path | None = None) -> dict[str, Any] | None:
    """The state file ``gpulayer up`` wrote, or None when there is none."""
    path = path or state_path()
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read the local cluster's state file {path}: {err}; "
                          "run `gpulayer down` then `gpulayer up` to write it again") from err


def write_state(path: Path, state: dict) -> None:
    """The state file, readable only by us (it holds the broker URL and the secret)."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, path)


def proc_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid``: tells the process a state file names from a recycled pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
