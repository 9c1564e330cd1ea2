"""Publishing a task message as Celery's ``send_task`` builds it, without its generic work per message.

``Celery.send_task`` resolves task options, runs the router, takes a producer from the pool and declares
the queue for every message. For ``submit``, routed by gpulayer already, that is a third of a ``delay``'s
CPU in the client (``benchmarks/throughput.py``). ``publish_task`` builds the same message with the same
public AMQP calls (``create_task_message``, then ``send_task_message``: its signals, serializer and retry
policy) and declares each queue once per process; a direct queue needs no binding on Redis (kombu
publishes it to the anonymous exchange). That the two messages stay the same is what engine/upstream.py
pins (``Celery.send_task``, ``AMQP._create_task_sender``).
"""

from __future__ import annotations

import os

_declared: tuple[int, set[str]] = (0, set())  # (pid, queues this process declared): kombu declares per message


def publish_task(celery_app, producer, name: str, task_id: str, args: tuple, kwargs: dict, queue: str,
                 headers: dict, argsrepr: str, kwargsrepr: str, shadow: str | None = None) -> None:
    """Publish task ``name`` with ``task_id`` to ``queue``; kombu's ``EncodeError`` passes through.

    ``shadow``: the name the job goes by in the worker's logs and events (Celery's own option; the worker
    still runs task ``name``)."""
    global _declared
    amqp = celery_app.amqp
    pid, declared = _declared
    if pid != os.getpid():
        _declared = pid, declared = os.getpid(), set()
    message = amqp.create_task_message(task_id, name, args, kwargs, reply_to=celery_app.thread_oid,
                                       argsrepr=argsrepr, kwargsrepr=kwargsrepr, shadow=shadow)
    amqp.send_task_message(producer, name, message, queue=amqp.router.expand_destination({"queue": queue})["queue"],
                           headers=dict(headers), declare=[] if queue in declared else None)
    declared.add(queue)
