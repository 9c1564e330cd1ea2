"""Keep Python's garbage collector off what existed before the first step.

A fit starts on a big heap: torch, the module, the data, everything the script
imported (a CPU MLP script holds ~170,000 objects the collector tracks). A full
collection walks all of them, ~100 ms each on a 2-core VM, and CPython runs one
whenever its allocation counts say so: three in a 600-step MLP fit, 15% of its
wall time, landing at random steps. ``frozen()`` moves the objects that exist
when the fit starts into CPython's permanent generation (``gc.freeze``) for the
fit, so collections walk only what the fit itself creates; ``gc.unfreeze`` gives
them back at the end, garbage among them included.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    if gc.get_freeze_count():  # the program froze its heap itself (a pre-fork server): leave its choice alone
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
