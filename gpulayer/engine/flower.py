"""Flower's application, with an output transform of ours ahead of its own.

Flower builds its Tornado application itself (``flower.app.Flower``) and offers no hook to
add a transform that runs before gzip; so its ``__init__`` is wrapped, in this process only,
to insert one first (pinned to Flower 2.2 in engine/upstream.py).
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
