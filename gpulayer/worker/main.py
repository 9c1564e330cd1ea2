"""``gpulayer worker``: a Celery worker that advertises what it can do and serves exactly that."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from urllib.parse import urlparse

from celery.signals import worker_process_init, worker_ready

# What registering takes (the app, the registry, the previous life's records); the bootsteps, the engine's
# overrides and Celery's worker load in _start, after the worker is in the registry.
from ..app import app, configure, redis_client
from ..config import load_settings
from ..errors import ClusterUnavailable, ConfigError
from ..gang.coordinator import forget_previous_life
from ..masking import mask_logs, mask_url, secrets_of
from ..sentinel_url import broker_hosts, is_loopback
from ..models import WorkerInfo
from ..procs import ready
from ..procs.stop import die_with_parent
from ..procs.tempdir import remove_made_here
from ..store import keys
from ..store.connection import client_name
from ..store.registry import Registry
from ..procs import runtime
from .detect import default_address, detect_gpus
from .early import beat_early, stop_early
from .starting import answer_then_preload
from .janitor import hand_back_lives


def default_worker_id(gpus: int, zone: str | None, host: str) -> str:
    """``cuda-europe-west1-b-host1``: what it is, where, on which host."""
    parts = ["cuda" if gpus else "cpu"] + ([zone] if zone else []) + [host.split(".")[0]]
    return "-".join(parts)


def _check_name_free(registry: Registry, worker_id: str, host: str) -> None:
    for w in registry.snapshot():
        if w.id == worker_id:
            if w.hostname == host and not runtime.pid_alive(w.pid):
                return  # our own previous life on this machine, killed: we take over its name and messages
            raise ConfigError(f"a live worker is already called {worker_id!r} (pid {w.pid} on {w.hostname}, "
                              f"heard from {w.heartbeat_age:.1f}s ago); give this one another --name")



@worker_process_init.connect
def _die_with_worker(**_) -> None:
    """A pool process dies with its worker: an orphan would finish a job the janitor already requeued."""
    from .wake import forget_in_child

    die_with_parent()
    ready.close()  # the worker's, not ours
    forget_in_child()


@worker_ready.connect
def _answer_then_preload(sender=None, **_) -> None:
    """Celery's consumer runs: once this worker hears its own control cast, say so, then preload torch (starting.py).

    torch is preloaded so that every pool process forks with it loaded instead of importing it per job;
    importing does not initialise CUDA (that would not survive the fork); GPULAYER_PRELOAD= (empty) skips it.
    """
    info = runtime.current_worker()
    if sender is None or info is None or runtime.registry is None:  # not a gpulayer worker
        ready.tell(ready.CONSUMING, last=True)
        return
    answer_then_preload(sender, runtime.registry, info.id)


# Celery's loggers of a line per job: "received" (the strategy, in this process) and "succeeded" (the tracer, in
# the pool's processes, forked after this). Their failures, retries and losses log at WARNING and above.
JOB_LOGGERS = ("celery.worker.strategy", "celery.app.trace")


def quiet_job_lines(log_jobs: bool) -> None:
    """Unless asked (``--log-jobs``, ``GPULAYER_LOG_JOBS``, or ``--loglevel DEBUG``), no INFO line per job: at
    1,000 tiny jobs a second that is 2,000 lines a second, and 7-8% of the job path's CPU. Celery reads the
    level once, as it builds each task's strategy and tracer, so this runs before the worker starts."""
    if log_jobs or logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
        return
    for name in JOB_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def run_worker(*, broker: str | None = None, slots: int | None = None, zone: str | None = None,
               region: str | None = None, name: str | None = None, cuda: str = "auto",
               advertise_addr: str | None = None, loglevel: str = "INFO", insecure: bool = False,
               log_jobs: bool | None = None) -> int:
    ready.adopt()  # the pipe of whoever started this worker, if it handed one down
    settings = load_settings(broker_url=broker)
    if not settings.broker_url:
        raise ConfigError("no broker: pass --broker redis://:PASSWORD@HOST:6379/0 or set GPULAYER_BROKER_URL")
    if not settings.secret:
        raise ConfigError("no cluster secret: set GPULAYER_SECRET to the same value on every machine "
                          "(`gpulayer up` writes one to its state file)")
    if not insecure and not is_loopback(settings.broker_url) and not urlparse(settings.broker_url).password:
        raise ConfigError(f"the broker {', '.join(broker_hosts(settings.broker_url))} is beyond loopback and has no "
                          "password: anyone who can reach it could queue work; set requirepass on Redis and put "
                          "the password in the URL, or pass --insecure if the network is yours alone")
    if slots is not None and slots < 1:
        raise ConfigError(f"--slots must be at least 1, not {slots}")
    gpu_ids, gpu_names = detect_gpus(cuda)
    host = socket.gethostname()
    worker_id = name or default_worker_id(len(gpu_ids), zone, host)
    address = advertise_addr or ("127.0.0.1" if is_loopback(settings.broker_url) else default_address())
    slots = slots or (len(gpu_ids) or os.cpu_count() or 1)

    # Slots share the cores: one job's math must not oversubscribe them (OpenMP
    # threads spinning against each other make small ops 10x slower), as torchrun does.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // slots)))

    configure(settings)
    # Each connection says whose it is in CLIENT LIST: kombu's (tasks, control) and the result backend's too.
    app.conf.broker_transport_options = {**app.conf.broker_transport_options,
                                         "client_name": client_name(worker_id, "celery")}
    app.conf.redis_client_name = client_name(worker_id, "results")
    app.conf.result_backend_always_retry = True  # results are stored through a Redis restart (app.py)
    # The worker's one connection for short commands: registry checks and the janitor (the heartbeat has its own).
    client = redis_client(name=client_name(worker_id, "worker"), one_connection=True)
    try:
        client.ping()
    except Exception as err:
        raise ClusterUnavailable(f"cannot reach the broker at {', '.join(broker_hosts(settings.broker_url))}: "
                                 f"{mask_url(str(err))}; "
                                 "check --broker / GPULAYER_BROKER_URL and that Redis is running") from err
    registry = Registry(client, settings.worker_dead_after)
    _check_name_free(registry, worker_id, host)
    # Messages a previous life of this worker still held go back to their queues now.
    hand_back_lives(app, client, worker_id, "the worker restarted", settings.max_deliveries,
                    keep=keys.life(worker_id, os.getpid()))
    forget_previous_life(client, worker_id)  # its gang nodes fail; gangs placed from now on are this life's

    info = WorkerInfo(id=worker_id, hostname=host, address=address, zone=zone, region=region,
                      gpus=len(gpu_ids), gpu_names=tuple(gpu_names), slots=slots, pid=os.getpid(),
                      started_at=time.time())
    runtime.install(info, gpu_ids)
    # Registered before torch is imported: jobs routed here wait in its queues for the seconds that takes, and
    # whoever started the worker (`gpulayer up`) hears it is in the fleet now.
    registry.mark_starting(worker_id, os.getpid())  # before it is live: a broadcast waits for it (starting.py)
    beat_early(registry, info, settings.heartbeat_interval)
    ready.tell(ready.REGISTERED)
    try:
        return _start(settings, registry, worker_id, host, gpu_ids, zone, region, slots, loglevel, log_jobs)
    finally:
        if stop_early():  # the Heartbeat step never took over: the worker did not start
            try:
                registry.remove(worker_id)
            except Exception:  # noqa: BLE001  (Redis gone: the record ages out as a dead worker's)
                pass


def _start(settings, registry: Registry, worker_id: str, host: str, gpu_ids: list[int], zone: str | None,
           region: str | None, slots: int, loglevel: str, log_jobs: bool | None) -> int:
    """Import torch, add gpulayer's steps and run Celery's worker (the worker is registered); once it has stopped,
    the process ends (``exit_at_once``)."""
    from .. import queues
    from ..engine import request as job_request
    from ..engine import pool_stop, respawn, revoke
    from ..users import permits
    from ..engine.batches import PoolBatches
    from ..engine.events import EventPacer
    from ..engine.transport import consume_as
    from ..gang.agent import GangAgent, SlotGate
    from ..gang.consumer import ControlStep
    from ..masking import mask_logs, secrets_of
    from ..objects import s3_helper
    from .heartbeat import Heartbeat
    from .janitor import Janitor
    from .object_sweep import ObjectSweep
    from . import reaper
    from .reaper import Reaper
    from .wake import WakeOnSignal

    consume_as(worker_id)  # take messages atomically, recorded under this life of the worker
    # This process forks pool processes all along: its own S3 requests (the object sweep's) go to a helper
    # process, so obstore's runtime, which a fork does not copy, never starts here (objects/s3_helper.py).
    s3_helper.forking_process()
    runtime.registry = registry
    app.steps["worker"].add(Heartbeat)
    app.steps["worker"].add(GangAgent)
    app.steps["worker"].add(ControlStep)  # the coordinator's queue, served outside the job slots
    app.steps["worker"].add(Janitor)
    app.steps["worker"].add(ObjectSweep)  # the janitor's round over the object store, in its own thread
    app.steps["worker"].add(Reaper)
    app.steps["worker"].add(WakeOnSignal)  # SIGTERM starts the warm shutdown at once
    app.steps["consumer"].add(SlotGate)
    app.steps["consumer"].add(EventPacer)
    app.steps["consumer"].add(PoolBatches)  # several tiny jobs to a pool process at once, under a backlog
    job_request.install(app, stopped_by_reaper=reaper.stopped, worker_settings=settings)  # jobs logged by their summary; successes stored with their acks
    from ..tasks.submit import with_shipped_code

    job_request.code_scope = with_shipped_code  # a job's shipped code on sys.path (workspace/cache.py)

    worker = app.Worker(
        hostname=f"{worker_id}@{host}",
        queues=queues.for_worker(worker_id, len(gpu_ids), zone, region),
        concurrency=slots,
        pool="prefork",
        loglevel=loglevel,
        optimization="fair",
        without_mingle=True,
        without_gossip=True,
        # The pool restarts once, after torch is preloaded (starting.py); `celery control pool_restart` stays
        # refused (that reads the app's worker_pool_restarts, still False).
        pool_restarts=True,
        # A CUDA job gets a fresh process, so CUDA_VISIBLE_DEVICES takes effect
        # before anything initialises CUDA.
        max_tasks_per_child=1 if gpu_ids else None,
    )
    quiet_job_lines(settings.log_jobs if log_jobs is None else log_jobs)
    # Celery set up its log handlers as it built the worker; the pool's processes inherit them, filters and all.
    mask_logs(secrets_of(settings.broker_url, settings.secret.get_secret_value()))
    respawn.install()  # last before the pool forks: a killed job's process is replaced in milliseconds
    # A revoke(terminate=True) is told by the worker that holds the job; a user's, only for its own jobs.
    revoke.install(refusal=permits.refusal)
    pool_stop.install()  # a stopping worker's pool ends once its jobs are done, without billiard's exit sleeps
    worker.start()
    exit_at_once(worker.exitcode or 0)


def exit_at_once(code: int) -> None:
    """End the worker's process as soon as Celery's worker has stopped.

    By then its jobs have finished, its messages are acknowledged or handed back, its steps have stopped (the
    gang agent its ranks and warm template) and it has left the registry. What the interpreter would do next
    keeps nothing and took 1-2 s on a 2-core machine, which `gpulayer down` waited for: billiard's exit hook
    joining the idle pool processes, then the collection of a heap with torch in it. The logs are flushed
    first; the pool processes die with the worker (``die_with_parent``).
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    remove_made_here()  # multiprocessing's pymp-* directory, which the interpreter's exit would have removed
    os._exit(code)
