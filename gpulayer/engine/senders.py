"""Who sent which job, recorded in the pipeline that publishes it, for `gpulayer cancel` from a shell.

A client puts its identity (``CLIENT_HEADER``, config ``client_id``, default ``user@host``) in each job's
headers; a Celery group's members carry Celery's own ``group`` header too. As the transport publishes a
message it adds, to the same pipeline (or publish batch), the job id to its sender's set and to its group's
(key schema in ``store/keys.py``): no round trip more per job, and the records exist as soon as the job does.
A sender's record expires a day after its last job (``keys.SENT_KEEP_SECONDS``); that expiry and the set of
senders are refreshed once every ``REFRESH_EVERY`` seconds per process and sender, not with every job: one
command per job (the ``ZADD``), not three. Messages without the header (a worker's retries and chain steps)
are not recorded here; ``engine/publish.py`` records the jobs it sends itself (``submit.delay``'s, and
``submit_batch``'s one command per chunk) with the same keys.
"""

from __future__ import annotations

import os

from time import monotonic, time

from kombu.transport import redis as kredis

from ..store import keys

CLIENT_HEADER = "gl_client"
REFRESH_EVERY = 10.0  # seconds between refreshes of a sender's expiry and of the senders' set, per process

_refreshed: dict[tuple[int, str], float] = {}  # (pid, sender) -> when this process last refreshed them


def owner_of(request) -> str | None:
    """The sender a job's request names (a worker's ``Request``, or the ``Context`` a job's process sees): for
    a job a user signed, that user (checked on receipt, engine/transport.py ``check_sender``)."""
    if request is None:
        return None
    owner = getattr(request, CLIENT_HEADER, None)
    for holder in ("request_dict", "headers"):
        if owner is None:
            owner = (getattr(request, holder, None) or {}).get(CLIENT_HEADER)
    return owner if isinstance(owner, str) else None


def refresh_due(sender: str) -> bool:
    """Should this job's records also refresh ``sender``'s expiry and the senders' set?"""
    return monotonic() - _refreshed.get((os.getpid(), sender), -REFRESH_EVERY) >= REFRESH_EVERY


def refreshed(sender: str) -> None:
    """The refresh :func:`refresh_due` asked for reached Redis."""
    _refreshed[os.getpid(), sender] = monotonic()


def record(pipe, message: dict) -> None:
    """Add ``message``'s sender and batch records to ``pipe`` (a redis-py pipeline or kombu's publish batch)."""
    headers = message.get("headers") or {}
    client, job_id = headers.get(CLIENT_HEADER), headers.get("id")
    if not client or not job_id:
        return
    add = pipe.add if isinstance(pipe, kredis.PublishBatch) else (lambda name, *a: getattr(pipe, name)(*a))
    once = pipe.__dict__.setdefault("_gpulayer_sent", set()) if isinstance(pipe, kredis.PublishBatch) else set()
    sent = keys.client_jobs(client)
    add("zadd", sent, {job_id: time()})
    if sent not in once and refresh_due(client):  # a batch of 1,000 messages sets each expiry once at most
        once.add(sent)
        add("expire", sent, keys.SENT_KEEP_SECONDS)
        add("sadd", keys.CLIENTS, client)
        refreshed(client)  # (sent with the message: a pipeline that fails loses the message too)
    group = headers.get("group")
    if group:
        members = keys.batch(group)
        add("sadd", members, job_id)
        if members not in once:
            once.add(members)
            add("expire", members, keys.SENT_KEEP_SECONDS)
            add("zadd", keys.BATCHES, {group: time()})  # the index of batch ids (gpulayer/ids.py)
