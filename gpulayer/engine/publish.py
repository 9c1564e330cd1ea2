"""Publishing ``submit`` messages as Celery's ``send_task`` builds them, without its generic work per message.

``Celery.send_task`` resolves task options, runs the router, takes a producer from the pool and declares
the queue for every message; kombu's ``Producer.publish`` then wraps each message in its retry policy,
and the transport sends it with its bell and its sender's records in a pipeline of six commands. For a
tiny job that machinery was most of a ``delay``'s CPU in the client (``benchmarks/cpu_per_job.py``).

Two ways here, for jobs gpulayer routed already:

- :func:`direct`: the message is built with Celery's ``create_task_message``, kombu's serializer and
  kombu's own ``prepare_message`` / ``_inplace_augment_message`` (the layout ``engine/envelope.py`` reads),
  then sent by this module: one job with one script call (``store/lua/publish.lua``: the message, its
  bell, who sent it), a chunk of a batch with one script call too (``store/lua/publish_chunk.lua``: its
  messages, its bell, who sent them and in which batch). Only where the
  message is the one ``send_task`` would publish: no publish signal connected, no task-sent event, no
  compression, no queue expiry, the queue declared already by this process (the first message of each
  queue goes the other way, which declares it). ``tests/test_publish.py`` compares the two messages.
- :func:`publish_task`: Celery's ``send_task_message`` (its signals, serializer and retry policy), with
  each queue declared once per process; a direct queue needs no binding on Redis (kombu publishes it to
  the anonymous exchange).

With ``durability = "replicated"`` (store/durability.py) the script call of a job or a chunk ends with ``WAIT``
on the same connection, and the call returns once a replica in sync has the job (or raises ``NotReplicated``;
or, with no replica in sync, goes on degraded). A call whose connection broke (the primary killed mid-call) is
sent again, to the primary then, unless that primary has it already (each script writes its jobs whole).

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
import redis
from kombu.utils.json import dumps

from ..store import durability, fair, keys
from ..store.in_sync import forget
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
                 headers: dict, argsrepr: str, kwargsrepr: str, shadow: str | None = None,
                 message_options: dict | None = None, send_options: dict | None = None) -> None:
    """Publish task ``name`` with ``task_id`` to ``queue`` through Celery; kombu's ``EncodeError`` passes through.

    ``shadow``: the name the job goes by in the worker's logs and events (Celery's own option; the worker
    still runs task ``name``). ``message_options``: more of ``create_task_message``'s (a retry's countdown,
    retries, canvas fields); ``send_options``: more of ``send_task_message``'s (its priority)."""
    amqp = celery_app.amqp
    declared = _declared_here()
    message = amqp.create_task_message(task_id, name, args, kwargs, reply_to=celery_app.thread_oid,
                                       argsrepr=argsrepr, kwargsrepr=kwargsrepr, shadow=shadow,
                                       **(message_options or {}))
    amqp.send_task_message(producer, name, message, queue=amqp.router.expand_destination({"queue": queue})["queue"],
                           headers=dict(headers), declare=[] if queue in declared else None, **(send_options or {}))
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


def _script(client, name: str):
    """``store/lua/<name>.lua``, registered once per client."""
    script = client.__dict__.get(f"_gpulayer_{name}")
    if script is None:
        script = client.__dict__[f"_gpulayer_{name}"] = load_script(client, name)
    return script


# A call whose connection broke may have run: its script ran whole or not at all (on the old primary and so on
# a replica it promotes), so it is sent again only where the primary now lacks what it wrote (a switch cut it,
# or the embedded Redis restarted). Each try's connect waits out a failover (engine/sentinel.py).
RESEND_ERRORS = (redis.ConnectionError, redis.TimeoutError)
TRIES = 3


def _until_landed(client, configured: durability.Durability, send, landed):
    """``send(waits)`` (a script call and its WAIT: ``(reply, acked)``), again after a broken connection unless
    ``landed()`` says the primary has it already; ``(waits, acked)`` for :func:`durability.confirm`."""
    attempt = 1
    while True:
        waits = durability.planned(configured, client)  # no replica in sync: go on without (degraded)
        try:
            if attempt > 1 and landed():  # (there now, sent before the switch: no WAIT on this connection covers it)
                return durability.NONE, None
            return waits, send(waits)[1]
        except RESEND_ERRORS:
            forget(client)  # the next try may reach another primary: read its replicas again
            if attempt == TRIES:
                raise
            attempt += 1


def publish_one(channel, queue: str, raw: str, job_id: str, sender: str) -> None:
    """Send one message built by :func:`build`, its bell and its sender's record: one script call."""
    with channel.conn_or_acquire() as client:
        script = _script(client, "publish")
        sent = keys.client_jobs(sender)

        def send(waits):
            refresh = senders.refresh_due(sender)
            out = durability.call_script(
                client, script, [fair.queue_key(client, queue, sender), keys.bell(queue), sent, keys.CLIENTS],
                [raw, job_id, time(), BELL_TOKENS, keys.SENT_KEEP_SECONDS if refresh else "", sender], waits)
            if refresh:
                senders.refreshed(sender)
            return out

        waits, acked = _until_landed(client, channel.durability, send, lambda: client.zscore(sent, job_id) is not None)
    durability.confirm(acked, waits, "submit", (job_id,), client)


def publish_chunk(channel, queue: str, raws: Sequence[str], ids: Sequence[str], sender: str, batch_id: str) -> None:
    """Send a chunk of a batch: its messages in order, its bell, and its records (sender and batch) in one script
    (``publish_chunk.lua``): a switch mid-call leaves the whole chunk or none of it, and it is sent again only
    where the new primary lacks it, so none is lost and none sent twice."""
    if not raws:
        return
    with channel.conn_or_acquire() as client:
        script = _script(client, "publish_chunk")
        members = keys.batch(batch_id)
        script_keys = [fair.queue_key(client, queue, sender), keys.bell(queue), keys.client_jobs(sender), members,
                       keys.CLIENTS, keys.BATCHES]  # (a user with a policy: its own list of the queue, store/fair.py)
        args = [len(raws), time(), BELL_TOKENS, keys.SENT_KEEP_SECONDS, sender, batch_id, *raws, *ids]
        waits, acked = _until_landed(  # WAIT on the same connection: returns once a replica has the whole chunk
            client, channel.durability, lambda w: durability.call_script(client, script, script_keys, args, w),
            lambda: bool(client.sismember(members, ids[0])))
    durability.confirm(acked, waits, "submit_batch", ids, client)
