"""Monitoring: Flower on gpulayer's Celery app, and Prometheus metrics of queues and slots.

Flower needs the cluster secret to read the workers' signed replies, so it runs
as ``gpulayer flower`` (this module), never as a bare ``celery flower``. Every
page and API answer it serves passes through a filter that masks the broker
password and the cluster secret, wherever they turn up (a worker's config, a
task's arguments, a URL); the static files it ships pass untouched.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from .errors import ConfigError
from .sentinel_url import is_sentinel_url
from .sentinel_url import is_loopback_host
from .masking import MASK, mask_text, secrets_of  # noqa: F401  (MASK, mask_text: the tests' import)

log = logging.getLogger(__name__)


# --- Flower ----------------------------------------------------------------------------------------

def _secrets_of(settings) -> list[str]:
    return secrets_of(settings.broker_url, settings.secret.get_secret_value() if settings.secret else None)


# The Tasks page shows each job's summary (args: ``square(7)``) and its resources (kwargs: ``cpu``);
# Flower's default columns hide both.
TASKS_COLUMNS = "name,uuid,state,args,kwargs,result,received,runtime,worker"

# Content types a page or an API answer has; anything else (images, fonts, archives) passes untouched.
_TEXT_TYPES = ("text/", "application/json", "application/javascript", "application/xml", "application/xhtml+xml")


def _masking_transform(secrets: list[str], static_prefix: str):
    """A Tornado output transform that masks ``secrets`` in Flower's pages and API answers.

    Static files (under ``static_prefix``) are the package's own and cannot carry a secret, and Tornado
    sends them in 64 KiB chunks under the file's full Content-Length: they pass untouched. A masked
    answer is held until its last chunk (Flower writes each in one piece) so a secret split across two
    chunks is still masked, and Content-Length then counts the masked bytes.
    """
    from tornado.web import OutputTransform

    def mask(body: bytes) -> bytes:
        return mask_text(body.decode("utf-8", "surrogateescape"), secrets).encode("utf-8", "surrogateescape")

    class MaskSecrets(OutputTransform):
        def __init__(self, request):
            super().__init__(request)
            self._static = request.path.startswith(static_prefix)
            self._held: list[bytes] | None = None  # None: this response passes untouched

        def transform_first_chunk(self, status_code, headers, chunk, finishing):
            ctype = headers.get("Content-Type", "").split(";")[0].strip().lower()
            if self._static or not ctype.startswith(_TEXT_TYPES):
                return status_code, headers, chunk
            self._held = []
            if finishing:
                chunk = mask(chunk)
                if "Content-Length" in headers:
                    headers["Content-Length"] = str(len(chunk))
                return status_code, headers, chunk
            headers.pop("Content-Length", None)  # the masked length is known only at the end: send chunked
            return status_code, headers, self.transform_chunk(chunk, finishing)

        def transform_chunk(self, chunk, finishing):
            if self._held is None:
                return chunk
            self._held.append(chunk)
            if not finishing:
                return b""
            body, self._held = b"".join(self._held), []
            return mask(body)

    return MaskSecrets


def _passwords(basic_auth: str) -> list[str]:
    """The passwords of Flower's ``--basic-auth`` (``user:password[,user:password...]``)."""
    return [entry.partition(":")[2] for entry in basic_auth.split(",")]


def run_flower(*, broker: str | None = None, port: int = 5555, address: str = "127.0.0.1",
               basic_auth: str | None = None, show_secrets: bool = False) -> int:
    """``gpulayer flower``: Flower behind a login, its pages and its API alike.

    The login is ``basic_auth`` (``--basic-auth``), else ``FLOWER_BASIC_AUTH``, else one made up here as
    ``gpulayer up --flower`` makes its own (the local user's name and a random password); its URL with the
    login in it is printed first, the password masked unless ``show_secrets``. Beyond loopback, a login must
    be given.
    """
    from . import app as app_mod
    from .session import init
    from .engine.flower import extend
    from .flower_pages import pages, script_transform
    from .local.workers import flower_line, new_flower_login

    basic_auth = basic_auth or os.environ.get("FLOWER_BASIC_AUTH")
    if not is_loopback_host(address) and not basic_auth:
        raise ConfigError(f"Flower bound to {address} would be open to the network: pass --basic-auth user:password "
                          "(or set FLOWER_BASIC_AUTH), or bind to 127.0.0.1")
    if basic_auth and ":" not in basic_auth:
        raise ConfigError("--basic-auth must be user:password")
    # Flower's API answers only behind a login (without one it refuses everyone: FLOWER_UNAUTHENTICATED_API); the
    # local user gets one printed, as `gpulayer up --flower` prints its own.
    basic_auth = basic_auth or new_flower_login()
    settings = init(broker, log_to_client=False)  # jobs sent from its API print nowhere here: their tails keep them
    # Flower names the broker by its URL's scheme to list queues; it takes no jobs, so kombu's own
    # Redis transport serves it (gpulayer/engine/transport.py only changes how workers take messages).
    # A Sentinel group's URL stays on gpulayer's transport: kombu's own would look for a host named after the group.
    if not is_sentinel_url(settings.broker_url):
        app_mod.app.conf.broker_transport = None
    else:
        from .engine.flower_sentinel import broker_page_on_sentinel

        broker_page_on_sentinel(settings.broker_url)
    secrets = _secrets_of(settings)
    # Flower's own login, wherever a page might show it
    secrets = sorted({*secrets, *(p for p in _passwords(basic_auth) if len(p) >= 4)}, key=len, reverse=True)
    # Masking last of ours (it sees what the script tag added), both before gzip; then gpulayer's pages.
    extend(lambda url_prefix, static_prefix: [script_transform(url_prefix, static_prefix),
                                              _masking_transform(secrets, static_prefix)], pages())
    argv = ["flower", f"--port={port}", f"--address={address}"]
    if "FLOWER_TASKS_COLUMNS" not in os.environ:  # an operator's choice wins (argv would override it)
        argv.append(f"--tasks_columns={TASKS_COLUMNS}")
    os.environ["FLOWER_BASIC_AUTH"] = basic_auth  # not in argv, where `ps` would show it
    host = f"[{address}]" if ":" in address else address
    print(flower_line(f"http://{host}:{port}/", basic_auth.split(",")[0], show_secrets), flush=True)
    # Workers send events only once a monitor asks; Flower asks every 5 s from 5 s on: ask now, so the
    # jobs of its first seconds show too (engine/events.py). Not held for workers still starting (a broadcast
    # waits for them, engine/broadcast.py): Flower's own asking reaches them.
    app_mod.app.control.enable_events(wait_starting=False)
    ask_heartbeats(app_mod.app.control)
    app_mod.app.start(argv)
    return 0


HEARTBEAT_ASKS = (0.25, 0.25, 0.5, 1.0, 2.0, 4.0)  # seconds before each ask, from Flower's start


def ask_heartbeats(control, delays=HEARTBEAT_ASKS) -> threading.Thread:
    """Ask every worker for a heartbeat event now and then while Flower starts, from a thread.

    Flower lists a worker once it hears an event from it, and its event receiver connects after the workers
    that run already sent their `worker-online`: without this, each is missing from Flower until its next
    heartbeat event, up to 2 s later (what `gpulayer up --flower` waited for)."""
    def ask():
        for delay in delays:
            time.sleep(delay)
            try:
                control.heartbeat()
            except Exception as err:  # noqa: BLE001  (the broker away: Flower's own heartbeats come anyway)
                log.debug("gpulayer: asking the workers for a heartbeat failed (%s)", err)

    thread = threading.Thread(target=ask, name="gpulayer-flower-heartbeats", daemon=True)
    thread.start()
    return thread


# --- Prometheus metrics ----------------------------------------------------------------------------

def metric_families(report: dict) -> list:
    """``gpulayer status``'s report as Prometheus metric families."""
    from prometheus_client.core import GaugeMetricFamily

    live = GaugeMetricFamily("gpulayer_workers_live", "Workers heard from within the liveness window")
    live.add_metric([], len(report["workers"]))
    slots = GaugeMetricFamily("gpulayer_worker_slots", "Job slots a worker has",
                              labels=["worker", "zone", "region", "cuda"])
    busy = GaugeMetricFamily("gpulayer_worker_busy_slots", "Slots running ordinary jobs", labels=["worker"])
    held = GaugeMetricFamily("gpulayer_worker_held_slots", "Slots reserved by distributed jobs", labels=["worker"])
    gpus = GaugeMetricFamily("gpulayer_worker_gpus", "GPUs a worker serves", labels=["worker"])
    age = GaugeMetricFamily("gpulayer_worker_heartbeat_age_seconds", "Seconds since the worker's last heartbeat",
                            labels=["worker"])
    for w in report["workers"]:
        slots.add_metric([w["id"], w["zone"] or "", w["region"] or "", "true" if w["cuda"] else "false"], w["slots"])
        busy.add_metric([w["id"]], w["busy"])
        held.add_metric([w["id"]], w["held"])
        gpus.add_metric([w["id"]], w["gpus"])
        age.add_metric([w["id"]], w["heartbeat_age"])
    queue = GaugeMetricFamily("gpulayer_queue_length", "Jobs waiting in a queue", labels=["queue"])
    for name, n in sorted(report["queues"].items()):
        queue.add_metric([name], n)
    gangs = GaugeMetricFamily("gpulayer_gangs", "Distributed jobs not yet finished, by state", labels=["state"])
    counts = {"waiting": 0, "running": 0}
    for g in report["gangs"]:
        counts[g["state"]] = counts.get(g["state"], 0) + 1
    for state, n in sorted(counts.items()):
        gangs.add_metric([state], n)
    return [live, slots, busy, held, gpus, age, queue, gangs]


class _FleetCollector:
    """Reads the registry and queues at each scrape (a scrape costs a few Redis round trips)."""

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        from .status import collect

        started = time.perf_counter()
        families = metric_families(collect())
        took = GaugeMetricFamily("gpulayer_scrape_seconds", "Time to read the cluster state for this scrape")
        took.add_metric([], time.perf_counter() - started)
        return [*families, took]


def metrics_registry():
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_FleetCollector())
    return registry


def metrics_text() -> str:
    """The current metrics in Prometheus's text format."""
    from prometheus_client import generate_latest

    return generate_latest(metrics_registry()).decode()


def serve_metrics(*, broker: str | None = None, port: int = 9808, address: str = "127.0.0.1") -> int:
    """``gpulayer metrics``: serve ``/metrics`` until Ctrl-C."""
    from prometheus_client import start_http_server

    from .session import connect
    from .config import load_settings
    from .errors import ClusterUnavailable

    settings = load_settings(broker_url=broker)
    if not settings.broker_url:
        raise ClusterUnavailable("no cluster to watch: pass --broker or set GPULAYER_BROKER_URL (and "
                                 "GPULAYER_SECRET), or start one with `gpulayer up`")
    connect(settings)
    server, thread = start_http_server(port, addr=address, registry=metrics_registry())
    print(f"serving Prometheus metrics at http://{address}:{port}/metrics", flush=True)
    try:
        while thread.is_alive():
            thread.join(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0
