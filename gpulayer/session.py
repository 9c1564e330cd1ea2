"""This process's connection to a cluster: ``connect``, ``init`` and ``ensure_connected``, and what a call
says when it loses it (``BROKER_ERRORS``, ``outage``, ``broker_lost``).

Below both the client API (``client.py``) and the tasks (``tasks/submit.py``), which connect
on first use: neither imports the other for it.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import threading
from typing import Callable

from kombu.exceptions import OperationalError

from . import app as app_mod
from .config import Settings, home_dir, load_settings
from .deadline import Deadline
from .errors import ClusterUnavailable, ConfigError
from .store.broker_loss import LOST, PATIENCE, Outage, unavailable
from .store.connection import reachable

# A lost or refused broker connection as redis-py raises it, and as kombu (a publish) wraps it.
BROKER_ERRORS: tuple[type[BaseException], ...] = (*LOST, OperationalError)

_init_lock = threading.RLock()
_local = None  # the process-scoped embedded cluster init() started, if any
_exit_hooked = False


def _no_last_collection() -> None:
    """At exit, move the heap to the collector's permanent generation (``gc.freeze``): the interpreter's last
    collection then walks nothing. A script that imported Celery, kombu, redis-py and pydantic spent 0.1 s
    (0.5 s on a busy 2-core machine) after its last line in that walk, which frees nothing a process about to
    exit needs freed (Python never promised ``__del__`` at exit); 0.01 s without it."""
    gc.freeze()


def connect(settings: Settings) -> Settings:
    """Point this process at the cluster ``settings`` names; fail fast if Redis is unreachable."""
    reachable(settings.broker_url, settings.connect_timeout).close()
    if not settings.secret and not settings.token:
        raise ConfigError("no cluster secret: set GPULAYER_TOKEN to the token `gpulayer users add` printed "
                          "for you, or GPULAYER_SECRET to the secret the workers use (`gpulayer up` writes one "
                          "to its state file)")
    app_mod.configure(settings)
    from .workspace import shipping

    shipping.connected()  # the archives of the user's code go to this cluster's Redis too
    for module in app_mod.app.conf.imports:  # gpulayer's tasks, registered for senders by name, as a worker has them
        importlib.import_module(module)
    global _exit_hooked
    if not _exit_hooked:
        atexit.register(_no_last_collection)
        _exit_hooked = True
    return settings


def init(broker_url: str | None = None, *, secret: str | None = None, workers: int | None = None,
         slots: int | None = None, replicas: int = 0, sentinels: int = 0,
         log_to_client: bool | None = None, working_dir=None, py_modules=None, excludes=None,
         runtime_env: dict | None = None) -> Settings:
    """Connect to a cluster, starting an embedded one if none is configured.

    In order: ``broker_url`` / ``GPULAYER_BROKER_URL`` / the config file; else a
    running ``gpulayer up`` cluster; else a new embedded cluster (Redis and
    ``workers`` local workers) that lives as long as this process. ``replicas`` and ``sentinels``: that
    embedded cluster's Redis is a Sentinel group (``gpulayer.init(replicas=1, sentinels=3)``).
    ``log_to_client=False``: the jobs' output lines are not printed here as they come (each job keeps
    them: ``handle.logs()``, `gpulayer logs ID`); default ``GPULAYER_LOG_TO_CLIENT``, on.

    The user's code travels with every job this process sends (``gpulayer/workspace/``): by default the
    ``*.py`` files of the script's directory and of its packages; ``working_dir`` ships that directory instead (every file not
    excluded; ``False``: none), ``py_modules`` more modules or packages (names or paths), ``excludes``
    gitignore-style patterns to leave out (``runtime_env={"working_dir": ...}``, Ray's spelling, works too).
    Workers unpack it once per content and put it first on ``sys.path``.
    """
    global _local
    from .workspace import shipping

    shipping.configure(working_dir, py_modules, excludes, runtime_env)
    with _init_lock:
        settings = load_settings(broker_url=broker_url, secret=secret, log_to_client=log_to_client)
        if settings.broker_url and not settings.broker_from_state:
            return connect(settings)
        if settings.broker_from_state:
            try:
                return connect(settings)
            except ClusterUnavailable:
                pass  # a stale state file: the `gpulayer up` cluster is gone
        if _local is None:
            from .local import start_for_process

            _local = start_for_process(workers=workers, slots=slots, replicas=replicas, sentinels=sentinels)
        return connect(load_settings(broker_url=_local.broker_url, secret=_local.secret,
                                     log_to_client=log_to_client))


def ensure_connected() -> None:
    """Connect as ``init()`` does, unless this process is connected already (the API calls this first)."""
    if not app_mod.is_configured():
        init()


def embedded_note() -> str | None:
    """The embedded cluster's account of why it stopped on its own, if this process uses one that did."""
    from .local.supervisor import stopped_note

    settings = app_mod.settings()
    home = _local.home if _local is not None else home_dir() if settings and settings.broker_from_state else None
    return stopped_note(home) if home is not None else None


def broker_lost(err: BaseException | None, in_flight: str | None = None,
                lost_for: float | None = None) -> ClusterUnavailable:
    """``ClusterUnavailable`` for this process's broker: its URL (masked), ``in_flight``, and what to do."""
    if isinstance(err, ClusterUnavailable):
        return err
    settings = app_mod.settings()
    return unavailable(settings.broker_url if settings else None, err, in_flight, lost_for, embedded_note())


def outage(deadline: Deadline | None = None, in_flight: Callable[[], str | None] | str | None = None,
           patience: float = PATIENCE) -> Outage:
    """A waiter's :class:`~gpulayer.store.broker_loss.Outage` of this process's broker: it rides out a broker
    restart for up to ``patience`` seconds, never past ``deadline``, then raises ``broker_lost``'s error."""
    settings = app_mod.settings()
    return Outage(settings.broker_url if settings else None, deadline, in_flight, patience, embedded_note)
