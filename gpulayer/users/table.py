"""The user table: one Redis hash, ``gl:users`` (``keys.USERS``), field = user name, value = the entry's JSON.

Clients can write to Redis (it is their broker), so an entry counts only if the admin command signed it:
with the cluster secret (``mac``: HMAC-SHA256 with a key derived from it), or with the token of an admin whose
own entry carries such a MAC (``by``: the admin's name, ``sig``: its Ed25519 signature). A user with Redis
write access can neither add an entry nor change one (its quota, its keys, its admin flag). One level only:
an entry an admin token signed does not make its user an admin who can sign others (``admin`` is ignored
there), and it stops counting when that admin is revoked or loses ``admin``. Processes holding the secret read the table through
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

from cryptography.exceptions import InvalidSignature

from ..errors import ConfigError
from ..store import keys
from .token import Token, check_name, cluster_public, ed25519_public, table_mac_key

log = logging.getLogger(__name__)
TTL = 2.0  # seconds a process keeps the table it read (revocation is seen within this, plus one message)
MISS_TTL = 0.25  # seconds: a name not in the table read re-reads it, at most this often (a new user's first job)
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


def _canonical(name: str, body: dict) -> bytes:
    return json.dumps([name, body], sort_keys=True, separators=(",", ":")).encode()


def _mac(secret: bytes, name: str, body: dict) -> str:
    return hmac.new(table_mac_key(secret), _canonical(name, body), hashlib.sha256).hexdigest()


def encode(signer: bytes | Token, entry: UserEntry) -> str:
    """The entry's JSON, signed by ``signer``: the cluster secret (bytes), or an admin's token."""
    body = entry.body()
    if isinstance(signer, Token):
        sig = signer.signing_key.sign(_canonical(entry.name, body)).hex()
        return json.dumps({**body, "by": signer.user, "sig": sig}, sort_keys=True)
    return json.dumps({**body, "mac": _mac(signer, entry.name, body)}, sort_keys=True)


def _entry(name: str, data: dict) -> UserEntry:
    return UserEntry(name=name, **{k: data[k] for k in ("keys", "created_at", "admin", "revoked", *QUOTAS)})


def decode(secret: bytes, name: str, raw: bytes | str, admins: dict | None = None) -> UserEntry | None:
    """The entry ``raw`` holds if its MAC is right (for ``name``), or, with ``admins`` (verified entries),
    if an unrevoked admin among them signed it; else None (logged)."""
    try:
        data = json.loads(raw)
        if "mac" in data:
            mac = data.pop("mac")
            if not hmac.compare_digest(str(mac), _mac(secret, name, data)):
                raise ValueError("its MAC does not match the cluster secret")
            return _entry(name, data)
        by, sig = data.pop("by"), bytes.fromhex(data.pop("sig"))
        admin = (admins or {}).get(by)
        if admin is None or not admin.admin or admin.revoked:
            raise ValueError(f"it is signed by {by!r}, not an admin of the table's own (MAC'd, unrevoked)")
        try:
            ed25519_public(admin.keys["ed25519"]).verify(sig, _canonical(name, data))
        except InvalidSignature:
            raise ValueError(f"its signature does not match admin {by}'s key") from None
        return _entry(name, {**data, "admin": False})  # one level: an admin token makes no admins
    except (ValueError, KeyError, TypeError) as err:
        log.warning("gpulayer: user table entry %r ignored: %s (written without the cluster secret?)", name, err)
        return None


def read(r: redis.Redis, secret: bytes) -> dict[str, UserEntry]:
    """Every verified entry (one HGETALL): MAC'd ones, then those their admins signed; others are left out."""
    raw = {(n.decode() if isinstance(n, bytes) else n): v for n, v in r.hgetall(keys.USERS).items()}
    macd = {name: value for name, value in raw.items() if b'"mac"' in (value if isinstance(value, bytes)
                                                                        else value.encode())}
    out = {}
    for name, value in macd.items():
        entry = decode(secret, name, value)
        if entry is not None:
            out[name] = entry
    admins = dict(out)
    for name, value in raw.items():
        if name not in macd:
            entry = decode(secret, name, value, admins)
            if entry is not None:
                out[name] = entry
    return out


def unverified(r: redis.Redis, name: str) -> UserEntry | None:
    """``name``'s entry as Redis holds it, unchecked: for a token's admin command, which has no secret to check
    with (the workers check what it writes)."""
    raw = r.hget(keys.USERS, name)
    if raw is None:
        return None
    data = json.loads(raw)
    return _entry(name, data)


def add(r: redis.Redis, signer: bytes | Token, name: str, **fields) -> tuple[UserEntry, Token]:
    """A new user and its token (the only time the token exists: it is not stored). ``signer``: the cluster
    secret, or an admin's token (whose entries make no admins)."""
    public = signer.cluster_public if isinstance(signer, Token) else cluster_public(signer)
    if isinstance(signer, Token) and fields.get("admin"):
        raise ConfigError("an admin's token adds users, not admins: run `gpulayer users add --admin` where the "
                          "cluster secret is")
    token = Token.new(check_name(name), public)
    entry = UserEntry(name=name, keys=token.public_keys(), **_quotas(fields))
    if not r.hsetnx(keys.USERS, name, encode(signer, entry)):
        raise ConfigError(f"user {name!r} exists already: change it with `gpulayer users set {name} ...`, or "
                          f"`gpulayer users revoke {name}` and add it under another name")
    return entry, token


def update(r: redis.Redis, signer: bytes | Token, name: str, **fields) -> UserEntry:
    """Change ``name``'s quotas, admin or revoked flag (a WATCHed read-modify-write). ``signer``: the cluster
    secret, or an admin's token (which neither makes admins nor changes an admin's entry; the entry it signs
counts while that admin does)."""
    by_token = isinstance(signer, Token)
    if by_token and fields.get("admin"):
        raise ConfigError("an admin's token makes no admins: run `gpulayer users set --admin` where the cluster "
                          "secret is")
    with r.pipeline() as pipe:
        while True:
            try:
                pipe.watch(keys.USERS)
                raw = pipe.hget(keys.USERS, name)
                if raw is None:
                    entry = None
                elif by_token:
                    entry = _entry(name, json.loads(raw))
                    if entry.admin:
                        raise ConfigError(f"user {name!r} is an admin: change it where the cluster secret is "
                                          "(an admin's token changes users that are not admins)")
                else:
                    entry = decode(signer, name, raw, read(r, signer))
                if entry is None:
                    raise ConfigError(f"no user {name!r} in the table (see `gpulayer users list`)")
                entry = entry.with_(**_quotas(fields))
                pipe.multi()
                pipe.hset(keys.USERS, name, encode(signer, entry))
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
        self._revoked: set[str] = set()  # public keys seen revoked: an older entry written back stays revoked
        self._read_at = -ttl
        self._lock = threading.Lock()

    def entries(self, ttl: float | None = None) -> dict[str, UserEntry]:
        ttl = self._ttl if ttl is None else ttl
        if time.monotonic() - self._read_at >= ttl:
            with self._lock:
                if time.monotonic() - self._read_at >= ttl:
                    try:
                        if self._client is None:
                            self._client = self._connect()
                        self._entries = self._sticky(read(self._client, self._secret))
                    except redis.RedisError as err:  # keep the last table: with Redis gone no message comes
                        log.debug("gpulayer: user table not read: %s", err)
                    self._read_at = time.monotonic()
        return self._entries

    def _sticky(self, entries: dict[str, UserEntry]) -> dict[str, UserEntry]:
        """A revocation this process saw holds for its lifetime, whatever Redis holds later: a user with Redis
        write access could write back the entry from before its revocation (its MAC is still right)."""
        self._revoked.update(e.keys.get("ed25519") for e in entries.values() if e.revoked)
        return {n: e.with_(revoked=True) if not e.revoked and e.keys.get("ed25519") in self._revoked else e
                for n, e in entries.items()}

    def get(self, name: str) -> UserEntry | None:
        entry = self.entries().get(name)
        if entry is None:  # a user added a moment ago: read again now (at most every MISS_TTL s)
            entry = self.entries(MISS_TTL).get(name)
        return entry

    def any(self) -> bool:
        """Does the cluster have users (at least one verified entry)? No: today's behaviour, unchanged."""
        return bool(self.entries())


def cell(value) -> str:
    """A table field as `gpulayer users list` and `gpulayer status` show it: "-" for none, yes/no, 0.5, 3."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:g}" if isinstance(value, float) else str(value)
