"""Who sent which job, recorded in the pipeline that publishes it, for `gpulayer cancel` from a shell.

A client puts its identity (``CLIENT_HEADER``, config ``client_id``, default ``user@host``) in each job's
headers; a Celery group's members carry Celery's own ``group`` header too. As the transport publishes a
message it adds, to the same pipeline (or publish batch), the job id to its sender's set and to its group's
(key schema in ``store/keys.py``): no round trip more per job, and the records exist as soon as the job does.
Messages without the header (a worker's retries and chain steps, ``submit_batch``'s jobs, which the batch
records at once: ``store/sent.py``) are not recorded here.
"""

from __future__ import annotations

from time import time

from kombu.transport import redis as kredis

from ..store import keys

CLIENT_HEADER = "gl_client"


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
    if sent not in once:  # a batch of 1,000 messages sets each expiry once
        once.add(sent)
        add("expire", sent, keys.SENT_KEEP_SECONDS)
        add("sadd", keys.CLIENTS, client)
    group = headers.get("group")
    if group:
        members = keys.batch(group)
        add("sadd", members, job_id)
        if members not in once:
            once.add(members)
            add("expire", members, keys.SENT_KEEP_SECONDS)
