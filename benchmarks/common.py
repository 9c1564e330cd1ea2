"""What every benchmark script shares: where results go, and how Ctrl-C / SIGTERM unwind."""

from __future__ import annotations

import datetime as dt
import signal
import socket
from pathlib import Path


def write_results(lines: list[str], name: str) -> Path:
    """Write ``lines`` to ``benchmarks/results/<date>-<host>/<name>``; returns the path."""
    folder = Path(__file__).resolve().parent / "results" / f"{dt.date.today().isoformat()}-{socket.gethostname()}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def unwind_on_signals() -> None:
    """Ctrl-C and SIGTERM unwind through the finally blocks that stop every process by pid.

    SIGINT is reset because a shell may start a background job with it ignored.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
