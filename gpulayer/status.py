"""``gpulayer status``: the fleet as the registry and the queues see it."""

from __future__ import annotations

import heapq
import sys

from . import fairshare, queues
from .config import Settings, home_dir, load_settings
from .errors import ClusterUnavailable, ConfigError
from .masking import mask_url
from .sentinel_url import is_sentinel_url, parse_sentinel_url
from .store.replication import describe as describe_replication, replication
from .store import fair, keys
from .store.broker_loss import LOST, unavailable
from .store.connection import reachable
from .store.gangs import GangStore
from .store.registry import Registry


_standalone: tuple[Settings, Registry] | None = None  # this process's own read of the cluster (a --watch keeps it)


def _cluster() -> tuple[Settings, Registry]:
    """The cluster to describe and its registry; never start one just to describe it.

    A process connected already (``gpulayer.init()``) is described through its connection.
    Otherwise only Redis is opened: status needs neither the Celery app nor the cluster
    secret, so ``gpulayer status`` starts without importing them.
    """
    global _standalone
    app_mod = sys.modules.get("gpulayer.app")
    if app_mod is not None and app_mod.is_configured():
        return app_mod.settings(), app_mod.registry()
    if _standalone is None:
        settings = load_settings()
        if not settings.broker_url:
            note = _embedded_note(settings)  # it names the fix itself
            raise ClusterUnavailable(f"no cluster to show; {note}" if note else
                                     "no cluster to show: set GPULAYER_BROKER_URL, or start one with `gpulayer up`")
        try:
            client = reachable(settings.broker_url, settings.connect_timeout, socket_timeout=30.0)
        except ClusterUnavailable as err:
            note = _embedded_note(settings)
            raise ClusterUnavailable(f"{err}; {note}" if note else str(err)) from err.__cause__
        _standalone = settings, Registry(client, settings.worker_dead_after)
    return _standalone


def _embedded_note(settings: Settings) -> str | None:
    """Why the embedded cluster stopped on its own, when the cluster to show is (or was) the embedded one."""
    session = sys.modules.get("gpulayer.session")
    if session is not None and sys.modules["gpulayer.app"].is_configured():
        return session.embedded_note()
    if settings.broker_url and not settings.broker_from_state:
        return None
    from .local.supervisor import stopped_note

    return stopped_note(home_dir())


def _broker_restarts(client) -> dict | None:
    """How often the embedded cluster's supervisor restarted its Redis (``keys.LOCAL_REDIS``); None: never."""
    import json

    raw = client.hgetall(keys.LOCAL_REDIS)
    record = {k.decode(): json.loads(v) for k, v in raw.items()}
    return record if record.get("restarts") else None


def _replication(settings: Settings, client) -> dict | None:
    """A Sentinel group's primary and replicas, with their lag; None for a redis:// broker."""
    if not is_sentinel_url(settings.broker_url):
        return None
    report = replication(client, parse_sentinel_url(settings.broker_url).service)
    report["durability"] = settings.durability_mode()
    report["min_replicas"] = settings.required_replicas()
    # No replica in sync and none required: writes go on acknowledged by the primary alone (store/durability.py).
    report["degraded"] = report["durability"] == "replicated" and not report["in_sync"] and not report["min_replicas"]
    return report


def _objects(settings: Settings, client) -> dict:
    """The object store as its records count it (``gpulayer/objects/``): objects, their bytes, and the store new
    ones go to (``object_store``, else the embedded cluster's own directory once something was stored; None:
    none yet)."""
    from .store.objects import ObjectRecords

    count, size = ObjectRecords(client).stats()
    store = settings.object_store
    if store is None:
        recorded = client.get(keys.OBJECTS_DEFAULT_STORE)
        store = recorded.decode() if recorded else None
    return {"count": count, "bytes": size, "store": store}


USER_FIELDS = ("admin", "revoked", "share", "max_slots", "max_gpus", "max_gangs", "priority")


def _users(settings: Settings, client) -> list[dict]:
    """The users the cluster knows (``gl:users``, gpulayer/users/table.py), without their keys: one row each,
    ``verified`` when this process holds the cluster secret and the entry's MAC matches it (None: no secret
    here to check with). Empty: a cluster without users."""
    import json

    from .users.table import read

    secret = settings.secret_bytes()
    verified = read(client, secret) if secret else {}
    rows = []
    for name, raw in sorted(client.hgetall(keys.USERS).items()):
        name = name.decode()
        entry = verified.get(name)
        try:
            fields = entry.body() if entry is not None else json.loads(raw)
        except ValueError:
            fields = {}
        rows.append({"name": name, **{k: fields.get(k) for k in USER_FIELDS},
                     "verified": (entry is not None) if secret else None})
    return rows


def _users_table(users: list[dict]) -> "_Lines":
    from .users.table import cell

    rows = [(u["name"], *(cell(u[k]) for k in USER_FIELDS),
             {True: "", False: "not signed with the cluster secret: ignored", None: ""}[u["verified"]])
            for u in users]
    noted = any(r[-1] for r in rows)
    return _Lines(f"Users ({len(users)})", [("user", *USER_FIELDS, *(("note",) if noted else ())),
                                            *(r if noted else r[:-1] for r in rows)])


SUMMARY_ABOVE = 50  # a fleet of more live workers is shown as a summary unless --all is asked
TOP = 10  # busiest workers the summary lists


def collect(full: bool | None = True, top: int = TOP) -> dict:
    """Live workers and queue lengths, as plain data (what ``--json`` prints).

    The registry is read incrementally (``Registry.current()``: a ``--watch`` or a
    metrics scrape pays for what changed since the last one), heartbeat ages are
    read exactly from Redis's clock. ``summary`` holds the fleet by zone and region,
    the ``top`` busiest workers and the dead ones (silent, not yet buried); with
    ``full=False``, ``workers`` lists only the busiest instead of every worker
    (``None``: every worker up to ``SUMMARY_ABOVE`` of them, else the busiest).
    """
    settings, registry = _cluster()
    try:
        return _collect(settings, registry, full, top)
    except LOST as err:
        raise unavailable(settings.broker_url, err, "reading the fleet for `gpulayer status`",
                          note=_embedded_note(settings)) from err


def _collect(settings: Settings, registry: Registry, full: bool | None, top: int) -> dict:
    workers = registry.current()
    read = read_queues(workers)
    client = registry.client  # this process's; left open for the next call (--watch)
    per_user: dict[str, int] = {}
    lengths = queue_lengths(client, read, per_user)
    gangs = GangStore(client)
    held = gangs.held()
    line = {g: i + 1 for i, g in enumerate(gangs.waiting())}  # gang id -> place in the waiting line
    gangs = gangs.active()
    if full is None:
        full = len(workers) <= SUMMARY_ABOVE
    busiest = heapq.nsmallest(top, workers, key=lambda w: (-(w.busy + held.get(w.id, 0)) / max(w.slots, 1),
                                                             -(w.busy + held.get(w.id, 0)), w.id))
    shown = workers if full else busiest
    # Exact ages for the rows shown only: 10,000 scores cost more to read than the whole summary.
    ages = registry.ages() if full and len(shown) > SUMMARY_ABOVE else registry.ages(w.id for w in shown)
    return {
        "broker": mask_url(settings.broker_url),
        "broker_restarts": _broker_restarts(client),
        "replication": _replication(settings, client),
        "workers": [_row(w, held, ages) for w in shown],
        "summary": summarize(workers, held, registry.dead(), busiest),
        "queues": lengths,
        "objects": _objects(settings, client),
        "users": _users(settings, client),
        "fair_share": fair_share(client, per_user),
        "unread_queues": sorted(q for q, n in lengths.items() if n and q not in read),
        "gangs": [
            {"id": g["gang_id"], "name": g.get("spec", {}).get("name"), "state": g["state"], "reason": _reason(g),
             "priority": g.get("spec", {}).get("priority", 0), "preemptions": g.get("preemptions", 0),
             "nodes": g.get("spec", {}).get("nodes"), "procs_per_node": g.get("spec", {}).get("procs_per_node"),
             "workers": (g.get("placement") or {}).get("workers", []), "attempt": g["attempt"],
             "in_line": line.get(g["gang_id"]), "ranks": _ranks(g)}
            for g in gangs
        ],
    }


def _reason(gang: dict) -> str:
    """Why the gang waits or where it runs; a running one a gang of higher priority is stopping says so."""
    mark = gang.get("preempting")
    if mark and int(mark["attempt"]) == gang["attempt"] and gang["state"] == "running":
        return f"being preempted by {mark['by']} ({mark['reason']}): its ranks have {mark['grace']:g} s to stop"
    return gang["reason"]


def _ranks(gang: dict) -> list[dict]:
    """Where a placed gang's ranks run: node ``i`` on its ``i``-th worker holds ranks ``i*M`` to ``i*M+M-1``."""
    workers = (gang.get("placement") or {}).get("workers", [])
    per = gang.get("spec", {}).get("procs_per_node") or 0
    return [{"node": i, "worker": w, "ranks": list(range(i * per, (i + 1) * per))} for i, w in enumerate(workers)]


def _row(w, held: dict[str, int], ages: dict[str, float]) -> dict:
    return {"id": w.id, "address": w.address, "hostname": w.hostname, "zone": w.zone, "region": w.region,
            "cuda": w.cuda, "gpus": w.gpus, "gpu_names": list(w.gpu_names), "slots": w.slots, "busy": w.busy,
            "held": held.get(w.id, 0), "heartbeat_age": round(ages.get(w.id, w.heartbeat_age), 2), "pid": w.pid}


def summarize(workers, held: dict[str, int], dead: dict[str, float], busiest) -> dict:
    """The fleet by zone and by region (workers, slots, busy, gang-held, GPUs), its busiest and its dead."""
    zones: dict[tuple, list[int]] = {}
    for w in workers:  # one pass over the fleet; regions and totals add up the zones
        acc = zones.get((w.zone, w.region))
        if acc is None:
            acc = zones[(w.zone, w.region)] = [0, 0, 0, 0, 0]
        acc[0] += 1
        acc[1] += w.slots
        acc[2] += w.busy
        acc[3] += held.get(w.id, 0)
        acc[4] += w.gpus
    regions: dict[str | None, list[int]] = {}
    for (_, region), acc in zones.items():
        regions[region] = [a + b for a, b in zip(regions.get(region, (0, 0, 0, 0, 0)), acc)]
    total = [sum(col) for col in zip(*regions.values())] or [0, 0, 0, 0, 0]

    def counts(acc: list[int]) -> dict:
        return dict(zip(("workers", "slots", "busy", "held", "gpus"), acc))

    return {
        **counts(total),
        "regions": [{"region": r, **counts(acc)} for r, acc in sorted(regions.items(), key=lambda kv: kv[0] or "")],
        "zones": [{"zone": z, "region": r, **counts(acc)}
                  for (z, r), acc in sorted(zones.items(), key=lambda kv: (kv[0][1] or "", kv[0][0] or ""))],
        "busiest": [w.id for w in busiest],
        "dead": [{"id": wid, "heartbeat_age": round(age, 2)} for wid, age in sorted(dead.items(), key=lambda kv: kv[1])],
    }


def read_queues(workers) -> set[str]:
    """Every queue the ``workers`` read (``app.queues_read``'s keys, with the shared names built once per kind)."""
    out: set[str] = {queues.CONTROL} if workers else set()  # every worker's control consumer reads it
    kinds = set()
    for w in workers:
        out.add(queues.private(w.id))
        kinds.add((w.gpus, w.zone, w.region))
    for gpus, zone, region in kinds:
        out.update(queues.for_worker("", gpus, zone, region)[1:])
    return out


# Lists in Redis that are not queues: gpulayer's own keys, and Celery's result backend (chord parts).
_NOT_QUEUES = (f"{keys.NAMESPACE}:", "celery-task", "chord-unlock", "_kombu.")


def queue_lengths(client, read, per_user: dict[str, int] | None = None) -> dict[str, int]:
    """Messages waiting per queue: every queue live workers read, and every other queue holding messages.

    A queue is a Redis list (kombu's, one more list per priority step, ``<queue>\\x06\\x16<step>``, and one
    per user with a fair-share policy, ``keys.user_queue``); finding the ones nobody reads costs one SCAN over
    the keyspace, in large steps. ``per_user`` (given) gets each user's waiting jobs added.
    """
    sep = "\x06\x16"
    found = set()
    for raw in client.scan_iter(count=10_000, _type="list"):
        name = raw.decode(errors="replace")
        if not name.startswith(_NOT_QUEUES):
            found.add(name)
    names = sorted(set(read) | {keys.base_queue(n).split(sep, 1)[0] for n in found})
    # A Redis list exists only while it holds something: the queues the SCAN did not find are empty,
    # so only the found ones are counted (10,000 workers read 10,000 private queues, mostly empty).
    lists = [(keys.base_queue(n).split(sep, 1)[0], n) for n in sorted(found)]
    pipe = client.pipeline(transaction=False)
    for _, key in lists:
        pipe.llen(key)
    lengths = dict.fromkeys(names, 0)
    for (q, key), n in zip(lists, pipe.execute()):
        lengths[q] += int(n)
        if per_user is not None and keys.USER_SEP in key:
            user = key.split(keys.USER_SEP, 1)[1]
            per_user[user] = per_user.get(user, 0) + int(n)
    return {q: n for q, n in lengths.items() if q in read or n}


def fair_share(client, waiting: dict[str, int]) -> list[dict] | None:
    """Each user with a policy, best-ranked first: what it runs, its share, decayed usage, F, quota, and its
    waiting jobs with the reason (a quota); None while fair share is off (no policy in ``keys.USERS``)."""
    snap = fair.snapshot(client)
    if not snap.policies:
        return None
    computed = fairshare.shares(snap)
    reasons = {k.decode(): v.decode() for k, v in client.hgetall(keys.FAIR_WAITING).items()}
    rows = []
    for user in fairshare.rank(snap, fair.weights):
        p, held, share = snap.policies[user], snap.running.get(user, fairshare.Running()), computed.get(user)
        rows.append({"user": user, "slots": held.slots, "gpus": held.gpus, "gangs": held.gangs,
                     "share": p.share, "norm_share": share.norm_shares if share else 0.0,
                     "usage": snap.usage.get(user, 0.0), "factor": share.factor if share else 0.0,
                     "max_slots": p.max_slots, "max_gpus": p.max_gpus, "max_gangs": p.max_gangs,
                     "priority": p.priority, "waiting": waiting.get(user, 0),
                     "reason": _waits_because(user, p, held, reasons.get(user)) if waiting.get(user) else None})
    return rows


def _waits_because(user: str, policy, held, written: str | None) -> str:
    """Why a user's queued jobs wait now: its slot quota as the snapshot has it, a GPU quota a take found
    (``written``, while the user still holds GPUs), or no free slot."""
    return (fairshare.over_quota(user, policy, held)
            or (written if written and "GPUs" in written and held.gpus else None)
            or "waits for a free slot")


def _fair_cells(row: dict) -> tuple[str, ...]:
    quota = ", ".join(f"{what} {row[k]}" for k, what in (("max_slots", "slots"), ("max_gpus", "GPUs"),
                                                           ("max_gangs", "gangs")) if row[k] is not None)
    return (row["user"], f"{row['slots']}" + (f" ({row['gpus']} GPUs)" if row["gpus"] else ""),
            f"{row['share']:g} ({row['norm_share']:.0%})", f"{row['usage']:.0f}", f"{row['factor']:.3f}",
            quota or "-", str(row["waiting"]), row["reason"] or "")


def renderables(report: dict, full: bool | None = None) -> list:
    """The report as aligned plain tables: workers (each one, or a summary above ``SUMMARY_ABOVE``), queues,
    distributed jobs.

    ``full`` None: every worker when the fleet is small and the report lists them all. Each table is
    ``_Lines``: columns as wide as their widest value, two spaces apart, nothing cut and no column dropped
    (a local cluster's fit in 80 columns; a wider row wraps at the terminal's edge), and no rich to import.
    """
    summary = report.get("summary")
    if full is None:
        full = summary is None or len(report["workers"]) == summary["workers"] <= SUMMARY_ABOVE
    out: list = [_Lines(f"broker {report['broker']}")]
    if report.get("broker_restarts"):
        from .local.supervisor import describe_restarts

        out.append(_Lines(f"redis: {describe_restarts(report['broker_restarts'])}"))
    if report.get("replication"):
        out.extend(_Lines(line) for line in describe_replication(report["replication"]))
    if full:
        out.append(_Lines(f"{len(report['workers'])} live workers",
                          [_WORKER_COLUMNS, *map(_worker_cells, report["workers"])]))
    else:
        out.extend(_summary_tables(report))
    if report.get("objects") is not None:
        out.append(_Lines(_objects_line(report["objects"])))
    unread = set(report.get("unread_queues", ()))
    rows, quiet = [], 0
    for name, n in sorted(report["queues"].items()):
        if not full and not n:
            quiet += 1  # a big fleet's empty queues (10,000 private ones): counted, not listed
            continue
        rows.append((name, str(n), "nobody reads this queue" if name in unread else ""))
    caption = f"and {quiet} empty queues (--all lists them)" if quiet else None
    if quiet and not rows:
        out.append(_Lines(f"queues: nothing waiting in any of {quiet} (--all lists them)"))
    elif rows:
        noted = any(note for _, _, note in rows)  # the third column only when a queue has a note
        out.append(_Lines("queues", [("queue", "waiting", *(("note",) if noted else ())),
                                     *((name, n, *((note,) if noted else ())) for name, n, note in rows)],
                          caption, right=(1,)))
    if report.get("users"):
        out.append(_users_table(report["users"]))
    if report.get("fair_share"):
        out.append(_Lines("fair share (docs/FAIRSHARE.md)", [
            ("user", "running slots", "share", "usage slot-s", "F", "quota", "waiting", "why"),
            *map(_fair_cells, report["fair_share"])]))
    if report["gangs"]:
        out.append(_Lines("distributed jobs", [("id", "function", "shape", "state", "workers", "why"), *(
            (job["id"][:12], job["name"] or "-", f"{job['nodes']} x {job['procs_per_node']}",
             job["state"] + (f" (#{job['in_line']} in line)" if job.get("in_line") else ""),
             ", ".join(job["workers"]) or "-", job["reason"]) for job in report["gangs"])]))
    return out


def _objects_line(objects: dict) -> str:
    """``objects: 3, 1.2 GiB in file:///...``: what the object store holds (large arguments and results, put
    values)."""
    from .objects.format import human

    where = f" in {objects['store']}" if objects["store"] else " (no object store in use yet)"
    return f"objects: {objects['count']}, {human(objects['bytes'])}{where}"


_WORKER_COLUMNS = ("worker", "address", "zone", "region", "cuda", "used/slots", "heartbeat")


def _worker_cells(w: dict) -> tuple[str, ...]:
    cuda = f"{w['gpus']} x {w['gpu_names'][0].removeprefix('NVIDIA ')}" if w["gpus"] else "-"
    return (w["id"], w["address"], w["zone"] or "-", w["region"] or "-", cuda,
            f"{w['busy'] + w['held']}/{w['slots']}" + (f" ({w['held']} gang)" if w["held"] else ""),
            f"{w['heartbeat_age']:.1f}s ago")


class _Lines:
    """A title and rows of cells as aligned text, one segment per line: 10,000 rows in a tenth of a second."""

    def __init__(self, title: str, rows: list[tuple[str, ...]] = (), caption: str | None = None,
                 right: tuple[int, ...] = ()):
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))] if rows else []
        self.lines = [title] + ["  ".join(v.rjust(n) if i in right else v.ljust(n)
                                          for i, (v, n) in enumerate(zip(r, widths))).rstrip() for r in rows]
        if caption:
            self.lines.append(caption)

    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)

    def __rich_console__(self, console, options):
        from rich.segment import Segment

        for line in self.lines:
            yield Segment(line + "\n")


def _summary_tables(report: dict) -> list:
    """A big fleet: by region, by zone, the busiest workers, the dead ones."""
    s = report["summary"]
    out = []
    for kind, rows in (("region", s["regions"]), ("zone", s["zones"])):
        title = f"{s['workers']} live workers by {kind}" + (" (--all lists every worker)" if kind == "region" else "")
        head = (kind, *(("region",) if kind == "zone" else ()), "workers", "slots used/total", "gang-held", "GPUs")
        out.append(_Lines(title, [head, *(
            (r[kind] or "-", *((r["region"] or "-",) if kind == "zone" else ()), str(r["workers"]),
             f"{r['busy'] + r['held']}/{r['slots']}", str(r["held"]), str(r["gpus"])) for r in rows)]))
    out.append(_Lines(f"{len(report['workers'])} busiest workers", [_WORKER_COLUMNS, *map(_worker_cells,
                                                                                        report["workers"])]))
    if s["dead"]:
        out.append(_Lines(f"{len(s['dead'])} dead workers (silent, not yet buried)", [
            ("worker", "last heartbeat"), *((w["id"], f"{w['heartbeat_age']:.1f}s ago") for w in s["dead"])]))
    return out


def render(report: dict, full: bool | None = None) -> None:
    sys.stdout.write("\n".join(item.text() for item in renderables(report, full)))


def watch(every: float = 2.0, as_json: bool = False, full: bool | None = None) -> int:
    """Redraw the report every ``every`` seconds until Ctrl-C (``as_json``: one JSON line per refresh).

    ``full``: as ``collect``'s and ``renderables``' (None: every worker of a small fleet, a summary of a big one).
    """
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
                print(json.dumps(collect()), flush=True)  # machine readers get every worker
                time.sleep(every)
        with Live(refresh_per_second=4, screen=False, auto_refresh=False) as live:
            while True:
                stamp = Text(f"{time.strftime('%H:%M:%S')}  every {every:g}s, Ctrl-C to stop", style="dim")
                live.update(Group(stamp, *renderables(collect(full), full)), refresh=True)
                time.sleep(every)
    except KeyboardInterrupt:
        return 0
