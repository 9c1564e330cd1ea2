"""Where loggers write: a local directory or any ``fsspec`` URL (``memory://``, ``s3://``, ...), as Lightning's do.

fsspec comes with torch; a path without a protocol is the local file system.
"""

from __future__ import annotations

from typing import Any


def filesystem(path: str) -> Any:
    """The ``fsspec`` file system that holds ``path``."""
    import fsspec
    return fsspec.core.url_to_fs(str(path))[0]
