"""`gpulayer up`'s flags: refused before anything starts when no cluster could have them, and held
against the cluster that runs already: a running cluster is neither changed behind the user's back nor
kept silently; `gpulayer up --slots 4` on one of 2 slots says what runs and how to get 4 (exit status 2).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from ..state_file import STATE_FILE_NAME, read_state  # not config.py: `up` imports no pydantic
from ..errors import ConfigError
from ..local.places import worker_places


# Variables of the cluster's own processes that are no setting (the home, what a worker preloads, ...).
_NOT_SETTINGS = ("GPULAYER_HOME", "GPULAYER_PRELOAD", "GPULAYER_WARM_RANKS", "GPULAYER_READY_FD")


def check_settings() -> None:
    """A ``GPULAYER_*`` variable or a config file the workers could not start with, refused now in its one line
    (``GPULAYER_MAX_PAYLOAD_BYTES=lots``) rather than as workers that did not start. Nothing to read, nothing
    imported: the settings' loader (pydantic) costs a fifth of a second."""
    import os

    from ..state_file import home_dir

    named = [k for k in os.environ if k.upper().startswith("GPULAYER_") and k.upper() not in _NOT_SETTINGS]
    if not named and not (home_dir() / "config.toml").exists():
        return
    from ..config import load_settings

    load_settings()


def check_up_flags(args) -> None:
    """Refuse a value no cluster can have, naming the flag, before anything is started or read."""
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: a cluster needs at least 1 worker (default 2)")
    if args.slots is not None and args.slots < 1:
        raise ConfigError(f"--slots {args.slots}: a worker needs at least 1 job slot "
                          "(default: cores / workers, at least 2)")
    if args.flower is not None and not 0 <= args.flower <= 65535:
        raise ConfigError(f"--flower {args.flower}: a port is 1 to 65535 (or leave it out: a free port)")
    for flag, names in (("--zone", args.zone), ("--region", args.region)):
        for name in names or ():
            if not name or name != name.strip() or any(c.isspace() for c in name):
                raise ConfigError(f"{flag} {name!r}: a {flag[2:]} name is one word, e.g. europe-west1-b")


def up_command(args) -> str:
    """The `gpulayer up ...` that asks for what ``args`` asks for (the flags that shape a cluster)."""
    words = ["gpulayer", "up"]
    for flag, value in (("--workers", args.workers), ("--slots", args.slots)):
        if value is not None:
            words += [flag, str(value)]
    for flag, names in (("--zone", args.zone), ("--region", args.region)):
        for name in names or ():
            words += [flag, name]
    if args.flower is not None:
        words += ["--flower"] + ([str(args.flower)] if args.flower else [])
    if getattr(args, "replicas", 0) or getattr(args, "sentinels", 0):
        words += ["--replicas", str(args.replicas), "--sentinels", str(args.sentinels)]
    return shlex.join(words)


def running_cluster(state: dict) -> str:
    """What runs now, in a line: ``2 workers x 2 slots (local-1 in europe-west1-b, ...), without Flower``."""
    places = state.get("places") or {}
    where = ", ".join(f"{name} in {p['zone']}" + (f" ({p['region']})" if p["region"] != _region(p["zone"]) else "")
                      for name, p in places.items())
    flower = f"Flower on {state['flower_url']}" if state.get("flower_url") else "without Flower"
    workers, slots = state.get("workers", len(places)), state.get("slots", "?")
    return (f"{workers} worker{'s' if workers != 1 else ''} x {slots} slot{'s' if slots != 1 else ''}"
            + (f" ({where})" if where else "") + f", {flower}")


def _region(zone: str) -> str:
    return worker_places(1, [zone])[0][1]


def differences(args, state: dict) -> list[str]:
    """The flags of ``args`` the running cluster (its ``state`` file) does not have, each with what it has."""
    out = []
    workers, slots = state.get("workers"), state.get("slots")
    if args.workers is not None and args.workers != workers:
        out.append(f"--workers {args.workers} (it has {workers})")
    if args.slots is not None and args.slots != slots:
        out.append(f"--slots {args.slots} (its workers have {slots} each)")
    places = list((state.get("places") or {}).values())
    if (args.zone or args.region) and places:
        asked = worker_places(len(places), args.zone, args.region)
        if args.zone and [z for z, _ in asked] != [p["zone"] for p in places]:
            out.append(f"--zone {' --zone '.join(args.zone)} (its zones: {', '.join(p['zone'] for p in places)})")
        if args.region and [r for _, r in asked] != [p["region"] for p in places]:
            out.append(f"--region {' --region '.join(args.region)} "
                       f"(its regions: {', '.join(p['region'] for p in places)})")
    asked_group = (getattr(args, "replicas", 0), getattr(args, "sentinels", 0))
    if any(asked_group):
        pids = (state.get("sentinel_group") or {}).get("pids") or {}
        has = (sum(1 for n in pids if n.startswith("redis-")) - 1 if pids else 0,
               sum(1 for n in pids if n.startswith("sentinel-")))
        if has != asked_group:
            out.append(f"--replicas {asked_group[0]} --sentinels {asked_group[1]} "
                       + (f"(it has {has[0]} and {has[1]})" if pids else "(it runs one Redis, no Sentinel group)"))
    url = state.get("flower_url")
    if args.flower is not None and not url and not _flower_asked(state):
        out.append("--flower (it was started without Flower)")
    elif args.flower and url and urlsplit(url).port != args.flower:
        out.append(f"--flower {args.flower} (its Flower is on {url})")
    return out


def _flower_asked(state: dict) -> bool:
    """Was the running cluster started with ``--flower`` (and its Flower did not start)? Its supervisor's
    command line says so."""
    try:
        return "--flower" in psutil.Process(state["supervisor_pid"]).cmdline()
    except (KeyError, TypeError, psutil.Error):
        return False


def refuse_changes(args, home: Path) -> None:
    """``ConfigError`` when ``args`` ask for a cluster other than the one running in ``home``: what runs, what
    differs, and the commands that give what was asked."""
    state = read_state(home / STATE_FILE_NAME) or {}
    diff = differences(args, state)
    if not diff:
        return
    ways = [f"`gpulayer down`, then `{up_command(args)}`"]
    if len(diff) == 1 and diff[0].startswith("--flower"):
        ways.append("run Flower beside it: `gpulayer flower`")
    elif any(d.startswith(("--workers", "--slots")) for d in diff):
        more = f" --slots {args.slots}" if args.slots is not None else ""
        ways.append(f"add a worker beside it: `gpulayer worker{more}` (`gpulayer down` does not stop that one)")
    raise ConfigError(f"a local cluster is already running in {home}: {running_cluster(state)}; it was left as it "
                      f"is, not changed to {'; '.join(diff)}. For that: {', or '.join(ways)}")
