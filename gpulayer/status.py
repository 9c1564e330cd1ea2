"""``gpulayer status``: the fleet as the registry and the queues see it."""

from __future__ import annotations

from urllib.parse import urlparse

from . import app as app_mod
from . import queues
from .client import ensure_connected
from .store.gangs import GangStore


def mask_url(url: str) -> str:
    """The broker URL with its password hidden."""
    u = urlparse(url)
    if u.password:
        netloc = f"{u.username or ''}:***@{u.hostname}" + (f":{u.port}" if u.port else "")
        return u._replace(netloc=netloc).geturl()
    return url


def collect() -> dict:
    """Live workers and queue lengths, as plain data (what ``--json`` prints)."""
    ensure_connected()
    workers = app_mod.registry().snapshot()
    names = sorted({q for w in workers for q in queues.for_worker(w.id, w.gpus, w.zone, w.region)})
    client = app_mod.redis_client()
    pipe = client.pipeline(transaction=False)
    for q in names:
        pipe.llen(q)
    lengths = dict(zip(names, pipe.execute()))
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
        "gangs": [
            {"id": g["gang_id"], "name": g.get("spec", {}).get("name"), "state": g["state"], "reason": g["reason"],
             "nodes": g.get("spec", {}).get("nodes"), "procs_per_node": g.get("spec", {}).get("procs_per_node"),
             "workers": (g.get("placement") or {}).get("workers", []), "attempt": g["attempt"]}
            for g in gangs
        ],
    }


def render(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"broker {report['broker']}")
    t = Table(title=f"{len(report['workers'])} live workers")
    for col in ("worker", "address", "zone", "region", "cuda", "slots used/total", "heartbeat"):
        t.add_column(col)
    for w in report["workers"]:
        cuda = f"{w['gpus']} x {w['gpu_names'][0]}" if w["gpus"] else "-"
        t.add_row(w["id"], w["address"], w["zone"] or "-", w["region"] or "-", cuda,
                  f"{w['busy'] + w['held']}/{w['slots']}" + (f" ({w['held']} gang)" if w["held"] else ""),
                  f"{w['heartbeat_age']:.1f}s ago")
    console.print(t)
    q = Table(title="queues")
    q.add_column("queue")
    q.add_column("waiting", justify="right")
    for name, n in sorted(report["queues"].items()):
        q.add_row(name, str(n))
    console.print(q)
    if report["gangs"]:
        g = Table(title="distributed jobs")
        for col in ("id", "function", "shape", "state", "workers", "why"):
            g.add_column(col)
        for job in report["gangs"]:
            g.add_row(job["id"][:12], job["name"] or "-", f"{job['nodes']} x {job['procs_per_node']}", job["state"],
                      ", ".join(job["workers"]) or "-", job["reason"])
        console.print(g)
