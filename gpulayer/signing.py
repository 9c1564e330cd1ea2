"""The signed serializer every gpulayer message and result goes through.

Body = ``MAGIC`` + HMAC-SHA256(secret, pickle) + pickle. The MAC is checked
before a single byte is unpickled, so anyone who can write to Redis but lacks
the cluster secret cannot make a worker run code.
"""

from __future__ import annotations

import hashlib
import hmac
import pickle

from kombu.serialization import register

from . import payload
from .errors import PayloadError, PayloadRejected

NAME = "gpulayer"
CONTENT_TYPE = "application/x-gpulayer-signed"
MAGIC = b"GL1"
_MAC_LEN = 32

_secret: bytes | None = None
_max_bytes: int = 64 * 2**20


def configure(secret: bytes | None, max_payload_bytes: int | None = None) -> None:
    """Set this process's cluster secret (and size limit) for signing and checking."""
    global _secret, _max_bytes
    _secret = secret
    if max_payload_bytes:
        _max_bytes = max_payload_bytes


def current_secret() -> bytes:
    """This process's cluster secret (for the processes it starts, such as ranks)."""
    return _need_secret()


def _need_secret() -> bytes:
    if not _secret:
        raise PayloadError("no cluster secret is configured: set GPULAYER_SECRET to the cluster's secret "
                           "(`gpulayer up` writes one to its state file) or call gpulayer.init()")
    return _secret


def sign(data: bytes) -> bytes:
    return MAGIC + hmac.new(_need_secret(), data, hashlib.sha256).digest() + data


def verify(body: bytes) -> bytes:
    """The pickle inside ``body`` if its MAC is right; else ``PayloadRejected``."""
    if isinstance(body, str):
        body = body.encode("latin-1")
    if not body.startswith(MAGIC) or len(body) < len(MAGIC) + _MAC_LEN:
        raise PayloadRejected("message is not signed by gpulayer; refused without unpickling it")
    mac, data = body[len(MAGIC): len(MAGIC) + _MAC_LEN], body[len(MAGIC) + _MAC_LEN:]
    if not hmac.compare_digest(mac, hmac.new(_need_secret(), data, hashlib.sha256).digest()):
        raise PayloadRejected("message signature does not match the cluster secret (forged, tampered, "
                              "or signed with another cluster's secret); refused without unpickling it")
    return data


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
