"""The object store: large values beside the broker, referenced from messages by small signed ``ObjectRef``\\ s.

- ``ref.py``: ``ObjectRef``, what travels; ``format.py``: the one file format (zero-copy reads);
- ``backends.py``: where the bytes live (a directory, S3); ``cache.py``: each host's copies of remote objects;
- ``lifetimes.py``: who holds an object, and the sweep; ``api.py``: ``put / get / free`` and the job path's
  ``write / read / offload``. The records in Redis: ``gpulayer/store/objects.py``.
"""

from __future__ import annotations

from .api import free, get, offload, put, read, store_url, sweep, write
from .format import measure
from .lifetimes import arg_holder, hold, put_holder, release, res_holder
from .ref import ObjectRef, refs_in

__all__ = ["ObjectRef", "arg_holder", "free", "get", "hold", "measure", "offload", "put", "put_holder", "read",
           "refs_in", "release", "res_holder", "store_url", "sweep", "write"]
