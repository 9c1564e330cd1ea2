"""``get_filesystem`` (Lightning's ``utilities.cloud_io``): the fsspec filesystem a path or URL lives on.

A local path gets the local filesystem; ``s3://...``, ``memory://...`` or a protocol a user registered with
``fsspec.register_implementation`` get theirs, so an export or a file written through it can go anywhere fsspec
reaches.
"""

from __future__ import annotations

import os
from typing import Any

from fsspec.core import url_to_fs
from fsspec.spec import AbstractFileSystem


def get_filesystem(path: str | os.PathLike, **kwargs: Any) -> AbstractFileSystem:
    """The filesystem of ``path``; ``kwargs`` are the filesystem's options (credentials, endpoint)."""
    fs, _ = url_to_fs(os.fspath(path), **kwargs)
    return fs


__all__ = ["get_filesystem"]
