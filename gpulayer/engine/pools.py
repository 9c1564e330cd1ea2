"""Forget a Celery app's pooled broker connections, producers and result backend.

Celery has no public call for "point this app at another broker": it resets the same
attributes itself after a fork (``Celery._after_fork``), and builds them again lazily
(``Celery.pool``, ``AMQP.producer_pool``, ``Celery._backend``); pinned to Celery 5.7 in
engine/upstream.py.
"""

from __future__ import annotations

import threading

from kombu import pools as kombu_pools


def drop_connections(app) -> None:
    """Forget pooled connections and the result backend before pointing ``app`` at another Redis."""
    kombu_pools.reset()  # closes and forgets every pooled connection and producer
    app._pool = None
    app.amqp._producer_pool = None
    app._backend_cache = None
    app._local = threading.local()
