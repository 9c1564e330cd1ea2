"""Ids as people type them: a job's, distributed job's or batch's whole id, or any unique prefix of it of at
least ``MIN_PREFIX`` characters, as git and docker take them (`gpulayer status` shows 12).

    full = resolve("7d5d3af3731d")              # the one id it starts, else UnknownId / AmbiguousId
    full = resolve("3f2a1b", kinds=("job",))    # only jobs (`gpulayer logs` takes a job's or a rank's)

An id that exists whole is taken as it is (even when it also starts a longer one). A prefix is looked up in
the indexes, never in the whole keyspace first: distributed jobs in ``gl:gangs``, batches and groups in
``gl:batches``, jobs in every sender's record of the last day (``gl:client:<identity>:jobs``), each with
ZSCAN ``MATCH prefix*``; only a job prefix found nowhere else is then looked for among the stored results
(SCAN, the whole keyspace: the slow path, for the results of jobs sent more than a day ago).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import redis

from .errors import AmbiguousId, UnknownId
from .store import keys

MIN_PREFIX = 6
KINDS = ("gang", "batch", "job")
WORDS = {"gang": "distributed job", "batch": "batch", "job": "job"}
SHOWN = 5  # matches named in an "ambiguous" message
_COUNT = 50_000  # entries per SCAN/ZSCAN step: few round trips (benchmarks/id_prefix.py: 5,000 took twice as long)


def resolve(text: str, kinds: Sequence[str] = KINDS, r: redis.Redis | None = None) -> str:
    """The whole id that ``text`` (a whole id, or a prefix of at least ``MIN_PREFIX`` characters) names.

    ``kinds``: which of ``"gang"``, ``"batch"``, ``"job"`` it may be. Raises ``UnknownId`` (nothing has that
    id or starts with it) or ``AmbiguousId`` (several do: "ambiguous: matches a (job), b (batch)").
    """
    text = text.strip()
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown kinds {sorted(unknown)}: pick from {KINDS}")
    r = r if r is not None else _client()
    if text and exists(r, text, kinds):
        return text
    what = " or ".join(WORDS[k] for k in kinds)
    if len(text) < MIN_PREFIX:
        raise UnknownId(f"unknown id {text!r}: no {what} has this id, and a short id needs at least {MIN_PREFIX} "
                        "characters")
    found = matches(r, text, kinds)
    if not found:
        raise UnknownId(f"unknown id {text}: no {what} with this id or starting with it was sent in the last day")
    if len(found) > 1:
        shown = ", ".join(f"{full} ({WORDS[kind]})" for full, kind in found[:SHOWN])
        more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
        raise AmbiguousId(f"ambiguous: matches {shown}{more}; give more of the id", tuple(f for f, _ in found))
    return found[0][0]


def exists(r: redis.Redis, full: str, kinds: Sequence[str] = KINDS) -> bool:
    """Is ``full`` a whole id of one of ``kinds`` (one pipelined round trip)?"""
    pipe = r.pipeline(transaction=False)
    if "gang" in kinds:
        pipe.exists(keys.gang(full))
    if "batch" in kinds:
        pipe.exists(keys.batch(full))
    identities: list[str] = []
    if "job" in kinds:
        pipe.exists(_result_key(full))
        identities = _identities(r)
        for identity in identities:
            pipe.zscore(keys.client_jobs(identity), full)
    return any(v not in (None, 0) for v in pipe.execute())  # EXISTS: 0 or 1; ZSCORE: None or when sent


def matches(r: redis.Redis, prefix: str, kinds: Sequence[str] = KINDS) -> list[tuple[str, str]]:
    """Every ``(whole id, kind)`` that starts with ``prefix``, sorted; jobs found by their results only where
    no index had any."""
    pattern = keys.glob_escape(prefix) + "*"
    found: dict[str, str] = {}
    if "gang" in kinds:
        found.update(dict.fromkeys(_zscan(r, keys.GANGS, pattern), "gang"))
    if "batch" in kinds:
        r.zremrangebyscore(keys.BATCHES, "-inf", time.time() - keys.SENT_KEEP_SECONDS)
        found.update((i, "batch") for i in _zscan(r, keys.BATCHES, pattern) if i not in found)
    if "gang" in kinds and not found:  # a finished distributed job leaves the index; its record stays a while
        head = keys.gang("")
        found.update((k[len(head):], "gang") for k in _scan(r, keys.glob_escape(head) + pattern)
                     if ":" not in k[len(head):])
    if "job" in kinds:
        jobs = {i for identity in _identities(r) for i in _zscan(r, keys.client_jobs(identity), pattern)}
        if not jobs and not found:  # the slow path: the results of jobs sent more than a day ago
            head = _result_prefix()
            jobs = {k[len(head):] for k in _scan(r, keys.glob_escape(head) + pattern)}
        found.update((i, "job") for i in jobs if i not in found)
    return sorted(found.items())


def _zscan(r: redis.Redis, key: str, pattern: str) -> Iterable[str]:
    for member, _ in r.zscan_iter(key, match=pattern, count=_COUNT):
        yield member.decode() if isinstance(member, bytes) else member


def _scan(r: redis.Redis, pattern: str) -> Iterable[str]:
    for key in r.scan_iter(match=pattern, count=_COUNT):
        yield key.decode() if isinstance(key, bytes) else key


def _identities(r: redis.Redis) -> list[str]:
    return [c.decode() if isinstance(c, bytes) else c for c in r.smembers(keys.CLIENTS)]


def _result_key(job_id: str) -> str:
    """A job's stored result (``celery-task-meta-<id>``, Celery's backend's key)."""
    from . import app as app_mod

    key = app_mod.app.backend.get_key_for_task(job_id)
    return key.decode() if isinstance(key, bytes) else key


def _result_prefix() -> str:
    from . import app as app_mod

    prefix = app_mod.app.backend.task_keyprefix
    return prefix.decode() if isinstance(prefix, bytes) else prefix


def _client() -> redis.Redis:
    from . import app as app_mod
    from .session import ensure_connected

    ensure_connected()
    return app_mod.app.backend.client
