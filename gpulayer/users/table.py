"""The user table: one Redis hash, ``gl:users`` (``keys.USERS``), field = user name, value = the entry's JSON.

Clients can write to Redis (it is their broker), so an entry counts only if its MAC, made with the cluster
secret by the admin command, is right: a user with Redis write access can neither add an entry nor change
one (its quota, its keys, its admin flag). Processes holding the secret read the table through
:class:`UsersCache`, which keeps it for at most ``TTL`` seconds, so a revocation reaches every running
worker within that time plus one message.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass, field

import redis

from ..errors import ConfigError
from ..store import keys
from .token import Token, check_name, cluster_public, table_mac_key

log = logging.getLogger(__name__)
TTL = 2.0  # seconds a process keeps the table it read (revocation is seen within this, plus one message)
QUOTAS = ("share", "max_slots", "max_gpus", "max_gangs", "priority")


@dataclass(frozen=True)
class UserEntry:
    """One user as the table holds it (the JSON field names are the contract with fair-share policy reads)."""

    name: str
    keys: dict
    share: float = 1.0
    max_slots: int | None = None
    max_gpus: int | None = None
    max_gangs: int | None = None
    priority: int = 0
    admin: bool = False
    revoked: bool = False
    created_at: float = field(default_factory=time.time)

    def body(self) -> dict:
        return {"share": self.share, "max_slots": self.max_slots, "max_gpus": self.max_gpus,
                "max_gangs": self.max_gangs, "priority": self.priority, "admin": self.admin,
                "revoked": self.revoked, "keys": self.keys, "created_at": self.created_at}

    def with_(self, **changes) -> UserEntry:
        return UserEntry(**{"name": self.name, **self.body(), **changes})


def _mac(secret: bytes, name: str, body: dict) -> str:
    canonical = json.dumps([name, body], sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(table_mac_key(secret), canonical, hashlib.sha256).hexdigest()


def encode(secret: bytes, entry: UserEntry) -> str:
    body = entry.body()
    return json.dumps({**body, "mac": _mac(secret, entry.name, body)}, sort_keys=True)


def decode(secret: bytes, name: str, raw: bytes | str) -> UserEntry | None:
    """The entry ``raw`` holds if its MAC is right (for ``name``), else None (logged)."""
    try:
        data = json.loads(raw)
        mac = data.pop("mac")
        if not hmac.compare_digest(str(mac), _mac(secret, name, data)):
            raise ValueError("its MAC does not match the cluster secret")
        return UserEntry(name=name, **{k: data[k] for k in ("keys", "created_at", "admin", "revoked", *QUOTAS)})
    except (ValueError, KeyError, TypeError) as err:
        log.warning("gpulayer: user table entry %r ignored: %s (written without the cluster secret?)", name, err)
        return None


def read(r: redis.Redis, secret: bytes) -> dict[str, UserEntry]:
    """Every verified entry (one HGETALL); entries whose MAC is wrong are left out."""
    out = {}
    for name, raw in r.hgetall(keys.USERS).items():
        name = name.decode() if isinstance(name, bytes) else name
        entry = decode(secret, name, raw)
        if entry is not None:
            out[name] = entry
    return out


def add(r: redis.Redis, secret: bytes, name: str, **fields) -> tuple[UserEntry, Token]:
    """A new user and its token (the only time the token exists: it is not stored)."""
    token = Token.new(check_name(name), cluster_public(secret))
    entry = UserEntry(name=name, keys=token.public_keys(), **_quotas(fields))
    if not r.hsetnx(keys.USERS, name, encode(secret, entry)):
        raise ConfigError(f"user {name!r} exists already: change it with `gpulayer users set {name} ...`, or "
                          f"`gpulayer users revoke {name}` and add it under another name")
    return entry, token


def update(r: redis.Redis, secret: bytes, name: str, **fields) -> UserEntry:
    """Change ``name``'s quotas, admin or revoked flag (a WATCHed read-modify-write)."""
    with r.pipeline() as pipe:
        while True:
            try:
                pipe.watch(keys.USERS)
                raw = pipe.hget(keys.USERS, name)
                entry = decode(secret, name, raw) if raw is not None else None
                if entry is None:
                    raise ConfigError(f"no user {name!r} in the table (see `gpulayer users list`)")
                entry = entry.with_(**_quotas(fields))
                pipe.multi()
                pipe.hset(keys.USERS, name, encode(secret, entry))
                pipe.execute()
                return entry
            except redis.WatchError:
                continue


def _quotas(fields: dict) -> dict:
    unknown = set(fields) - set(QUOTAS) - {"admin", "revoked"}
    if unknown:
        raise ConfigError(f"unknown user field(s) {sorted(unknown)}; known: {[*QUOTAS, 'admin', 'revoked']}")
    out = {k: v for k, v in fields.items() if v is not None}
    for k in ("max_slots", "max_gpus", "max_gangs"):
        if k in out and int(out[k]) < 0:
            raise ConfigError(f"{k} must be 0 or more, not {out[k]}")
    if "share" in out and float(out["share"]) <= 0:
        raise ConfigError(f"share must be more than 0, not {out['share']}")
    return out


class UsersCache:
    """The verified table, read at most once per ``ttl`` seconds; a process's view of who may do what."""

    def __init__(self, connect, secret: bytes, ttl: float = TTL):
        self._connect, self._secret, self._ttl = connect, secret, ttl
        self._client: redis.Redis | None = None
        self._entries: dict[str, UserEntry] = {}
        self._read_at = -ttl
        self._lock = threading.Lock()

    def entries(self) -> dict[str, UserEntry]:
        if time.monotonic() - self._read_at >= self._ttl:
            with self._lock:
                if time.monotonic() - self._read_at >= self._ttl:
                    try:
                        if self._client is None:
                            self._client = self._connect()
                        self._entries = read(self._client, self._secret)
                    except redis.RedisError as err:  # keep the last table: with Redis gone no message comes
                        log.debug("gpulayer: user table not read: %s", err)
                    self._read_at = time.monotonic()
        return self._entries

    def get(self, name: str) -> UserEntry | None:
        return self.entries().get(name)

    def any(self) -> bool:
        """Does the cluster have users (at least one verified entry)? No: today's behaviour, unchanged."""
        return bool(self.entries())
