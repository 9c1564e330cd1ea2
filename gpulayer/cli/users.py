"""``gpulayer users add / list / set / revoke``: the users the cluster knows (gpulayer/users/table.py).

Admin commands: they sign the table's entries, so they need the cluster secret (GPULAYER_SECRET, or the state
file `gpulayer up` writes) or an admin's token (GPULAYER_TOKEN of a user added with ``--admin``; it adds,
changes and revokes users that are not admins, users/table.py). ``add`` prints the new user's token once; it is stored nowhere, and ``list`` shows
no secret. A revocation reaches running workers within ``table.TTL`` seconds plus one message.
"""

from __future__ import annotations

import sys
import time

from ..errors import ConfigError
from ..users import table

COLUMNS = ("name", "admin", "revoked", "share", "max_slots", "max_gpus", "max_gangs", "priority", "created")


def _admin():
    """(Redis client, signer) for an admin command: the cluster secret, else an admin's token; or
    ``ConfigError`` naming what is missing."""
    from .. import app as app_mod
    from ..config import load_settings
    from ..users.token import Token
    from .cluster import connected_client

    settings = load_settings()
    connected_client("manage users on")
    r = app_mod.redis_client(settings)
    if settings.secret_bytes():
        return r, settings.secret_bytes()
    token = Token.parse(settings.token.get_secret_value()) if settings.token else None
    entry = table.unverified(r, token.user) if token else None
    if entry is None or not entry.admin or entry.revoked:
        who = f"user {token.user} is not an admin" if token else "neither is set"
        raise ConfigError(f"`gpulayer users` signs the user table: run it where GPULAYER_SECRET is set (or on the "
                          f"`gpulayer up` machine), or with an admin's GPULAYER_TOKEN ({who})")
    return r, token


def add(name: str, out=None, **fields) -> int:
    out = out or sys.stdout
    r, signer = _admin()
    entry, token = table.add(r, signer, name, **fields)
    print(f"added user {name} ({_quotas(entry)}). Its token, shown this once and stored nowhere "
          "(keep it secret; `gpulayer users revoke` ends it):", file=out)
    print(str(token), file=out)
    print(f"the user sets it as GPULAYER_TOKEN (or token = \"...\" in the config file)", file=out)
    return 0


def update(name: str, out=None, **fields) -> int:
    out = out or sys.stdout
    r, signer = _admin()
    entry = table.update(r, signer, name, **fields)
    print(f"user {name}: {_quotas(entry)}", file=out)
    return 0


def revoke(name: str, out=None) -> int:
    out = out or sys.stdout
    r, signer = _admin()
    table.update(r, signer, name, revoked=True)
    print(f"user {name}: revoked; running workers refuse its token within {table.TTL + 1:.0f} s", file=out)
    return 0


def rows(entries: dict) -> list[dict]:
    """One row per user, no secret in it (a user's public keys are left out too): for list and status."""
    return [{"name": e.name, "admin": e.admin, "revoked": e.revoked, "share": e.share, "max_slots": e.max_slots,
             "max_gpus": e.max_gpus, "max_gangs": e.max_gangs, "priority": e.priority,
             "created": time.strftime("%Y-%m-%d %H:%M", time.gmtime(e.created_at))}
            for e in sorted(entries.values(), key=lambda e: e.name)]


def render(entries: dict) -> list[str]:
    table_rows = [[table.cell(row[c]) for c in COLUMNS] for row in rows(entries)]
    widths = [max(len(c), *(len(r[i]) for r in table_rows)) if table_rows else len(c) for i, c in enumerate(COLUMNS)]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [list(COLUMNS), *table_rows]]


def list_users(out=None) -> int:
    out = out or sys.stdout
    r, signer = _admin()
    if isinstance(signer, bytes):
        entries = table.read(r, signer)
    else:  # an admin's token cannot check the MACs: what Redis holds, said so
        entries = {n.decode(): table.unverified(r, n.decode()) for n in r.hkeys(table.keys.USERS)}
        print("(as Redis holds them: without the cluster secret here, no entry is checked)", file=out)
    if not entries:
        print("no users: every client that holds the cluster secret acts as the cluster "
              "(`gpulayer users add NAME` makes the first)", file=out)
        return 0
    print("\n".join(render(entries)), file=out)
    bad = set(n.decode() if isinstance(n, bytes) else n for n in r.hkeys(table.keys.USERS)) - set(entries)
    if bad:
        print(f"ignored (not signed with the cluster secret): {', '.join(sorted(bad))}", file=out)
    return 0


def _quotas(entry) -> str:
    return ", ".join(f"{k} {table.cell(v)}" for k, v in (("share", entry.share), ("max_slots", entry.max_slots),
                                                   ("max_gpus", entry.max_gpus), ("max_gangs", entry.max_gangs),
                                                   ("priority", entry.priority), ("admin", entry.admin),
                                                   ("revoked", entry.revoked)))
