"""The object store's API: ``gpulayer.put / get / free`` for users, ``write / read / offload / sweep`` for the
job path.

>>> ref = gpulayer.put(torch.randn(50_000, 1_000))   # written once, to the cluster's store
>>> submit.delay(fn, ref)                            # the job gets the tensor; Redis carries 200 bytes
>>> gpulayer.get(ref)                                # the value here (memory-mapped: no copy)
>>> gpulayer.free(ref)                               # gone once no running job holds it

The ref ``put`` returns owns this process's hold on the object: when it is garbage-collected (or the process
exits), the hold goes too, as Ray's ``ray.put`` refs do. A copy of the ref (a job's argument, a pickle) owns
nothing.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import queue
import threading
import time
import uuid
import weakref
from typing import Any
from urllib.parse import urlsplit

from ..errors import ObjectMissing, ObjectStoreFull, PayloadError
from . import format as fmt
from . import lifetimes
from . import ref as ref_module
from .backends import Backend, backend_for, normal_url
from .ref import ObjectRef

# -- this process's cluster ---------------------------------------------------------------------------------

_clients: dict[tuple[int, str], Any] = {}  # (pid, broker URL) -> this process's client for object records
_lock = threading.Lock()


def _settings():
    from .. import app, session

    if not app.is_configured():
        session.ensure_connected()
    return app.settings()


def cluster_client():
    """This process's Redis client for object records (one per process and cluster, made on first use)."""
    from .. import app

    key = (os.getpid(), _settings().broker_url)
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = app.redis_client()
    return client


def _secret() -> bytes:
    from .. import signing

    return signing.current_secret()


_stores: dict[tuple, str] = {}


def store_url(client, settings=None) -> str:
    """The store new objects go to: ``object_store``, else the embedded cluster's own directory (the broker is on
    this host), else none: ``PayloadError`` naming the fix."""
    settings = settings or _settings()
    if settings.object_store:
        return normal_url(settings.object_store)
    key = (settings.broker_url, id(client))
    url = _stores.get(key)
    if url is None:
        if not _on_this_host(settings.broker_url or ""):
            raise PayloadError("no object store is configured and the cluster's broker is on another host, so a "
                               "large value has nowhere every host can read it; set GPULAYER_OBJECT_STORE to "
                               "s3://bucket/prefix or to a directory every host mounts at the same path")
        from ..store.cluster import cluster_id, machine_root
        from ..store.objects import ObjectRecords

        proposed = (machine_root(cluster_id(client)) / "objects").as_uri()
        url = _stores[key] = ObjectRecords(client).default_store(proposed)
    return url


def _on_this_host(broker_url: str) -> bool:
    netloc = urlsplit(broker_url).netloc.rpartition("@")[2]
    for hostport in netloc.split(","):
        host = hostport.rsplit(":", 1)[0].strip("[]") if hostport.count(":") <= 1 or "]" in hostport else hostport
        if host == "localhost":
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            return False
    return bool(netloc)


# -- writing and reading --------------------------------------------------------------------------------------

def write(value: Any, holder: str, client, store: str | None = None, *, auto: bool = True,
          expires: float | None = None) -> ObjectRef:
    """Store ``value`` as a new object held by ``holder`` until ``expires`` (unix time; default now +
    ``result_expires``). Refused before a byte is written (``ObjectStoreFull``) when it would not fit."""
    settings = _settings()
    prepared = fmt.prepare(value, _secret())
    return _write_prepared(value, prepared, holder, client, store or _store_for(client, settings, prepared), auto,
                           expires if expires is not None else time.time() + settings.result_expires, settings)


def _store_for(client, settings, prepared: fmt.Prepared) -> str:
    try:
        return store_url(client, settings)
    except PayloadError as err:
        raise PayloadError(f"a {fmt.human(prepared.size)} value (over inline_limit_bytes, "
                           f"{fmt.human(settings.inline_limit_bytes)}) cannot be stored: {err}") from None


def _write_prepared(value, prepared: fmt.Prepared, holder, client, store, auto, expires, settings) -> ObjectRef:
    from ..store.objects import ObjectRecords

    backend = backend_for(store)
    records = ObjectRecords(client)
    _check_room(prepared.size, backend, records, settings)
    oid = uuid.uuid4().hex
    with backend.writer(oid) as f:
        prepared.write_to(f.write)
    try:
        records.create(oid, prepared.size, backend.url, time.time(), holder, expires)
    except BaseException:
        backend.delete(oid)
        raise
    return ObjectRef(oid, prepared.size, backend.url, auto, fmt.summary(value, prepared.size))


def _check_room(size: int, backend: Backend, records, settings) -> None:
    limit = settings.object_store_max_bytes
    if limit is not None:
        _, held = records.stats()
        if held + size > limit:
            raise ObjectStoreFull(f"a {fmt.human(size)} value does not fit in the object store {backend.url}: it "
                                  f"holds {fmt.human(held)} of its {fmt.human(limit)} limit "
                                  "(object_store_max_bytes); free what you no longer need (gpulayer.free(ref), "
                                  "h.forget()) or raise GPULAYER_OBJECT_STORE_MAX_BYTES")
    free = backend.free_bytes()
    if free is not None and size > free:
        raise ObjectStoreFull(f"a {fmt.human(size)} value does not fit in the object store {backend.url}: its disk "
                              f"has {fmt.human(free)} free; free space there, free objects you no longer need "
                              "(gpulayer.free(ref), h.forget()), or point GPULAYER_OBJECT_STORE at a bigger disk "
                              "or s3://bucket/prefix")


def read(ref: ObjectRef) -> Any:
    """The value ``ref`` names, mapped from its file on this host (copied here once per host from a remote store):
    tensors and arrays view the mapping, copy-on-write."""
    backend = backend_for(ref.store)
    try:
        return fmt.load(backend.local_path(ref.oid), _secret())
    except FileNotFoundError:
        root = getattr(backend, "root", None)
        if root is not None and not root.exists():
            raise ObjectMissing(f"object {ref.oid[:8]}... ({ref.summary or fmt.human(ref.size)}) lives in "
                                f"{ref.store}, a directory this host does not have: the cluster spans hosts, so "
                                "set GPULAYER_OBJECT_STORE on every host to s3://bucket/prefix or to a directory "
                                "every host mounts at the same path") from None
        raise ObjectMissing(f"object {ref.oid[:8]}... ({ref.summary or fmt.human(ref.size)}) is gone from the "
                            f"object store {ref.store}: it was freed (gpulayer.free, h.forget()) or its holders "
                            "expired (result_expires); put the value again and pass the new ref") from None


ref_module.reader = read


def offload(value: Any, holder: str, client) -> Any:
    """``value`` itself when it is small (``inline_limit_bytes``), else a new auto ref to it held by ``holder``."""
    if type(value) is ObjectRef:
        return value
    settings = _settings()
    limit = settings.inline_limit_bytes
    size = fmt.measure(value, enough=limit + 1)
    if size is not None and size <= limit:
        return value
    prepared = fmt.prepare(value, _secret())
    if prepared.size <= limit:
        return value
    return _write_prepared(value, prepared, holder, client, _store_for(client, settings, prepared), True,
                           time.time() + settings.result_expires, settings)


def sweep(client, now: float | None = None) -> lifetimes.Swept:
    """One sweep of the object store (the janitor's, every 30 s): see ``lifetimes.sweep``; this process's own
    store is swept for orphan files too."""
    stores = []
    try:
        stores.append(store_url(client))
    except PayloadError:  # no store of our own: only the ones records name
        pass
    return lifetimes.sweep(client, now, stores)


# -- the user's API -----------------------------------------------------------------------------------------

def put(value: Any) -> ObjectRef:
    """Store ``value`` once in the cluster's object store; pass the ref to any number of jobs.

    The object lives while this ref (in this process), a job that takes it, or a result that holds it does;
    ``gpulayer.free(ref)`` lets go of it sooner."""
    if type(value) is ObjectRef:
        return value
    client = cluster_client()
    holder = lifetimes.put_holder()
    ref = write(value, holder, client, auto=False)
    _own(ref, holder, client)
    return ref


def get(ref: ObjectRef) -> Any:
    """The value of ``ref`` (``ref.get()``); anything else is returned as it is."""
    return read(ref) if type(ref) is ObjectRef else ref


def free(*refs: ObjectRef) -> int:
    """Let go of ``refs`` now: drops every ``put`` hold and stored result's hold on them (jobs still running with
    one keep theirs until they end); returns how many objects were deleted at once."""
    from ..store.objects import ObjectRecords

    oids = [r.oid for r in refs if type(r) is ObjectRef]
    if not oids:
        return 0
    client = cluster_client()
    for oid in oids:
        fin = _owned.pop(oid, None)
        if fin is not None:
            fin.detach()
    records = ObjectRecords(client)
    drops = [(oid, h) for oid in oids for h in records.holders(oid)
             if h.startswith((lifetimes.PUT, lifetimes.RES))]
    return lifetimes.delete(records, records.release(drops, time.time())) if drops else 0


# -- owned refs: a put's hold goes with its ref -------------------------------------------------------------

_owned: dict[str, weakref.finalize] = {}
_drops: queue.SimpleQueue = queue.SimpleQueue()  # (client, oid, holder): safe to fill from a finalizer, any thread
_dropper: threading.Thread | None = None
_drop_lock = threading.Lock()


def _own(ref: ObjectRef, holder: str, client) -> None:
    fin = weakref.finalize(ref, _dropped, client, ref.oid, holder, os.getpid())
    fin.atexit = False  # at exit, _at_exit releases them all in one go
    _owned[ref.oid] = fin
    _start_dropper()


def _dropped(client, oid: str, holder: str, pid: int) -> None:
    """The owning ref was collected (maybe inside any code of this thread): queue the release, never call out."""
    _owned.pop(oid, None)
    if os.getpid() == pid:  # a forked child's copy of its parent's ref owns nothing
        _drops.put((client, oid, holder))


def _start_dropper() -> None:
    global _dropper
    if _dropper is None or not _dropper.is_alive():
        with _drop_lock:
            if _dropper is None or not _dropper.is_alive():
                _dropper = threading.Thread(target=_drop_forever, name="gpulayer-object-drops", daemon=True)
                _dropper.start()


RENEW_EVERY = 3600.0  # a process that keeps a put's ref renews its hold this often (it expires after result_expires)


def _drop_forever() -> None:
    renewed = time.monotonic()
    while True:
        _drop_queued(block=True, timeout=RENEW_EVERY / 4)
        if time.monotonic() - renewed > RENEW_EVERY:
            _renew()
            renewed = time.monotonic()


def _renew() -> None:
    """Hold every ref this process still owns for another ``result_expires``: a notebook's ref outlives a day."""
    by_client: dict[int, tuple[Any, str, list[str]]] = {}
    for fin in list(_owned.values()):
        found = fin.peek()
        if found is not None:
            client, oid, holder, _ = found[2]
            by_client.setdefault(id(client), (client, holder, []))[2].append(oid)
    try:
        expires = time.time() + _settings().result_expires
    except Exception:
        return
    for client, holder, oids in by_client.values():
        for oid in oids:  # one by one: an object freed meanwhile does not stop the others' renewal
            try:
                lifetimes.hold(client, [oid], holder, expires)
            except Exception:
                pass


def _drop_queued(block: bool, timeout: float | None = None) -> None:
    try:
        batch = [_drops.get(block=block, timeout=timeout)]
    except queue.Empty:
        return
    while True:
        try:
            batch.append(_drops.get_nowait())
        except queue.Empty:
            break
    by_holder: dict[tuple, list[str]] = {}
    for client, oid, holder in batch:
        by_holder.setdefault((client, holder), []).append(oid)
    for (client, holder), oids in by_holder.items():
        try:
            lifetimes.release(client, oids, holder)
        except Exception:  # Redis is gone: the holds expire with result_expires, and a sweep deletes the objects
            pass


def _at_exit() -> None:
    for fin in list(_owned.values()):
        fin()
    if not _drops.empty():
        _drop_queued(block=False)


atexit.register(_at_exit)
os.register_at_fork(after_in_child=lambda: (_owned.clear(), globals().__setitem__("_dropper", None)))
