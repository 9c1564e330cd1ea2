"""``gpulayer status``: the fleet as the registry and the queues see it."""

from __future__ import annotations

from urllib.parse import urlparse

from . import app as app_mod
from .client import connect
from .config import load_settings
from .errors import ClusterUnavailable, ConfigError
from .store import keys
from .store.gangs import GangStore


def mask_url(url: str) -> str:
    """The broker URL with its password hidden."""
    u = urlparse(url)
    if u.password:
        netloc = f"{u.username or ''}:***@{u.hostname}" + (f":{u.port}" if u.port else "")
        return u._replace(netloc=netloc).geturl()
    return url


def _connect() -> None:
    """Connect to the configured cluster; never start one just to describe it."""
    if app_mod.is_configured():
        return
    settings = load_settings()
    if not settings.broker_url:
        raise ClusterUnavailable("no cluster to show: set GPULAYER_BROKER_URL (and GPULAYER_SECRET), "
                                 "or start one with `gpulayer up`")
    connect(settings)


def collect() -> dict:
    """Live workers and queue lengths, as plain data (what ``--json`` prints)."""
    _connect()
    workers = app_mod.registry().snapshot()
    read = app_mod.queues_read(workers)
    client = app_mod.redis_client()
    lengths = queue_lengths(client, read)
    gangs = GangStore(client).active()
    held = GangStore(client).held()
    client.close()
    return {
        "broker": mask_url(app_mod.settings().broker_url),
        "workers": [
            {"id": w.id, "address": w.address, "hostname": w.hostname, "zone": w.zone, "region": w.region,
             "cuda": w.cuda, "gpus": w.gpus, "gpu_names": list(w.gpu_names), "slots": w.slots, "busy": w.busy,
             "held": held.get(w.id, 0), "heartbeat_age": round(w.heartbeat_age, 2), "pid": w.pid}
            for w in workers
        ],
        "queues": lengths,
        "unread_queues": sorted(q for q, n in lengths.items() if n and q not in read),
        "gangs": [
            {"id": g["gang_id"], "name": g.get("spec", {}).get("name"), "state": g["state"], "reason": g["reason"],
             "nodes": g.get("spec", {}).get("nodes"), "procs_per_node": g.get("spec", {}).get("procs_per_node"),
             "workers": (g.get("placement") or {}).get("workers", []), "attempt": g["attempt"]}
            for g in gangs
        ],
    }


# Lists in Redis that are not queues: gpulayer's own keys, and Celery's result backend (chord parts).
_NOT_QUEUES = (f"{keys.NAMESPACE}:", "celery-task", "chord-unlock", "_kombu.")


def queue_lengths(client, read) -> dict[str, int]:
    """Messages waiting per queue: every queue live workers read, and every other queue holding messages.

    A queue is a Redis list (kombu's, one more list per priority step, ``<queue>\\x06\\x16<step>``);
    finding the ones nobody reads costs one SCAN over the keyspace, in large steps.
    """
    sep = "\x06\x16"
    found = set()
    for raw in client.scan_iter(count=10_000, _type="list"):
        name = raw.decode(errors="replace")
        if not name.startswith(_NOT_QUEUES):
            found.add(name)
    names = sorted(set(read) | {n.split(sep, 1)[0] for n in found})
    lists = [(q, q) for q in names] + [(n.split(sep, 1)[0], n) for n in sorted(found) if sep in n]
    pipe = client.pipeline(transaction=False)
    for _, key in lists:
        pipe.llen(key)
    lengths = dict.fromkeys(names, 0)
    for (q, _), n in zip(lists, pipe.execute()):
        lengths[q] += int(n)
    return {q: n for q, n in lengths.items() if q in read or n}


def renderables(report: dict) -> list:
    """The report as rich tables: workers, queues, distributed jobs."""
    from rich.table import Table
    from rich.text import Text

    out: list = [Text(f"broker {report['broker']}")]
    t = Table(title=f"{len(report['workers'])} live workers")
    for col in ("worker", "address", "zone", "region", "cuda", "slots used/total", "heartbeat"):
        t.add_column(col)
    for w in report["workers"]:
        cuda = f"{w['gpus']} x {w['gpu_names'][0]}" if w["gpus"] else "-"
        t.add_row(w["id"], w["address"], w["zone"] or "-", w["region"] or "-", cuda,
                  f"{w['busy'] + w['held']}/{w['slots']}" + (f" ({w['held']} gang)" if w["held"] else ""),
                  f"{w['heartbeat_age']:.1f}s ago")
    out.append(t)
    q = Table(title="queues")
    q.add_column("queue")
    q.add_column("waiting", justify="right")
    q.add_column("")
    unread = set(report.get("unread_queues", ()))
    for name, n in sorted(report["queues"].items()):
        q.add_row(name, str(n), Text("nobody reads this queue", style="red") if name in unread else "")
    out.append(q)
    if report["gangs"]:
        g = Table(title="distributed jobs")
        for col in ("id", "function", "shape", "state", "workers", "why"):
            g.add_column(col)
        for job in report["gangs"]:
            g.add_row(job["id"][:12], job["name"] or "-", f"{job['nodes']} x {job['procs_per_node']}", job["state"],
                      ", ".join(job["workers"]) or "-", job["reason"])
        out.append(g)
    return out


def render(report: dict) -> None:
    from rich.console import Console

    console = Console()
    for item in renderables(report):
        console.print(item)


def watch(every: float = 2.0, as_json: bool = False) -> int:
    """Redraw the report every ``every`` seconds until Ctrl-C (``as_json``: one JSON line per refresh)."""
    import json
    import time

    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    if every <= 0:
        raise ConfigError(f"--watch takes a positive number of seconds, not {every}")
    try:
        if as_json:
            while True:
                print(json.dumps(collect()), flush=True)
                time.sleep(every)
        with Live(refresh_per_second=4, screen=False, auto_refresh=False) as live:
            while True:
                stamp = Text(f"{time.strftime('%H:%M:%S')}  every {every:g}s, Ctrl-C to stop", style="dim")
                live.update(Group(stamp, *renderables(collect())), refresh=True)
                time.sleep(every)
    except KeyboardInterrupt:
        return 0
