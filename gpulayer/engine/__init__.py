"""Every place gpulayer overrides, copies, patches or reads a private part of Celery, kombu, Flower or redis-py.

- ``transport.py``: kombu's Redis transport with takes a SIGKILL cannot lose (the Channel's ``_put``,
  ``_do_restore_message``, ``_brpop_start``, ``_brpop_read``, ``close``), with
  ``prefetch.py`` (messages taken ahead of free slots: delivered one by one, given back to a gang),
  ``carry.py`` (the acks and results a take carries), ``bells.py`` (waking idle takers) and
  ``takeover.py`` (what a reconnect dropped goes back).
- ``qos.py``: the transport's QoS (its ``append``, ``ack``, ``can_consume``), the slot gate it asks, and the
  worker's requests as Celery's worker state keeps them.
- ``envelope.py``: a kombu message's layout; ``delivery.py``: kombu's unacked deliveries (the janitor's side).
- ``redis_tls.py``: redis-py's TLS connection with one SSLContext per process.
- ``results.py``: Celery's Redis result backend, stored once, failures as ``JobFailed``.
- ``request.py``: the worker's request (bounded redelivery) and its "received" log line; the worker hands it
  the reaper's record of stopped jobs and its settings at ``install``.
- ``batches.py``: several tiny jobs to one pool process in one exchange, under a backlog (billiard's apply
  collected, Celery's per-request semaphore left to the slot gate).
- ``events.py``: Celery's monitoring events, off until a monitor asks (``enable_events``), then paced.
- ``broadcast.py``: remote control (``celery inspect``, ``ping``) answered as soon as every live worker has,
  by a starting worker too.
- ``revoke.py``: a ``revoke(terminate=True)`` told only by the worker that runs the job.
- ``respawn.py``: a dead pool process replaced at once.
- ``loop.py``: a cheaper turn of the worker's event loop.
- ``pool_stop.py``: a stopping worker's prefork pool ended once its jobs are done (no exit sleeps).
- ``pools.py``: forgetting a Celery app's pooled connections, producers and result backend.
- ``celery_app.py``: gpulayer's Celery app class, with a cheaper clock.
- ``publish.py``: ``submit`` messages built as ``send_task`` builds them, sent one script call or pipeline per chunk.
- ``senders.py``: who sent which job, recorded as it is published (``gpulayer cancel``).
- ``sentinel.py``: kombu's transport and Celery's result backend on a Sentinel group; ``flower_sentinel.py``:
  Flower's broker page on one.
- ``flower.py``: a transform of ours ahead of Flower's own.
- ``upstream.py``: each upstream method or attribute the above depend on, with the hash of its source for the
  pinned versions; ``tests/test_engine_contract.py`` fails, naming it, when upstream changes one.

Nothing outside this package overrides, patches or reads Celery, kombu, Flower or redis-py internals
(``tests/test_engine_contract.py`` checks that too). Submodules are imported where used:
this ``__init__`` imports none of them.
"""
