"""The signed serializer every gpulayer message and result goes through.

Body = ``MAGIC`` + HMAC-SHA256(secret, pickle) + pickle. The MAC is checked
before a single byte is unpickled, so anyone who can write to Redis but lacks
the cluster secret cannot make a worker run code.

A cluster with users (``gl:users``, gpulayer/users/) has three more formats beside it, each checked before
unpickling too (threat model: docs/SECURITY.md):

- ``GL2`` (a user sends): name length, name, Ed25519 signature over name + pickle with the user's token; a
  process holding the cluster secret checks it against the user's verified table entry (not revoked).
- ``GL3`` (the cluster sends, while it has users): Ed25519 signature with the cluster key derived from the
  secret; a user checks it with the cluster public key its token carries.
- ``GL4`` (a result sealed to its owner): GL3's signature over (name, ephemeral X25519 key, nonce,
  AES-GCM ciphertext of the pickle); only the owner's token opens it, so another user reading the key in
  Redis sees ciphertext.

With no users, every process signs and checks ``GL1`` exactly as before.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import threading
from contextlib import contextmanager

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from kombu.serialization import register

from . import payload
from .errors import PayloadError, PayloadRejected

NAME = "gpulayer"
CONTENT_TYPE = "application/x-gpulayer-signed"
MAGIC = b"GL1"
USER_MAGIC = b"GL2"     # signed by a user's token
CLUSTER_MAGIC = b"GL3"  # signed by the cluster's Ed25519 key
SEALED_MAGIC = b"GL4"   # signed by the cluster's key and encrypted to one user
_MAC_LEN = 32
_SIG_LEN = 64

_secret: bytes | None = None
_max_bytes: int = 64 * 2**20
_token = None   # users.token.Token: this process sends as that user
_users = None   # users.table.UsersCache (processes holding the secret): who the users are
_local = threading.local()  # .signer: the last verified message's user (None: the cluster); .recipient


def configure(secret: bytes | None, max_payload_bytes: int | None = None, token=None, users=None) -> None:
    """Set this process's cluster secret (and size limit) for signing and checking; ``token`` (a
    ``users.token.Token``): sign as that user; ``users`` (a ``UsersCache``): check users' signatures."""
    global _secret, _max_bytes, _token, _users
    _secret = secret
    _token = token
    _users = users
    if max_payload_bytes:
        _max_bytes = max_payload_bytes


def current_user() -> str | None:
    """The user this process sends as (its token's), or None: the cluster secret's holder."""
    return _token.user if _token is not None else None


def users():
    """This process's view of the user table (None: it holds no cluster secret)."""
    return _users


def users_defined() -> bool:
    """Does the cluster have users, as far as this process can tell?"""
    return _users is not None and _users.any()


def last_signer() -> str | None:
    """The user whose signature the last message this thread checked carried (None: the cluster's)."""
    return getattr(_local, "signer", None)


def signer_of(body: bytes) -> str | None:
    """The user name a ``GL2`` body claims (not checked: call :func:`verify` for that), else None."""
    if isinstance(body, str):
        body = body.encode("latin-1")
    if body.startswith(USER_MAGIC) and len(body) > 4:
        return body[4: 4 + body[3]].decode(errors="replace")
    return None


@contextmanager
def sealed_to(user: str | None):
    """What is signed inside (a result) is sealed to ``user`` when the cluster knows that user."""
    before = getattr(_local, "recipient", None)
    _local.recipient = user
    try:
        yield
    finally:
        _local.recipient = before


def current_secret() -> bytes:
    """This process's cluster secret (for the processes it starts, such as ranks)."""
    return _need_secret()


def _need_secret() -> bytes:
    if not _secret and _token is not None:
        raise PayloadError(f"this needs the cluster secret, and this process holds user {_token.user}'s token "
                           "only: the object store (values over inline_limit_bytes, gpulayer.put) is not open to "
                           "tokens yet (docs/SECURITY.md); send smaller values, or run it where GPULAYER_SECRET is")
    if not _secret:
        raise PayloadError("no cluster secret is configured: set GPULAYER_SECRET to the cluster's secret "
                           "(`gpulayer up` writes one to its state file) or call gpulayer.init()")
    return _secret


def sign(data: bytes) -> bytes:
    if _token is not None:
        name = _token.user.encode()
        return USER_MAGIC + bytes([len(name)]) + name + _token.signing_key.sign(name + data) + data
    secret = _need_secret()
    if _users is not None:
        recipient = getattr(_local, "recipient", None)
        entry = _users.get(recipient) if recipient else None
        if entry is not None:
            return _seal(secret, entry, data)
        if _users.any():
            return CLUSTER_MAGIC + _cluster_key(secret).sign(data) + data
    return MAGIC + hmac.new(secret, data, hashlib.sha256).digest() + data


def verify(body: bytes) -> bytes:
    """The pickle inside ``body`` if its signature is right; else ``PayloadRejected``."""
    if isinstance(body, str):
        body = body.encode("latin-1")
    _local.signer = None
    if body.startswith(USER_MAGIC):
        return _verify_user(body)
    if body.startswith(CLUSTER_MAGIC) and len(body) >= 3 + _SIG_LEN:
        try:
            _cluster_public_key().verify(body[3:3 + _SIG_LEN], body[3 + _SIG_LEN:])
        except InvalidSignature:
            raise PayloadRejected("message signature does not match the cluster's key (forged, tampered, or "
                                  "from another cluster); refused without unpickling it") from None
        return body[3 + _SIG_LEN:]
    if body.startswith(SEALED_MAGIC):
        return _open(body)
    if not body.startswith(MAGIC) or len(body) < len(MAGIC) + _MAC_LEN:
        raise PayloadRejected("message is not signed by gpulayer; refused without unpickling it")
    if _token is not None and not _secret:
        raise PayloadRejected("message is signed with the cluster secret, which this process (holding user "
                              f"{_token.user}'s token) cannot check; refused without unpickling it")
    mac, data = body[len(MAGIC): len(MAGIC) + _MAC_LEN], body[len(MAGIC) + _MAC_LEN:]
    if not hmac.compare_digest(mac, hmac.new(_need_secret(), data, hashlib.sha256).digest()):
        raise PayloadRejected("message signature does not match the cluster secret (forged, tampered, "
                              "or signed with another cluster's secret); refused without unpickling it")
    return data


def _cluster_key(secret: bytes):
    from .users.token import cluster_key

    return cluster_key(secret)


def _cluster_public_key():
    from .users.token import ed25519_public, _b64

    if _secret:
        return _cluster_key(_secret).public_key()
    if _token is not None:
        return ed25519_public(_b64(_token.cluster_public))
    return _cluster_key(_need_secret()).public_key()


def _verify_user(body: bytes) -> bytes:
    from .users.token import ed25519_public

    n = body[3] if len(body) > 3 else 0
    name, sig, data = body[4:4 + n], body[4 + n:4 + n + _SIG_LEN], body[4 + n + _SIG_LEN:]
    user = name.decode(errors="replace")
    if not n or len(sig) != _SIG_LEN:
        raise PayloadRejected("message is not signed by gpulayer; refused without unpickling it")
    if _users is None:
        raise PayloadRejected(f"message is signed by user {user!r}, and this process holds no cluster secret "
                              "to check users against; refused without unpickling it")
    entry = _users.get(user)
    if entry is None:
        raise PayloadRejected(f"message is signed by user {user!r}, whom the cluster does not know (not in its "
                              "user table, or an entry not made with the cluster secret); refused without "
                              "unpickling it")
    if entry.revoked:
        raise PayloadRejected(f"message is signed by user {user!r}, whose token was revoked; refused without "
                              "unpickling it")
    try:
        ed25519_public(entry.keys["ed25519"]).verify(sig, name + data)
    except (InvalidSignature, KeyError, ValueError):
        raise PayloadRejected(f"message signature does not match user {user}'s key (forged, tampered, or an "
                              "older token of that name); refused without unpickling it") from None
    _local.signer = user
    return data


def _seal_key(shared: bytes, name: bytes, ephemeral: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"gpulayer sealed result\0" + name + ephemeral).derive(shared)


def _seal(secret: bytes, entry, data: bytes) -> bytes:
    from .users.token import raw_public, x25519_public

    name = entry.name.encode()
    ephemeral = X25519PrivateKey.generate()
    eph = raw_public(ephemeral)
    nonce = os.urandom(12)
    key = _seal_key(ephemeral.exchange(x25519_public(entry.keys["x25519"])), name, eph)
    inner = bytes([len(name)]) + name + eph + nonce + AESGCM(key).encrypt(nonce, data, name)
    return SEALED_MAGIC + _cluster_key(secret).sign(inner) + inner


def _open(body: bytes) -> bytes:
    sig, inner = body[3:3 + _SIG_LEN], body[3 + _SIG_LEN:]
    try:
        _cluster_public_key().verify(sig, inner)
    except InvalidSignature:
        raise PayloadRejected("sealed message signature does not match the cluster's key (forged or "
                              "tampered); refused without unpickling it") from None
    n = inner[0]
    name, eph, nonce, ct = inner[1:1 + n], inner[1 + n:33 + n], inner[33 + n:45 + n], inner[45 + n:]
    user = name.decode(errors="replace")
    if _token is None or _token.user != user:
        holder = f"user {_token.user}'s token" if _token is not None else "no user's token"
        raise PayloadRejected(f"this result is sealed to user {user!r}, and this process holds {holder}: only "
                              f"{user}'s token opens it")
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    shared = _token.sealing_key.exchange(X25519PublicKey.from_public_bytes(eph))
    try:
        return AESGCM(_seal_key(shared, name, eph)).decrypt(nonce, ct, name)
    except InvalidTag:
        raise PayloadRejected(f"result sealed to user {user!r} does not open with this token (an older token "
                              "of that name?)") from None


def dumps(obj) -> bytes:
    try:
        data = payload.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as err:
        raise PayloadError(f"cannot pickle the job's payload: {type(err).__name__}: {err}; "
                           "pass plain data, tensors or picklable objects") from err
    if len(data) > _max_bytes:
        # Values gpulayer can size (tensors, arrays, bytes, str, containers of them) over inline_limit_bytes go to
        # the object store on their own (tasks/refs.py); what is left here is an object it could not size.
        raise PayloadError(f"payload is {len(data) / 2**20:.1f} MiB, over the {_max_bytes / 2**20:.0f} MiB limit of "
                           "a message; send large data through the object store: ref = gpulayer.put(value), then "
                           "pass ref (a job may return one too), or raise GPULAYER_MAX_PAYLOAD_BYTES")
    return sign(data)


def loads(body: bytes):
    return pickle.loads(verify(body))


def register_serializer() -> None:
    register(NAME, dumps, loads, content_type=CONTENT_TYPE, content_encoding="binary")
