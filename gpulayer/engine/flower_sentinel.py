"""Flower's broker page on a Sentinel group.

Flower's broker page and queue-length API read the queues through a client of their own, built from the
broker URL by its scheme (``flower.utils.broker.Broker``); kombu is given a URL naming the group, not a
server (engine/sentinel.py), so for a Sentinel broker each request builds that client for the server the
sentinels name as primary at that moment, and the page follows a failover. Patches Flower 2.2's
``BaseHandler.get_broker`` in this process only (pinned in engine/upstream.py).
"""

from __future__ import annotations

from .upstream import patch


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
