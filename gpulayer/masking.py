"""Secrets out of sight: the one way gpulayer shows a URL or a text that may carry a password.

Everything a user is shown (``Settings``' repr, error messages, ``gpulayer up`` and ``gpulayer status``,
Flower's pages) passes a URL through :func:`mask_url`, or a whole text through :func:`mask_text`; a
worker's log lines pass :class:`MaskingFilter` (:func:`mask_logs`). The connections themselves use the
URL as it was given.

>>> mask_url("redis://:pw@10.0.0.1:6379/0")
'redis://:***@10.0.0.1:6379/0'
>>> mask_text("cannot reach rediss://u:pw@h:6380/0 (refused); key s3cr3t", ["s3cr3t"])
'cannot reach rediss://u:***@h:6380/0 (refused); key ***'
>>> mask_url("sentinel://:pw@10.0.0.1:26379,10.0.0.2:26379/gpulayer?sentinel_password=spw")
'sentinel://:***@10.0.0.1:26379,10.0.0.2:26379/gpulayer?sentinel_password=***'
"""

from __future__ import annotations

import logging
import re
from typing import Iterable
from urllib.parse import parse_qsl, urlsplit

MASK = "***"
# scheme://user:PASSWORD@ -- the password ends at the @ (a literal @ or / in it is percent-encoded in a URL).
URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.\-]*://[^:/@\s\"'<>]*:)[^@/\s\"'<>]+@", re.IGNORECASE)
# A Sentinel URL's query carries the sentinels' own password (sentinel_url.py): ?sentinel_password=PASSWORD&...
QUERY_PASSWORD = re.compile(r"(?P<head>[?&]sentinel_password=)[^&#\s\"'<>]+", re.IGNORECASE)


def _mask_urls(text: str) -> str:
    text = URL_PASSWORD.sub(lambda m: m.group("head") + MASK + "@", text)
    return QUERY_PASSWORD.sub(lambda m: m.group("head") + MASK, text)


def mask_url(url: str | None) -> str | None:
    """``url`` with the passwords in it (``scheme://user:PASSWORD@host``, and a Sentinel URL's
    ``?sentinel_password=PASSWORD``) replaced by ``***``; None stays None."""
    return None if url is None else _mask_urls(url)


def mask_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with each of ``secrets`` and every password inside a URL replaced by ``***``.

    ``secrets``: longest first when one contains another (``monitor.py`` sorts them).
    """
    for s in secrets:
        text = text.replace(s, MASK)
    return _mask_urls(text)


def secrets_of(broker_url: str | None, secret: str | None) -> list[str]:
    """The cluster's secrets to mask wherever they turn up: the broker's passwords (a Sentinel group's sentinels
    have their own) and the cluster secret.

    Longest first, so a secret that contains another is masked whole; short ones (under 4 characters)
    would mask too much and are left to the URL pattern.
    """
    try:
        parts = urlsplit(broker_url or "")
        password = parts.password
        sentinels = dict(parse_qsl(parts.query)).get("sentinel_password")
    except ValueError:
        password = sentinels = None
    return sorted({s for s in (password, sentinels, secret) if s and len(s) >= 4}, key=len, reverse=True)


class MaskingFilter(logging.Filter):
    """A handler filter: each record's message, traceback and stack with ``secrets`` and URL passwords masked."""

    def __init__(self, secrets: Iterable[str] = ()):
        super().__init__()
        self.secrets = list(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
            masked = mask_text(message, self.secrets)
            if masked != message:
                record.msg, record.args = masked, None
            if record.exc_info and not record.exc_text:  # formatted now, so the handler prints the masked text
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = mask_text(record.exc_text, self.secrets)
            if record.stack_info:
                record.stack_info = mask_text(record.stack_info, self.secrets)
        except Exception:  # a record that cannot be formatted is the handler's to report, as without us
            pass
        return True


def mask_logs(secrets: Iterable[str] = (), loggers: Iterable[str] = ("", "celery.task")) -> None:
    """Put a :class:`MaskingFilter` on every handler of ``loggers`` (the root logger and Celery's task logger:
    records of every other logger reach the root's handlers), once per handler."""
    secrets = list(secrets)
    for name in loggers:
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, MaskingFilter) for f in handler.filters):
                handler.addFilter(MaskingFilter(secrets))
