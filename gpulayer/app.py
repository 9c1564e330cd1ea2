"""The Celery app: configuration, the signed serializer, and the router.

Celery does the messaging; gpulayer decides where each message goes. The
router asks ``placement.route`` with a registry snapshot, so ``delay``,
``apply_async``, signatures in a ``group`` and ``submit_batch`` all route the
same way.
"""

from __future__ import annotations

import difflib
import sys
import threading
import time

import redis
from celery import signals

from . import placement, queues, signing
from .engine import transport
from .engine.pools import drop_connections
from .engine.sentinel import FAILOVER_WAIT, SENTINEL_OPTION, engine_url
from .engine.celery_app import GpulayerCelery
from .engine.broadcast import Control
from .engine.senders import CLIENT_HEADER  # noqa: F401 (for tasks/submit.py)
from .config import REPLICATED, Settings, tls_options
from .deadline import Deadline
from .errors import ClusterUnavailable, JobRejected, PayloadError, UnsupportedOption
from .fairshare import Weights
from .models import Resources
from .sentinel_url import is_sentinel_url
from .store import durability, fair
from .store.connection import client_name, connect_redis
from .store.reconcile import RECONCILE_WAIT, switched_within
from .store.registry import CachedSnapshot, Registry

SUBMIT = "gpulayer.submit"
COORDINATE = "gpulayer.gang.coordinate"  # gang/coordinator.py; always to queues.CONTROL
RESOURCES_HEADER = "gl_resources"
from .engine.batches import TIMEOUT_HEADER  # noqa: E402  (a job's timeout, which the worker's reaper enforces)
ROUTES = ("gpulayer.app.route_task",)  # the app's task_routes; while they are these, submit publishes itself

signing.register_serializer()

# control: `celery inspect` and app.control.* wait for as many replies as live workers (engine/broadcast.py).
app = GpulayerCelery("gpulayer", set_as_current=False, control="gpulayer.engine.broadcast:Control")
app.conf.update(
    task_serializer=signing.NAME,
    result_serializer=signing.NAME,
    accept_content=[signing.NAME],
    result_accept_content=[signing.NAME],
    task_acks_late=True,
    # Workers take a message only when a slot is free (see gang/agent.py SlotGate),
    # so slots reserved for a gang are never eaten by buffered messages.
    worker_prefetch_multiplier=1,
    task_default_queue=queues.DEFAULT,
    task_routes=ROUTES,
    broker_connection_retry_on_startup=True,
    # A worker stores a result even if Redis restarts meanwhile: it retries until Redis is back (worker/main.py
    # turns this on). A client's reads fail at once instead, and its waiters ride out the outage with their own
    # deadline (JobHandle.get, BatchHandle.get): Celery's retries would hold a get(timeout=5) for hours.
    result_backend_always_retry=False,
    result_backend_max_retries=10_000,
    result_backend_base_sleep_between_retries_ms=20,
    result_backend_max_sleep_between_retries_ms=1000,
    # Long, so a long job is never delivered twice while it runs; dead workers'
    # messages are handed back by the janitor, not by this timeout.
    broker_transport_options={"visibility_timeout": 12 * 3600},
    worker_hijack_root_logger=False,
    # Task events and Celery's worker-heartbeat events stay off until a monitor asks (Flower broadcasts
    # enable_events; engine/events.py turns both on then) or GPULAYER_EVENTS=1: each is a PUBLISH per
    # worker whether or not anyone listens. task-sent stays off: it would add a publish per job to
    # submit_batch's pipelined sends, and task-received carries the same fields.
    worker_send_task_events=False,
    task_send_sent_event=False,
    imports=("gpulayer.tasks.submit", "gpulayer.gang.coordinator"),
)

_state = threading.local()
_lock = threading.Lock()
_settings: Settings | None = None
_identity: str | None = None  # settings.client_identity(), once per configure
_snapshot: CachedSnapshot | None = None


def configure(settings: Settings) -> None:
    """Point the app (and this process's signer) at a cluster."""
    global _settings, _snapshot, _identity
    if not settings.broker_url:
        raise ClusterUnavailable("no broker URL configured; call gpulayer.init() or set GPULAYER_BROKER_URL")
    url = settings.broker_url
    # No retry_on_timeout: kombu pipelines publishes (submit_batch) only when
    # Redis will not replay a pipeline twice.
    timeouts = {"socket_connect_timeout": settings.connect_timeout, "socket_timeout": 30.0}
    # A Sentinel group's URL reaches kombu and Celery as one they read, with the group in the transport options.
    engine, sentinel = engine_url(url)
    options = {k: v for k, v in app.conf.broker_transport_options.items() if k not in (SENTINEL_OPTION,
                                                                                      durability.OPTION)}
    # What an acknowledged write means, for the transport, the result backend and the coordinator alike.
    waits = durability.to_options(settings.durability_mode() == REPLICATED, settings.durability_timeout,
                                  settings.required_replicas())
    with _lock:
        if _settings is not None and (_settings.broker_url != url or durability.from_options(
                app.conf.broker_transport_options) != durability.from_options(waits)):
            drop_connections(app)  # (their channels hold the transport options they were made with)
        app.conf.update(
            broker_url=engine,
            # kombu's Redis transport, with takes a SIGKILL cannot lose (engine/transport.py), for
            # redis://, rediss:// and Sentinel groups alike; the URL's TLS options, as kombu and Celery's backend
            # take them.
            broker_transport=transport.transport_for(engine),
            broker_use_ssl=tls_options(url) or False,
            redis_backend_use_ssl=tls_options(url) or None,
            result_backend=f"gpulayer.engine.results:ResultBackend+{engine}",
            result_expires=settings.result_expires,
            broker_transport_options={**options, **timeouts, **sentinel, **waits},
            redis_socket_connect_timeout=settings.connect_timeout,
            redis_socket_timeout=30.0,
            worker_send_task_events=settings.events,
        )
        signing.configure(settings.secret_bytes(), settings.max_payload_bytes, **_principal(settings))
        fair.configure(settings.fair_share_half_life, Weights(  # (store/fair.py: read by takes and status)
            fair_share=settings.fair_share_weight, age=settings.fair_share_age_weight,
            priority=settings.fair_share_priority_weight, max_age=settings.fair_share_max_age))
        # Celery's own entry points (celery.result.AsyncResult(id), GroupResult.restore, signatures
        # built without an app) use the current/default app: make that this one.
        app.set_default()
        app.set_current()
        _settings = settings
        _identity = settings.client_identity()
        _snapshot = CachedSnapshot(Registry(redis_client(settings), settings.worker_dead_after),
                                   settings.registry_cache_seconds)


def _principal(settings: Settings) -> dict:
    """Who this process signs as (a user's token) and, holding the cluster secret, its view of the user table."""
    from .users.table import UsersCache
    from .users.token import Token

    token = Token.parse(settings.token.get_secret_value()) if settings.token else None
    secret = settings.secret_bytes()
    cache = UsersCache(lambda: redis_client(settings, name=_users_client_name(), one_connection=True),
                       secret) if secret else None
    return {"token": token, "users": cache}


def _users_client_name() -> str | None:
    """A worker's user-table reads show as ``gpulayer:<worker>:users`` in ``CLIENT LIST`` (one per process)."""
    from .procs.runtime import current_worker
    worker = current_worker()
    return client_name(worker.id, "users") if worker is not None else None


def settings() -> Settings | None:
    return _settings


def write_durability() -> durability.Durability:
    """What this process's acknowledged writes wait for (``durability`` setting; store/durability.py)."""
    return durability.from_options(app.conf.broker_transport_options)


def client_identity() -> str:
    """Who this process sends jobs as (config ``client_id``, default ``user@host``): `gpulayer cancel --all-mine`."""
    if _settings is None:
        raise ClusterUnavailable("gpulayer is not connected; call gpulayer.init() first")
    return _identity


def is_configured() -> bool:
    return _settings is not None


def redis_client(s: Settings | None = None, **kwargs) -> redis.Redis:
    """A new redis-py client for the cluster; ``kwargs`` go to ``store.connection.connect_redis``."""
    s = s or _settings
    if s is None or not s.broker_url:
        raise ClusterUnavailable("gpulayer is not connected; call gpulayer.init() first")
    return connect_redis(s.broker_url, socket_connect_timeout=s.connect_timeout, socket_timeout=30.0, **kwargs)


def publish_patience() -> float:
    """Seconds a ``submit`` keeps trying to publish through a lost broker: ``connect_timeout``, or on a Sentinel
    group the time a failover may take (``engine.sentinel.FAILOVER_WAIT``)."""
    s = _settings
    if s is None:
        raise ClusterUnavailable("gpulayer is not connected; call gpulayer.init() first")
    return FAILOVER_WAIT if is_sentinel_url(s.broker_url) else s.connect_timeout


def registry() -> Registry:
    if _snapshot is None:
        raise ClusterUnavailable("gpulayer is not connected; call gpulayer.init() first")
    return _snapshot.registry


def live_worker_count(fresh: bool = False) -> int | None:
    """How many workers are alive now, from the cached snapshot (``fresh``: read again); None when not connected."""
    if _snapshot is None:
        return None
    if fresh:
        _snapshot.invalidate()
    return len(_snapshot.get())


def starting_workers() -> set[str]:
    """The live workers that do not answer control broadcasts yet (store/registry.py ``starting``)."""
    return _snapshot.registry.starting() if _snapshot is not None else set()


Control.live_workers = staticmethod(live_worker_count)
Control.starting_workers = staticmethod(starting_workers)


def route_for(resources: Resources) -> placement.Route:
    """Route with the cached snapshot; on a refusal, look again at a fresh one before refusing, and right after
    a broker failover that left no worker live on the new primary, wait for their heartbeats (up to 10 s)."""
    if _snapshot is None:
        raise ClusterUnavailable("gpulayer is not connected; call gpulayer.init() first")
    try:
        return placement.route(resources, _snapshot.get())
    except JobRejected:
        _snapshot.invalidate()
        try:
            return placement.route(resources, _snapshot.get())
        except JobRejected:
            if _snapshot.get() or switched_within(_snapshot.registry.client, RECONCILE_WAIT) is None:
                raise
    # The broker just failed over and no worker shows live: their heartbeats on the new primary are as old as
    # the switch (store/reconcile.py). Each worker beats every second: wait for them rather than refuse.
    deadline = Deadline(RECONCILE_WAIT)
    while True:
        time.sleep(0.2)
        _snapshot.invalidate()
        try:
            return placement.route(resources, _snapshot.get())
        except JobRejected:
            if deadline.expired():
                raise


# Celery's builtin map forms (celery.canvas.xmap / xstarmap / chunks) and the submit methods that replace them.
_CELERY_MAP_FORMS = {"celery.map": "xmap", "celery.starmap": "xstarmap", "celery.chunks": "chunks"}


def route_task(name, args, kwargs, options, task=None, **kw):
    """Celery router: gpulayer jobs go where ``placement.route`` says, or to the ``queue=`` they name.

    A named queue must be one that live workers read (and, with ``resources=``, whose readers
    satisfy them); options the broker cannot honour as given are refused, never dropped.
    """
    # Celery routes its map forms by the inner task's name (route_name): look at the task being sent.
    builtin = getattr(task, "name", name)
    if builtin in _CELERY_MAP_FORMS:
        raise PayloadError(f"Celery's {_CELERY_MAP_FORMS[builtin]}(submit.s(fn), ...) would call submit inside one worker "
                           "process, outside gpulayer's routing and slots, so gpulayer does not send it; use "
                           "submit.map(fn, items), submit.starmap(fn, items) or submit.chunks(fn, items, n), which "
                           "run as gpulayer jobs")
    if name == COORDINATE:
        return {"queue": queues.CONTROL}  # served by every worker's control consumer, outside its job slots
    if name != SUBMIT:
        return None
    spec = (options.get("headers") or {}).get(RESOURCES_HEADER)
    res = Resources(**spec) if spec else Resources()
    _check_priority(options.get("priority"))
    serializer = options.get("serializer")
    if serializer not in (None, signing.NAME):
        if _in_celery_command():  # `celery call gpulayer.submit`: its --serializer defaults to json
            raise _one_line(f"gpulayer.submit runs only messages signed by gpulayer, and `celery call` sends "
                            f"{serializer}: add --serializer {signing.NAME}, with a 'pkg.mod:fn' reference as the "
                            f"first of --args, e.g. celery -A gpulayer.app call gpulayer.submit --serializer "
                            f"{signing.NAME} --args '[\"os:getcwd\"]'")
        raise UnsupportedOption(f"serializer={serializer!r}: workers accept only gpulayer's signed serializer "
                                f"({signing.NAME!r}), so the job would never run; drop serializer=")
    fn = args[0] if args else None
    if fn is None or isinstance(fn, str):  # by name (send_task, `celery call`): the function is the first arg
        from .payload import check_function

        try:
            if fn is None:
                raise PayloadError("gpulayer.submit needs the function to run as its first argument: "
                                   "a 'pkg.mod:fn' reference when sent by name")
            check_function(fn)
        except PayloadError as err:
            raise _one_line(str(err)) if _in_celery_command() else err
    given = options.get("queue")
    queue = getattr(given, "name", given) if given is not None else route_for(res).queue
    if given is not None:
        check_queue(queue, res)
    for opt in ("exchange", "routing_key"):  # Celery would publish with these and Redis drop what no queue binds
        value = options.get(opt)
        value = getattr(value, "name", value)
        if value not in (None, "", queue):
            raise UnsupportedOption(f"{opt}={value!r}: gpulayer sends each job to one queue (here {queue!r}), "
                                    f"and a different {opt} would bind it to none, losing it; drop {opt}= "
                                    "(name a queue with queue= if you must)")
    return None if given is not None else {"queue": queue}


def _in_celery_command() -> bool:
    """Is this router running inside Celery's command line (``celery call``), a click command?"""
    click = sys.modules.get("click")
    return click is not None and click.get_current_context(silent=True) is not None


def _one_line(message: str):
    """An error Celery's command line prints as one line (click's ``Error: ...``), not as a traceback."""
    return sys.modules["click"].ClickException(message)


def _check_priority(priority) -> None:
    """Redis keeps a priority as one list per step (kombu's ``priority_steps``); gpulayer's transport serves the
    highest step first and the base list (no priority, or 0) last, as gangs' priorities go (higher wins)."""
    if priority is None:
        return
    from kombu.transport.redis import PRIORITY_STEPS

    steps = list((app.conf.broker_transport_options or {}).get("priority_steps") or PRIORITY_STEPS)
    if isinstance(priority, bool) or not isinstance(priority, int) or priority not in steps:
        raise UnsupportedOption(
            f"priority={priority!r}: the Redis broker keeps priorities {', '.join(map(str, steps))} (higher runs "
            f"first), and would run any other value as the step below it; pass one of {steps}")


def queues_read(workers) -> dict[str, list[str]]:
    """Every queue the ``workers`` read -> the ids of the workers reading it."""
    out: dict[str, list[str]] = {}
    for w in workers:
        for q in queues.for_worker(w.id, w.gpus, w.zone, w.region):
            out.setdefault(q, []).append(w.id)
    return out


def check_queue(queue: str, res: Resources) -> None:
    """Refuse ``queue=`` unless a live worker reads it (and meets ``res``); name the queues that exist."""
    if _snapshot is None:
        raise ClusterUnavailable("gpulayer is not connected; call gpulayer.init() first")
    read = queues_read(_snapshot.get())
    if queue not in read:  # look again at a fresh snapshot before refusing
        _snapshot.invalidate()
        read = queues_read(_snapshot.get())
    if queue not in read:
        shared = sorted(q for q in read if not q.startswith(queues.private("")))
        owners = sorted({w for q, ws in read.items() if q.startswith(queues.private("")) for w in ws})
        close = difflib.get_close_matches(queue, list(read), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        private = f"; and each worker's own {queues.private('<worker id>')} ({', '.join(owners[:6])}" \
                  f"{' and more' if len(owners) > 6 else ''})" if owners else ""
        raise JobRejected(f"no live worker reads queue {queue!r}{hint}, so the job would never run; the queues live "
                          f"workers read: {', '.join(shared) or 'none'}{private}; drop queue= to let gpulayer "
                          "route by resources=, or start a worker that reads it")
    if res != Resources():
        readers = [w for w in _snapshot.get() if w.id in read[queue]]
        try:
            placement.eligible_workers(res, readers)
        except JobRejected as err:
            raise JobRejected(f"queue {queue!r} is read by {', '.join(read[queue])}, but {err}") from err


def _configure_for_celery_command() -> None:
    """``celery -A gpulayer.app inspect|events|...``: the cluster from GPULAYER_* or ``gpulayer up``'s state file.

    An operator's ``celery`` command imports this module and nothing else; without the
    cluster's broker and secret it could neither connect nor read the signed replies.
    """
    import os
    import sys

    from .config import load_settings

    prog = sys.argv[0] if sys.argv else ""
    if os.path.basename(prog) not in ("celery", "celery.exe") and not prog.endswith(os.path.join("celery", "__main__.py")):
        return
    settings = load_settings()
    if not settings.broker_url or not settings.secret:
        raise SystemExit("gpulayer: no cluster to talk to: set GPULAYER_BROKER_URL and GPULAYER_SECRET to the "
                         "cluster's Redis URL and secret, or start one with `gpulayer up` (its state file "
                         "names both)")
    configure(settings)


@signals.celeryd_init.connect
def _refuse_plain_celery_worker(**_) -> None:
    """``celery -A gpulayer.app worker`` lacks the slots, heartbeat, janitor and atomic takes; refuse it."""
    from .procs import runtime

    if runtime.current_worker() is None:  # `gpulayer worker` installs its identity before starting Celery's
        raise SystemExit("gpulayer's workers start with `gpulayer worker` (it registers the worker's "
                         "capabilities, slots and heartbeat): run `gpulayer worker --broker URL [--zone Z]` "
                         "instead of `celery -A gpulayer.app worker`")


_configure_for_celery_command()
