"""The ``apply_async`` options a ``submit`` job honours; any other is refused, naming the one meant.

Celery passes options it does not know to kombu as message properties, where the Redis transport drops
them: ``apply_async(..., retries=3)`` ran once and said nothing. A job's options are checked here once
gpulayer's own (``gl_*``, the retry options of gpulayer/retries.py) are taken out; options kombu or Celery
would honour on Redis go on to Celery (the router refuses the values it cannot honour: a priority Redis
does not keep, another serializer, an exchange or routing key binding no queue).
"""

from __future__ import annotations

import difflib

from ..errors import UnsupportedOption
from ..retries import OPTIONS as RETRY_OPTIONS

# Celery's meanings, honoured through Celery's own send (Task.apply_async, send_task, send_task_message,
# kombu's Producer.publish); tests/test_retries.py checks each is a parameter there.
CELERY = frozenset({
    "task_id", "countdown", "eta", "expires", "priority", "queue", "exchange", "routing_key", "serializer",
    "compression", "headers", "link", "link_error", "shadow", "producer", "connection", "publisher",
    "add_to_parent", "ignore_result", "time_limit", "soft_time_limit", "retry", "retry_policy", "argsrepr",
    "kwargsrepr", "group_id", "group_index", "chord", "chain", "root_id", "parent_id", "reply_to",
    "replaced_task_nesting", "origin", "stamped_headers", "route_name", "task_type", "result_cls", "router",
})
# Celery's canvas internals that reach apply_async (stamping, chords) without being parameters of it.
CANVAS = frozenset({"stamps"})

# What a name not honoured was likely meant as (beyond difflib's close matches) ...
MEANT = {
    "retries": "max_retries (Celery's retries= is the count of retries made so far, not a limit)",
    "num_retries": "max_retries", "max_retry": "max_retries", "attempts": "max_retries",
    "max_attempts": "max_retries (retries after the first try: one less)", "retry_on": "autoretry_for",
    "retry_for": "autoretry_for", "backoff": "retry_backoff", "jitter": "retry_jitter",
    "timeout": "the job's timeout, given with its arguments: submit.delay(fn, x, timeout=5) or "
               "apply_async((fn, x), {'timeout': 5})",
    "resources": "resources given with the job's arguments: submit.delay(fn, x, resources=...) or "
                 "apply_async((fn, x), {'resources': ...})",
    "callbacks": "link", "errbacks": "link_error",
    "expiration": "expires (kombu's expiration is a broker TTL the Redis transport does not keep)",
}
# ... or why it means nothing here.
MOOT = {
    "delivery_mode": "a message on Redis lasts as Redis's own persistence does",
    "mandatory": "an AMQP flag the Redis transport does not keep",
    "immediate": "an AMQP flag the Redis transport does not keep",
    "confirm_timeout": "publisher confirms are AMQP's; the Redis transport has none",
    "content_type": "workers accept only gpulayer's signed serializer",
    "content_encoding": "workers accept only gpulayer's signed serializer",
}

KNOWN = CELERY | CANVAS | frozenset(RETRY_OPTIONS)


def check(options: dict) -> None:
    """Refuse any option in ``options`` that a ``submit`` job would not honour (``UnsupportedOption``)."""
    stamped = options.get("stamped_headers") or ()
    unknown = [name for name in options if name not in KNOWN and name not in stamped
               and not name.startswith("gl_")]
    if unknown:
        raise refusal(unknown[0], options[unknown[0]])


def refusal(name: str, value) -> UnsupportedOption:
    if name in MOOT:
        hint = f"; {MOOT[name]}: drop {name}="
    else:
        meant = MEANT.get(name)
        if meant is None:
            close = difflib.get_close_matches(name, sorted(KNOWN - CANVAS), n=1, cutoff=0.75)
            meant = close[0] if close else None
        hint = f"; did you mean {meant}?" if meant else f"; drop {name}="
    return UnsupportedOption(f"{name}={value!r} is not an option gpulayer honours for a job: it would be dropped "
                             f"without a word{hint} (docs/JOBS.md: 'Retries, and the options a job takes')")
