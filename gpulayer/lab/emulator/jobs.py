"""The job an emulated worker knows how to run (a real worker runs it too, for real)."""

from __future__ import annotations

import os
import sys
import time

REF = "gpulayer.lab.emulator.jobs:emulated"


def emulated(seconds: float = 0.0, value=None, fail_rank: int | None = None, exit_code: int = 1):
    """Sleep ``seconds``, return ``value``: the declared cost of an emulated job.

    In a distributed job, the rank ``fail_rank`` exits with ``exit_code`` instead
    (a scripted failure; emulated gang nodes report the same).
    """
    if seconds > 0:
        time.sleep(seconds)
    if fail_rank is not None and int(os.environ.get("RANK", "-1")) == fail_rank:
        sys.exit(exit_code)
    return value
