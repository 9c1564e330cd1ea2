"""S3-compatible storage (AWS S3, GCS's S3 API, MinIO, Ceph) as an object store backend, on ``obstore``.

``GPULAYER_OBJECT_STORE=s3://bucket/prefix`` plus the usual environment, read by obstore itself:
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``), ``AWS_REGION``, and ``AWS_ENDPOINT_URL``
for anything but AWS (MinIO, Ceph, GCS's ``https://storage.googleapis.com``, a test server); an ``http://``
endpoint is allowed without also setting ``AWS_ALLOW_HTTP``. Without keys obstore asks the usual providers
(web identity, the container's, the instance's metadata service).

Why obstore: it is the Python binding of the Rust ``object_store`` crate (the one Arrow, Polars and DataFusion
use), so transfers run outside the GIL and without a Python event loop: an upload is a multipart upload with
``CONCURRENCY`` parts in flight, a download is ``CONCURRENCY`` ranged GETs at once, each written at its offset.
``s3fs`` would bring aiobotocore and an asyncio thread, and copies each part through Python objects.

Layout: one key per object, ``<prefix>/<oid>``, never rewritten (an oid is new for every object). An upload
becomes visible only when it completes (a multipart upload is committed at its end, or aborted on an error), so
a reader never sees half an object and no temporary key is needed. Memory: an upload holds at most
``PART x CONCURRENCY`` bytes whatever the object's size (``write`` hands obstore at most a part at a time), a
download the same. Reads go through the host cache (``cache.py``): one download per host, shared by every
process there, memory-mapped from the cached file.

Errors name what to fix: a missing bucket, no credentials, an endpoint that does not answer (bounded retries,
seconds rather than obstore's default three minutes), and obstore not installed (``pip install 'gpulayer[s3]'``).
obstore does not survive a fork: ``s3_helper.py`` says how each process of a worker stays clear of that.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

from ..errors import ConfigError, ObjectStoreUnavailable
from . import s3_helper

PART = 16 * 2**20  # bytes per uploaded part and per ranged GET (S3's minimum part is 5 MiB)
CONCURRENCY = 8  # parts in flight, either way
CONNECT_TIMEOUT = "5s"
# A request's whole time, body included: obstore's 30 s default cut off the completion of a 200 MB multipart
# upload on a loaded server (the retry then found the upload gone: NoSuchUpload).
REQUEST_TIMEOUT = "600s"
RETRIES = 4  # 0.1 + 0.2 + 0.4 + 0.8 s of backoff: an endpoint that is down is reported within seconds
RETRY_TIMEOUT = dt.timedelta(seconds=60)
INSTALL = "pip install 'gpulayer[s3]'"
_OID = re.compile(r"[0-9a-f]{32}")  # only keys shaped like ours are listed for the sweep
_CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_SKIP_SIGNATURE")


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")`` (the prefix may be empty)."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(f"object store {url!r} is not an S3 URL: give s3://bucket or s3://bucket/prefix "
                          "(GPULAYER_OBJECT_STORE or object_store in the config file)")
    return parts.netloc, parts.path.strip("/")


def _obstore():
    try:
        import obstore
        from obstore.store import S3Store
    except ImportError as err:
        raise ConfigError(f"an s3:// object store needs the obstore package, which does not import here ({err}): "
                          f"{INSTALL}") from err
    return obstore, S3Store


class S3:
    """The ``Backend`` of one ``s3://bucket/prefix``: one obstore client (a connection pool), safe across threads.

    Made once per URL per process (``backend_for``); the first request (a listing of one key) happens here, so a
    wrong bucket, missing credentials or an endpoint that does not answer fail where the store is configured,
    not in the middle of a job.
    """

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.bucket, self.prefix = parse_url(self.url)
        self._endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
        self._pid: int | None = None  # the process this instance's client was made in (None: not yet)
        self._setup()
        if self._via is not None:
            self._via.call("check", self.url)
        else:
            self._check()

    def _setup(self) -> None:
        """This process's client: obstore's, or the helper where this process forks children (``s3_helper``). An
        instance inherited through a fork makes its own on first use."""
        self._pid = os.getpid()
        self._via = s3_helper.helper() if s3_helper.delegated() else None
        if self._via is not None:
            return
        self._ob, S3Store = _obstore()
        s3_helper.starting_obstore()
        options = {"connect_timeout": CONNECT_TIMEOUT, "timeout": REQUEST_TIMEOUT}
        if self._endpoint.startswith("http://"):
            options["allow_http"] = True  # said by the endpoint itself: a MinIO on a private network, a test server
        retry = {"max_retries": RETRIES, "retry_timeout": RETRY_TIMEOUT,
                 "backoff": {"init_backoff": dt.timedelta(milliseconds=100), "max_backoff": dt.timedelta(seconds=5),
                             "base": 2}}
        try:
            self._store = S3Store(self.bucket, prefix=self.prefix or None, client_options=options,
                                  retry_config=retry)
        except Exception as err:  # a malformed AWS_* value: obstore's own errors say which
            raise ConfigError(f"cannot configure object store {self.url}: {_first_line(err)}") from err
        # obstore raises its own classes, and Python's for some (FileNotFoundError for a missing key)
        self._errors = (self._ob.exceptions.BaseError, FileNotFoundError, PermissionError, ConnectionError,
                        TimeoutError)

    def _here(self, op: str | None = None):
        """The helper for ``op`` in a forking process (None: do it here); refuses a transfer there."""
        if self._pid != os.getpid():
            self._setup()
        if self._via is not None and op is None:
            raise RuntimeError(f"a worker's main process moves no object bytes ({self.url}): transfers run in its "
                               "pool processes, so heartbeats never wait behind one")
        return self._via

    def __repr__(self) -> str:
        return f"S3({self.url!r})"

    # -- writing --------------------------------------------------------------------------------
    @contextmanager
    def writer(self, oid: str) -> Iterator["_Upload"]:
        """A binary file to write the object ``oid`` into; the object exists once the block ends without an error
        (one multipart upload, committed at the end), and not at all if it raises."""
        self._here()
        raw = self._do(f"upload {oid}", self._ob.open_writer, self._store, oid, buffer_size=PART,
                       max_concurrency=CONCURRENCY)
        upload = _Upload(raw, self._errors, lambda err: self._explain(err, f"upload {oid}"))
        try:
            yield upload
        except BaseException as err:
            with suppress(Exception):  # obstore's exit with an exception aborts the multipart upload
                raw.__exit__(type(err), err, err.__traceback__)
            raise
        self._do(f"upload {oid}", raw.close)  # completes the upload: the object appears whole, now

    def put_file(self, oid: str, path: Path) -> None:
        """Store the file at ``path`` as ``oid``: read and uploaded in parts, never whole in memory."""
        self._here()
        self._do(f"upload {oid} from {path}", self._ob.put, self._store, oid, Path(path), chunk_size=PART,
                 max_concurrency=CONCURRENCY)

    # -- reading --------------------------------------------------------------------------------
    def local_path(self, oid: str) -> Path:
        """This host's copy of ``oid`` (``cache.py``), downloaded by the first process on the host that asks; the
        others wait for it under the cache's lock, then share the file. Each download counts in the object's
        record (``fetches``: hosts that copied it)."""
        from ..store.objects import ObjectRecords
        from .api import cluster_client  # the host cache and the records are the cluster's
        from .cache import host_cache

        self._here()
        client = cluster_client()
        cache = host_cache(client)
        if (cache.root / oid).exists():  # cached: no request at all (path() only marks it used)
            return cache.path(oid, 0, self.download)
        size = self.size(oid)

        def fetch(dest: Path) -> None:
            self.download(oid, dest, size)
            ObjectRecords(client).fetched(oid)

        return cache.path(oid, size, fetch)

    def size(self, oid: str) -> int:
        if via := self._here("size"):
            return via.call("size", self.url, oid)
        return self._do(f"read {oid}", self._ob.head, self._store, oid)["size"]

    def download(self, oid: str, dest: str | os.PathLike, size: int | None = None) -> int:
        """Write object ``oid`` (of ``size`` bytes, None: ask) into the file ``dest`` (made or truncated):
        ``CONCURRENCY`` ranged GETs of ``PART`` bytes at once, each written at its offset; returns its size."""
        self._here()
        size = self.size(oid) if size is None else size
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)

            def piece(start: int) -> None:
                data = self._do(f"read {oid}", self._ob.get_range, self._store, oid, start=start,
                                end=min(start + PART, size))
                view = memoryview(data)
                done = 0
                while done < len(view):  # pwrite may write less than asked
                    done += os.pwrite(fd, view[done:], start + done)

            if 0 < size <= PART:
                piece(0)
            elif size:
                with ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="gl-s3-get") as pool:
                    for _ in pool.map(piece, range(0, size, PART)):
                        pass
        finally:
            os.close(fd)
        return size

    # -- lifetimes ------------------------------------------------------------------------------
    def delete(self, oid: str) -> None:
        """Remove ``oid``, and this host's cached copy of it; one that is already gone is not an error (deletes
        are retried by the sweep). Other hosts' copies go as their caches make room: an object never changes, so
        a copy is never wrong, and no holder can take a deleted object again."""
        if via := self._here("delete"):
            via.call("delete", self.url, oid)
        else:
            try:
                self._ob.delete(self._store, oid)
            except FileNotFoundError:
                pass
            except self._errors as err:
                raise self._explain(err, f"delete {oid}") from err
        from .. import app

        if app.is_configured() and _OID.fullmatch(oid):  # (a process with no cluster has no cache either)
            from .api import cluster_client
            from .cache import host_cache

            host_cache(cluster_client()).drop(oid)

    def list_old(self, older_than_s: float) -> Iterator[tuple[str, float]]:
        """``(oid, mtime)`` of every object under the prefix last written more than ``older_than_s`` ago (keys
        not shaped like an oid, and anything below a further ``/``, are someone else's and left out)."""
        if via := self._here("list_old"):
            yield from (tuple(x) for x in via.call("list_old", self.url, older_than_s))
            return
        cutoff = time.time() - older_than_s
        pages = iter(self._do("list the objects", self._ob.list, self._store, chunk_size=1000))
        while (page := self._do("list the objects", next, pages, None)) is not None:
            for meta in page:
                mtime = meta["last_modified"].timestamp()
                if _OID.fullmatch(meta["path"]) and mtime < cutoff:
                    yield meta["path"], mtime

    def free_bytes(self) -> int | None:
        """None: a bucket has no free space to report (a quota, if any, shows as a failed upload)."""
        return None

    def exists(self, oid: str) -> bool:
        if via := self._here("exists"):
            return via.call("exists", self.url, oid)
        try:
            self._ob.head(self._store, oid)
        except FileNotFoundError:
            return False
        except self._errors as err:
            raise self._explain(err, f"look up {oid}") from err
        return True

    # -- helpers --------------------------------------------------------------------------------
    def _check(self) -> None:
        """One request that every later one needs to succeed: list at most one key under the prefix."""
        self._here("check")
        self._do("list the objects", lambda: next(iter(self._ob.list(self._store, chunk_size=1)), None))

    def _do(self, doing: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, obstore's errors raised as ours (``_explain``)."""
        try:
            return fn(*args, **kwargs)
        except self._errors as err:
            raise self._explain(err, doing) from err

    def _explain(self, err: Exception, doing: str) -> Exception:
        """obstore's error as ours, saying what to fix; obstore's own first line stays at the end."""
        text = str(err)
        seen = _first_line(err)
        where = f"object store {self.url}" + (f" at {self._endpoint}" if self._endpoint else "")
        if "NoSuchBucket" in text:
            return ConfigError(f"cannot {doing} in {where}: bucket {self.bucket!r} does not exist; create it, or "
                               "set GPULAYER_OBJECT_STORE to s3://<an existing bucket>/<prefix>")
        if "/latest/api/token" in text or "/latest/meta-data" in text or (
                not any(os.environ.get(v) for v in _CREDENTIAL_VARS) and "credential" in text.lower()):
            return ConfigError(f"cannot {doing} in {where}: no credentials: none of AWS_ACCESS_KEY_ID / "
                               "AWS_SECRET_ACCESS_KEY (nor a web identity or container credentials) is set, and no "
                               f"instance metadata service answered; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY ({seen})")
        if isinstance(err, (PermissionError,)) or any(code in text for code in (
                "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403 Forbidden")):
            return ConfigError(f"cannot {doing} in {where}: the server refused our credentials; check "
                               f"AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION ({seen})")
        if "error sending request" in text or "Connect" in text and "HttpError" in text:
            endpoint = self._endpoint or "AWS's endpoint for AWS_REGION"
            return ObjectStoreUnavailable(
                f"cannot {doing} in {where}: {endpoint} does not answer; check AWS_ENDPOINT_URL (the "
                f"S3-compatible server's URL, e.g. http://minio:9000) and that the server is up ({seen})")
        if isinstance(err, FileNotFoundError) and doing.startswith("upload"):
            return ObjectStoreUnavailable(f"cannot {doing} in {where}: the server no longer knows the multipart "
                                          f"upload (a completion that timed out and was retried?); nothing was "
                                          f"stored, try again ({seen})")
        if isinstance(err, FileNotFoundError):
            return FileNotFoundError(f"cannot {doing} in {where}: it is not there (freed, or swept as an orphan); "
                                     "a ref must be held (by a job's arguments or result, or gpulayer.put's ref) "
                                     "while it is used")
        return ObjectStoreUnavailable(f"cannot {doing} in {where}: {seen}")


class _Upload:
    """The binary file ``S3.writer`` yields: hands obstore's writer at most ``PART`` bytes at a time, so a
    gigabyte buffer written in one call is not copied whole into obstore's buffer; obstore's errors come out as
    ours."""

    def __init__(self, raw, errors, explain):
        self._raw = raw
        self._errors = errors
        self._explain = explain
        self.written = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        try:
            for start in range(0, len(view), PART):
                self._raw.write(view[start:start + PART])
        except self._errors as err:
            raise self._explain(err) from err
        self.written += len(view)
        return len(view)

    def tell(self) -> int:
        return self.written

    def writable(self) -> bool:
        return True


def _first_line(err: Exception) -> str:
    """obstore's message without its multi-line debug dump."""
    return str(err).split("\n\nDebug source:")[0].strip().splitlines()[0] if str(err) else type(err).__name__


if __name__ == "__main__":  # the helper process of a process that forks children (s3_helper.py)
    s3_helper.serve(S3)
