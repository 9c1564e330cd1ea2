"""Every place gpulayer overrides, copies or patches a private part of Celery, kombu, Flower or redis-py.

- ``transport.py``: kombu's Redis transport with takes a SIGKILL cannot lose, batched, prefetched
  and carrying the acks (the Channel's ``_put``, ``_do_restore_message``, ``_brpop_start``,
  ``_brpop_read``, ``close``; its QoS's ``append``, ``ack``, ``can_consume``).
- ``results.py``: Celery's Redis result backend, stored once, failures as ``JobFailed``.
- ``request.py``: the worker's request (bounded redelivery) and its "received" log line.
- ``events.py``: Celery's monitoring events, off until a monitor asks (``enable_events``), then paced.
- ``control.py``: remote control (``celery inspect``) that waits for as many replies as live workers.
- ``qos.py``: the slot gate (may a message start now, may a take bring more), asked by the transport's QoS, and
  the worker's requests as Celery's worker state keeps them.
- ``envelope.py``: a kombu message's layout; ``delivery.py``: kombu's unacked deliveries (the janitor's side).
- ``connections.py``: forgetting a Celery app's pooled connections.
- ``flower.py``: a transform of ours ahead of Flower's own.
- ``redis_tls.py``: redis-py's TLS connection with one SSLContext per process, installed into
  ``store.connection.connect_redis``.
- ``upstream.py``: each upstream method the above depend on, with the hash of its source for the
  pinned versions; ``tests/test_engine_contract.py`` fails, naming it, when upstream changes one.

Nothing outside this package overrides, patches or reads Celery, kombu, Flower or redis-py internals
(``tests/test_engine_contract.py`` checks that too). Submodules are imported where used:
this ``__init__`` imports none of them.
"""
