"""Retries of a job whose function raised: the per-call options, and the policy that travels with the job.

Celery's names and meanings (its task options ``autoretry_for``, ``dont_autoretry_for``, ``max_retries``,
``retry_kwargs``, ``retry_backoff``, ``retry_backoff_max``, ``retry_jitter``, ``default_retry_delay``), given
per call to ``submit.apply_async``, ``.set(...)`` or ``submit_batch``; Ray's ``retry_exceptions`` is taken as
another spelling of ``autoretry_for``:

- ``autoretry_for``: the exception types that send the job again (a type or a tuple; subclasses count),
  except those in ``dont_autoretry_for``. ``retry_exceptions=True`` is any ``Exception``, a list is the
  same as ``autoretry_for``.
- ``max_retries``: retries after the first try (``3``: four tries at most); ``None`` (Ray's ``-1``) is no
  limit, as in Celery; ``0`` none. With ``autoretry_for`` and no ``max_retries``, Celery's default of 3; ``retry_kwargs=
  {"max_retries": 5, "countdown": 2}`` as in Celery (its ``max_retries`` wins).
  ``max_retries`` without ``autoretry_for`` is refused: in Celery it only limits ``self.retry()``, which a
  plain function has not, and in Ray it limits the reruns after a worker dies, which gpulayer makes for
  every job anyway (``max_deliveries``); retrying every error unasked would rerun bugs.
- ``retry_backoff``: ``True`` (1 s) or the seconds of the first delay; each next retry waits twice as
  long, up to ``retry_backoff_max`` (600 s); ``retry_jitter`` (on by default) picks each delay at random
  between 0 and that. Without it each retry waits the fixed ``retry_kwargs["countdown"]`` or
  ``default_retry_delay``, and by default not at all (Celery would wait its ``default_retry_delay`` of
  180 s; Ray does not wait).

A policy is a plain dict in the job's ``gl_retry`` header, so any worker can apply it, and it carries what
the tries so far raised, so the last one can name them all. Pure: no Redis, no Celery.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from .errors import UnsupportedOption, tries_text  # noqa: F401  (tries_text: the final error's words)

HEADER = "gl_retry"  # the policy a job travels with (tasks/retry.py reads it on the worker)
OPTIONS = ("max_retries", "autoretry_for", "dont_autoretry_for", "retry_exceptions", "retry_kwargs", "retry_backoff",
           "retry_backoff_max", "retry_jitter", "default_retry_delay")
DEFAULT_MAX_RETRIES = 3  # Celery's Task.max_retries, and Ray's max_retries for tasks
BACKOFF_MAX = 600.0  # Celery's retry_backoff_max
TRIES_KEPT = 20  # a job retried without limit names its first tries and its last ones, this many in all
_NEVER = "celery.exceptions.TaskPredicate"  # Celery's Retry, Ignore, Reject: instructions, not errors
_UNSET = object()


def take(options: dict) -> dict | None:
    """Pop the retry options out of ``options`` (an ``apply_async``'s); the policy for the job's header, or None.

    >>> take({"max_retries": 2, "autoretry_for": (ConnectionError,)})["on"]
    ['builtins.ConnectionError']
    """
    given = {name: options.pop(name) for name in OPTIONS if name in options}
    return policy(**given) if given else None


def policy(*, max_retries=_UNSET, autoretry_for=None, dont_autoretry_for=None, retry_exceptions=None,
           retry_kwargs=None, retry_backoff=False, retry_backoff_max=BACKOFF_MAX, retry_jitter=True,
           default_retry_delay=None) -> dict | None:
    """The header value for these options (Celery's meanings, see the module's docstring); None when no retry
    can happen (``max_retries=0``, ``autoretry_for=()``). Bad values raise ``UnsupportedOption`` naming the fix."""
    if autoretry_for is not None and retry_exceptions is not None:
        raise UnsupportedOption("autoretry_for= and retry_exceptions= both name the errors to retry (Celery's and "
                                "Ray's spelling); give one of them")
    if retry_exceptions is not None:
        autoretry_for = (Exception,) if retry_exceptions is True else () if retry_exceptions is False \
            else retry_exceptions
    countdown = default_retry_delay
    if retry_kwargs is not None:  # Celery's retry_kwargs: what autoretry passes to self.retry()
        if not isinstance(retry_kwargs, dict) or set(retry_kwargs) - {"max_retries", "countdown"}:
            raise UnsupportedOption(f"retry_kwargs={retry_kwargs!r}: gpulayer takes max_retries and countdown "
                                    "there (as Celery's self.retry() does); give the others as options of their own")
        max_retries = retry_kwargs.get("max_retries", max_retries)
        countdown = retry_kwargs.get("countdown", countdown)
    if max_retries == -1 and not isinstance(max_retries, bool):
        max_retries = None  # Ray's spelling of no limit
    names = _type_names(autoretry_for, "autoretry_for")
    if not names:
        if autoretry_for is None and max_retries != 0:
            given = "max_retries" if max_retries is not _UNSET else "these options"
            raise UnsupportedOption(
                f"{given} without autoretry_for retries nothing (in Celery max_retries limits self.retry(), in Ray "
                "the reruns after a worker dies, which gpulayer makes anyway, up to max_deliveries): name the "
                "errors that send the job again, e.g. autoretry_for=(ConnectionError,), or retry_exceptions=True "
                "for any")
        return None  # autoretry_for=() / retry_exceptions=False / max_retries=0: no retries, as asked
    if max_retries is _UNSET:
        max_retries = DEFAULT_MAX_RETRIES
    if max_retries is not None and (isinstance(max_retries, bool) or not isinstance(max_retries, int)
                                    or max_retries < 0):
        raise UnsupportedOption(f"max_retries={max_retries!r}: give the number of retries after the first try "
                                "(0 or more), or None (or Ray's -1) for no limit")
    if max_retries == 0:
        return None
    base = _backoff(retry_backoff)
    fixed = _seconds(countdown or 0, "countdown" if retry_kwargs and "countdown" in retry_kwargs
                     else "default_retry_delay")
    cap = _seconds(retry_backoff_max, "retry_backoff_max")
    if not isinstance(retry_jitter, bool):
        raise UnsupportedOption(f"retry_jitter={retry_jitter!r}: give True or False")
    return {"max": max_retries, "on": names, "not": _type_names(dont_autoretry_for, "dont_autoretry_for"),
            "backoff": base, "backoff_max": cap, "jitter": retry_jitter, "fixed": fixed, "count": 0, "tries": []}


def for_explicit() -> dict:
    """The policy of a job sent without retry options that calls Celery's ``self.retry()``: Celery's 3 retries,
    no error retried by itself, no delay unless the call gives a countdown."""
    return {"max": DEFAULT_MAX_RETRIES, "on": [], "not": [], "backoff": 0.0, "backoff_max": BACKOFF_MAX,
            "jitter": True, "fixed": 0.0, "count": 0, "tries": []}


def _seconds(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise UnsupportedOption(f"{name}={value!r}: give a number of seconds, 0 or more")
    return float(value)


def _backoff(value) -> float:
    if value is True:
        return 1.0
    if value is False or value is None:
        return 0.0
    if isinstance(value, (int, float)) and value > 0:
        return float(value)
    raise UnsupportedOption(f"retry_backoff={value!r}: give True (1 s, doubling each retry), the first delay in "
                            "seconds, or False for none")


def _type_names(types, name: str) -> list[str]:
    """``autoretry_for`` as the names a worker compares with an error's classes (``module.QualName``)."""
    if types is None:
        return []
    if isinstance(types, type):
        types = (types,)
    if isinstance(types, (str, bytes)) or not isinstance(types, Iterable):
        raise UnsupportedOption(f"{name}={types!r}: give exception types, e.g. (ConnectionError, TimeoutError)")
    names = []
    for t in types:
        if not (isinstance(t, type) and issubclass(t, Exception)):
            raise UnsupportedOption(f"{name}: {t!r} is not an Exception type; give exception classes, "
                                    "e.g. (ConnectionError, TimeoutError)")
        names.append(class_name(t))
    return names


def class_name(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"


def applies(policy: dict, exc: BaseException) -> bool:
    """Does ``exc`` send the job again? One of its classes is in ``autoretry_for`` and none in
    ``dont_autoretry_for``, and retries are left (never Celery's Retry, Ignore or Reject)."""
    limit = policy["max"]
    if limit is not None and policy["count"] >= limit:  # (count: the tries before this one)
        return False
    classes = {class_name(c) for c in type(exc).__mro__}
    return (not classes.isdisjoint(policy["on"]) and classes.isdisjoint(policy.get("not") or ())
            and _NEVER not in classes)


def delay(policy: dict, retry: int, rand: random.Random | None = None) -> float:
    """Seconds before retry number ``retry`` (1 for the first): with ``retry_backoff``, ``backoff * 2 ** (retry -
    1)``, at most ``backoff_max``, and with jitter a uniform pick between 0 and that (Celery's "full jitter");
    else the fixed delay (``retry_kwargs={"countdown": ...}`` or ``default_retry_delay``), 0 by default."""
    base = policy["backoff"]
    if not base:
        return policy.get("fixed", 0.0)
    cap = min(policy["backoff_max"], base * 2 ** (retry - 1))
    return (rand or random).uniform(0, cap) if policy["jitter"] else cap


def describe(exc, worker: str | None) -> str:
    """One try's outcome, as the final error lists it: ``ConnectionError('refused') on w-1``. ``exc``: the
    exception, or the form a result backend stores it in (``{"exc_type": ..., "exc_message": (args)}``)."""
    if isinstance(exc, dict) and "exc_type" in exc:
        args = exc.get("exc_message")
        args = args if isinstance(args, (list, tuple)) else (args,)
        text = f"{exc['exc_type']}({', '.join(map(repr, args))})"
    else:
        text = repr(exc)
    if len(text) > 200:
        text = text[:199] + "…"
    return f"{text} on {worker or '?'}"


def after_try(policy: dict, outcome: str) -> dict:
    """The policy for the next try: this one's ``outcome`` added to the tries (at most ``TRIES_KEPT`` kept:
    the first ones and the last ones)."""
    tries = list(policy["tries"]) + [outcome]
    if len(tries) > TRIES_KEPT:
        tries = tries[:TRIES_KEPT // 2] + tries[-(TRIES_KEPT // 2):]
    return {**policy, "tries": tries, "count": policy["count"] + 1}
