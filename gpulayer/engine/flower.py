"""Flower's application, with an output transform of ours ahead of its own, and its broker page on a
Sentinel group.

Flower builds its Tornado application itself (``flower.app.Flower``) and offers no hook to
add a transform that runs before gzip; so its ``__init__`` is wrapped, in this process only,
to insert one first (pinned to Flower 2.2 in engine/upstream.py).

Flower's broker page and queue-length API read the queues through a client of their own, built from the
broker URL by its scheme; for a Sentinel group (:func:`broker_page_on_sentinel`) each request builds it for
the server the sentinels name as primary at that moment, so the page follows a failover (Flower 2.2's
``BaseHandler.get_broker``, patched in this process only and pinned).
"""

from __future__ import annotations

from typing import Callable

from .upstream import patch


def transform_first(make_transform: Callable[[str], type]) -> None:
    """Every Flower application built in this process runs ``make_transform(static_url_prefix)`` first."""
    from flower.app import Flower

    original = Flower.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.transforms.insert(0, make_transform(self.settings.get("static_url_prefix", "/static/")))

    patch(Flower, "flower.app:Flower.__init__", __init__)


def broker_page_on_sentinel(url: str) -> None:
    """Flower's broker page and ``/api/queues/length`` read the primary of the Sentinel group ``url`` names."""
    from flower.utils.broker import Broker
    from flower.views import BaseHandler

    from ..sentinel_url import parse_sentinel_url, primary_url
    from ..store.sentinel import primary_address

    target = parse_sentinel_url(url)

    def get_broker(self):
        host, port = primary_address(target)
        return Broker(primary_url(target, host, port), http_api=None,
                      broker_options=self.capp.conf.broker_transport_options,
                      broker_use_ssl=self.capp.conf.broker_use_ssl)

    patch(BaseHandler, "flower.views:BaseHandler.get_broker", get_broker)
