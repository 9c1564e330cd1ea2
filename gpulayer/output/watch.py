"""In a client: its jobs' and ranks' output lines, printed as they come (``log_to_client``, on by default).

The first job a process sends with ``log_to_client`` on starts one subscriber thread on the process's own
channel (``keys.output_channel(output_id())``); the id travels with each job (the ``gl_out`` header, a
distributed job's ``spec.output``) and a job sent from inside a job keeps its sender's, so the lines of a job's
own jobs come home too. A line of stdout goes to ``sys.stdout``, every other to ``sys.stderr``, prefixed as
Ray prefixes them: ``(square pid=4242 on local-1) hello``, ``(rank 2 on w-b) loss 0.31``. A distributed
job's handle may take its lines instead (:func:`route`: ``distributed(on_output=...)``, `gpulayer train`).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import time
import uuid
from typing import Callable

from .. import app as app_mod
from ..store import keys
from .lines import OUT, Source, decode_batch

log = logging.getLogger(__name__)

POLL = 1.0  # seconds the subscriber waits for a message before it looks again (a lost connection, the end)
SYNC = "sync"  # a marker the process sends itself: every line published before it has been handled

RouteFn = Callable[[Source, str, str], None]  # (source, "out" | "err", line)

_lock = threading.Lock()
_id: str | None = None
_thread: threading.Thread | None = None
_running = False  # the subscriber thread listens (cleared as it ends)
_url: str | None = None  # the broker it listens on (a process connected to another cluster listens there)
_stop = threading.Event()
_hooked = False
_routes: dict[str, RouteFn] = {}  # job or gang id -> who takes its lines instead of printing them
_synced: dict[str, threading.Event] = {}


def _forked() -> None:
    """A forked child has no subscriber (the parent's thread did not come along): it gets an id of its own, or
    every line would be printed by both."""
    global _id, _thread, _lock, _stop, _running, _url
    _id, _thread, _lock, _stop, _running, _url = None, None, threading.Lock(), threading.Event(), False, None
    _routes.clear()
    _synced.clear()


os.register_at_fork(after_in_child=_forked)


def output_id(force: bool = False) -> str | None:
    """The id this process's jobs carry for their output, its subscriber started on first use; None when
    ``log_to_client`` is off (unless ``force``: a handle that takes its gang's lines itself)."""
    if not force and not enabled():
        return None
    if not _running or _url != _broker():
        _start()
    return _id


def _broker() -> str | None:
    settings = app_mod.settings()
    return settings.broker_url if settings is not None else None


def enabled() -> bool:
    """Does this process print its jobs' lines (``log_to_client``)?"""
    settings = app_mod.settings()
    return settings is None or settings.log_to_client


def _start() -> None:
    global _id, _thread, _running, _url, _stop, _hooked
    with _lock:
        url = _broker()
        if _running and _url == url:
            return
        _stop.set()  # the subscriber of the cluster this process was connected to before, if any, ends
        _id = _id or uuid.uuid4().hex
        client = app_mod.redis_client()
        sub = client.pubsub()
        sub.subscribe(keys.output_channel(_id))
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # subscribed before the first job can print
            msg = sub.get_message(timeout=0.5)
            if msg and msg["type"] == "subscribe":
                break
        _stop = threading.Event()
        _thread = threading.Thread(target=_run, args=(client, sub, _stop), name="gpulayer-output-watch",
                                   daemon=True)
        _running, _url = True, url
        _thread.start()
        if not _hooked:
            atexit.register(_drain)
            _hooked = True


_heard: dict[str, float] = {}  # routed job id -> when its last line was handled (time.monotonic)


def route(job_id: str, fn: RouteFn) -> None:
    """Hand ``job_id``'s lines to ``fn`` instead of printing them."""
    _heard[job_id] = time.monotonic()
    _routes[job_id] = fn


def unroute(job_id: str, quiet: float = 0.0, limit: float = 5.0) -> None:
    """Print ``job_id``'s lines again, once none came for ``quiet`` seconds (at most ``limit`` seconds from now):
    a line its worker read from a rank's pipe after the rank ended still goes to the route's ``fn``."""
    end = time.monotonic() + limit
    while quiet and time.monotonic() < end:
        left = _heard.get(job_id, 0.0) + quiet - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(left, 0.05))
    _routes.pop(job_id, None)
    _heard.pop(job_id, None)


def sync(timeout: float = 2.0) -> bool:
    """Wait until every line published on this process's channel before now has been handled (printed or
    routed); False if the subscriber did not get there within ``timeout``. One PUBLISH and a wait: a marker
    on the same channel comes after every line published before it."""
    if _id is None or not _running:
        return True
    token = uuid.uuid4().hex
    done = _synced[token] = threading.Event()
    try:
        client = app_mod.redis_client()
        try:
            client.publish(keys.output_channel(_id), json.dumps({SYNC: token}))
        finally:
            client.close()
        return done.wait(timeout)
    except Exception:  # the output is best effort
        return False
    finally:
        _synced.pop(token, None)


def show(source: Source, stream: str, text: str) -> None:
    """Print one line in this process, prefixed with where it came from."""
    _write(sys.stdout if stream == OUT else sys.stderr, f"{source.prefix()} {text}\n")


def _write(out, text: str) -> None:
    try:
        out.write(text)
        out.flush()
    except (ValueError, OSError):  # a closed stream (the process is ending): the lines are in the jobs' tails
        pass


def handle(data) -> None:
    """One message of the channel: a batch of lines (printed with one write and one flush a stream), or a
    sync marker."""
    batch = json.loads(data)
    if isinstance(batch, dict):
        done = _synced.get(batch.get(SYNC))
        if done is not None:
            done.set()
        return
    printed: dict[str, list[str]] = {}
    for source, stream, text in decode_batch(batch):
        fn = _routes.get(source.job)
        if fn is None:
            printed.setdefault(stream, []).append(f"{source.prefix()} {text}\n")
            continue
        _heard[source.job] = time.monotonic()
        try:
            fn(source, stream, text)
        except Exception:
            log.exception("gpulayer: an output line of job %s could not be handled", source.job)
    for stream, lines in printed.items():
        _write(sys.stdout if stream == OUT else sys.stderr, "".join(lines))


def _run(client, sub, stop: threading.Event) -> None:
    try:
        _listen(client, sub, stop)
    finally:
        global _running
        if _thread is threading.current_thread():
            _running = False


def _listen(client, sub, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            msg = sub.get_message(timeout=POLL)
        except Exception as err:  # the broker went away: listen again when it is back (lines meanwhile are lost)
            log.debug("gpulayer: the output subscriber lost its connection: %s", err)
            time.sleep(0.5)
            continue
        # (not once the process is ending: a daemon thread writing to stdout during shutdown can abort it)
        if msg and msg["type"] == "message" and not stop.is_set():
            handle(msg["data"])
    try:
        sub.close()
        client.close()
    except Exception:
        pass


def _drain() -> None:
    """At exit: the lines already published are printed (one marker's round trip), then the thread is left
    to die with the process."""
    sync(1.0)
    _stop.set()
