"""Publishing ``submit`` messages as Celery's ``send_task`` builds them, without its generic work per message.

``Celery.send_task`` resolves task options, runs the router, takes a producer from the pool and declares
the queue for every message; kombu's ``Producer.publish`` then wraps each message in its retry policy,
and the transport sends it with its bell and its sender's records in a pipeline of six commands. For a
tiny job that machinery was most of a ``delay``'s CPU in the client (``benchmarks/cpu_per_job.py``).

Two ways here, for jobs gpulayer routed already:

- :func:`direct`: the message is built with Celery's ``create_task_message``, kombu's serializer and
  kombu's own ``prepare_message`` / ``_inplace_augment_message`` (the layout ``engine/envelope.py`` reads),
  then sent by this module: one job with one script call (``store/lua/publish.lua``: the message, its
  bell, who sent it), a chunk of a batch with one pipeline (one ``LPUSH`` for all its messages, one for
  its bell, one ``ZADD`` and one ``SADD`` recording who sent them and in which batch). Only where the
  message is the one ``send_task`` would publish: no publish signal connected, no task-sent event, no
  compression, no queue expiry, the queue declared already by this process (the first message of each
  queue goes the other way, which declares it). ``tests/test_publish.py`` compares the two messages.
- :func:`publish_task`: Celery's ``send_task_message`` (its signals, serializer and retry policy), with
  each queue declared once per process; a direct queue needs no binding on Redis (kombu publishes it to
  the anonymous exchange).

With ``durability = "replicated"`` (store/durability.py) the script call and the chunk's pipeline end with
``WAIT`` on the same connection, and the call returns once a replica has the job (or raises ``NotReplicated``).

engine/upstream.py pins what both rely on (``Celery.send_task``, ``AMQP._create_task_sender``, kombu's
``Producer.publish``, ``prepare_message``, ``_inplace_augment_message`` and the Redis ``Channel._put``).
"""

from __future__ import annotations

import json
import os
from time import time
from typing import Sequence

from celery import signals
from kombu import serialization
from kombu.entity import maybe_delivery_mode
from kombu.utils.json import dumps

from ..store import durability, keys
from ..store.registry import load_script
from . import senders
from .bells import BELL_TOKENS
from .transport import Channel

_declared: tuple[int, set[str]] = (0, set())  # (pid, queues this process declared): kombu declares per message
_modes: dict[str, int] = {}  # queue -> the delivery mode send_task_message gives its messages
_SIGNALS = (signals.before_task_publish, signals.after_task_publish, signals.task_sent)


def _declared_here() -> set[str]:
    global _declared
    pid, declared = _declared
    if pid != os.getpid():
        _declared = pid, declared = os.getpid(), set()
    return declared


def publish_task(celery_app, producer, name: str, task_id: str, args: tuple, kwargs: dict, queue: str,
                 headers: dict, argsrepr: str, kwargsrepr: str, shadow: str | None = None) -> None:
    """Publish task ``name`` with ``task_id`` to ``queue`` through Celery; kombu's ``EncodeError`` passes through.

    ``shadow``: the name the job goes by in the worker's logs and events (Celery's own option; the worker
    still runs task ``name``)."""
    amqp = celery_app.amqp
    declared = _declared_here()
    message = amqp.create_task_message(task_id, name, args, kwargs, reply_to=celery_app.thread_oid,
                                       argsrepr=argsrepr, kwargsrepr=kwargsrepr, shadow=shadow)
    amqp.send_task_message(producer, name, message, queue=amqp.router.expand_destination({"queue": queue})["queue"],
                           headers=dict(headers), declare=[] if queue in declared else None)
    declared.add(queue)


def direct(celery_app, producer, queue: str, headers: dict) -> Channel | None:
    """The channel to publish ``queue``'s messages with :func:`publish_one` / :func:`publish_chunk`, or None where
    only Celery's own publish sends the message it would (see the module's docstring)."""
    conf = celery_app.conf
    if (queue not in _declared_here() or "group" in headers or conf.task_compression or conf.task_send_sent_event
            or any(s.receivers for s in _SIGNALS)):
        return None
    channel = producer.channel
    if not isinstance(channel, Channel) or (channel._expires and queue in channel._expires):
        return None  # (another transport's channel: its own publish, bells or none)
    return channel


def build(celery_app, channel, name: str, task_id: str, args: tuple, kwargs: dict, queue: str, headers: dict,
          argsrepr: str, kwargsrepr: str, shadow: str | None = None) -> str:
    """kombu's JSON of the message :func:`publish_task` would publish to ``queue`` with the same arguments (its
    delivery tag aside, a new uuid each)."""
    amqp = celery_app.amqp
    headers2, properties, body, _ = amqp.create_task_message(task_id, name, args, kwargs,
                                                             reply_to=celery_app.thread_oid, argsrepr=argsrepr,
                                                             kwargsrepr=kwargsrepr, shadow=shadow)
    headers2.update(headers)
    content_type, content_encoding, data = serialization.dumps(body, serializer=celery_app.conf.task_serializer)
    mode = _modes.get(queue)
    if mode is None:  # as send_task_message picks it, then Producer.publish turns it into a number
        exchange = getattr(amqp.queues[queue], "exchange", None)
        mode = _modes[queue] = maybe_delivery_mode(getattr(exchange, "delivery_mode", None)
                                                   or celery_app.conf.task_default_delivery_mode)
    properties["delivery_mode"] = mode
    message = channel.prepare_message(data, 0, content_type, content_encoding, headers2, properties)
    channel._inplace_augment_message(message, "", queue)  # a direct queue: the anonymous exchange
    return _json(message)


def _json(message: dict) -> str:
    """kombu's JSON of ``message``, the same text, written for the half of a tiny job's publish it was: kombu's
    ``dumps`` builds an encoder per call, and the body (base64: nothing in it to escape) is most of the text."""
    body = message["body"]
    if (message["properties"].get("body_encoding") != "base64" or not isinstance(body, str)
            or next(iter(message)) != "body"):
        return dumps(message)
    try:
        rest = json.dumps({k: v for k, v in message.items() if k != "body"})  # kombu's encoder for these types
    except TypeError:  # a value only kombu's encoder writes (a datetime in a header of the caller's)
        return dumps(message)
    return '{"body": "' + body + '", ' + rest[1:]


def declare(celery_app, producer, queue: str) -> None:
    """Declare ``queue`` as Celery's first publish to it would, once per process."""
    declared = _declared_here()
    if queue not in declared:
        producer.maybe_declare(celery_app.amqp.queues[queue])
        declared.add(queue)


def publish_one(channel, queue: str, raw: str, job_id: str, sender: str) -> None:
    """Send one message built by :func:`build`, its bell and its sender's record: one script call."""
    with channel.conn_or_acquire() as client:
        script = client.__dict__.get("_gpulayer_publish")
        if script is None:
            script = client.__dict__["_gpulayer_publish"] = load_script(client, "publish")
        refresh = senders.refresh_due(sender)
        _, acked = durability.call_script(
            client, script, [queue, keys.bell(queue), keys.client_jobs(sender), keys.CLIENTS],
            [raw, job_id, time(), BELL_TOKENS, keys.SENT_KEEP_SECONDS if refresh else "", sender], channel.durability)
        if refresh:
            senders.refreshed(sender)
    durability.confirm(acked, channel.durability, "submit", (job_id,), client)


def publish_chunk(channel, queue: str, raws: Sequence[str], ids: Sequence[str], sender: str, batch_id: str) -> None:
    """Send a chunk of a batch: its messages in order, its bell, and its records (sender and batch) in one pipeline."""
    if not raws:
        return
    with channel.conn_or_acquire() as client, client.pipeline(transaction=False) as pipe:
        pipe.lpush(queue, *raws)  # pushed one after the other: taken from the other end in the same order
        bell = keys.bell(queue)
        pipe.lpush(bell, *[1] * min(len(raws), BELL_TOKENS))  # a bigger chunk wakes no more workers
        pipe.ltrim(bell, 0, BELL_TOKENS - 1)
        sent, members = keys.client_jobs(sender), keys.batch(batch_id)
        pipe.zadd(sent, dict.fromkeys(ids, time()))
        pipe.sadd(members, *ids)
        pipe.zadd(keys.BATCHES, {batch_id: time()})  # (a short id is looked up there: gpulayer/ids.py)
        pipe.expire(sent, keys.SENT_KEEP_SECONDS)
        pipe.expire(members, keys.SENT_KEEP_SECONDS)
        pipe.sadd(keys.CLIENTS, sender)
        if channel.durability:  # on the same connection: returns once a replica has the whole chunk
            pipe.execute_command(*channel.durability.command())
        acked = pipe.execute()[-1]
    durability.confirm(acked, channel.durability, "submit_batch", ids, client)
