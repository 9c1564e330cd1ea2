"""A user's token, and the keys derived from it and from the cluster secret.

A token is ``glt1.`` + base64url(JSON ``{"u": name, "s": seed, "c": cluster public key}``): the user's name,
a random 32-byte Ed25519 seed (the user's only secret: it signs what the user sends, and its X25519 twin
opens results sealed to the user), and the cluster's Ed25519 public key (what the user checks the workers'
signatures with). Nothing here touches Redis.

The cluster's own keys are derived from the cluster secret, so every process holding it (workers, ranks,
the admin) has them without any more configuration: an Ed25519 key that signs what workers send to users,
and an HMAC key that MACs the entries of the user table.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ..errors import ConfigError

PREFIX = "glt1."
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def raw_public(key) -> bytes:
    """The raw 32 bytes of a key's public half (of a private key, or of a public key)."""
    public = key.public_key() if hasattr(key, "public_key") else key
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


def check_name(name: str) -> str:
    """``name`` if it is a valid user name (letters, digits, ``. _ @ -``, up to 64), else ``ConfigError``."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"user name {name!r} is not valid: use 1-64 letters, digits, '.', '_', '@' or '-', "
                          "starting with a letter or digit")
    return name


@dataclass(frozen=True)
class Token:
    """What a user holds. ``str(token)`` is what `gpulayer users add` prints once."""

    user: str
    seed: bytes
    cluster_public: bytes

    def __str__(self) -> str:
        body = json.dumps({"u": self.user, "s": _b64(self.seed), "c": _b64(self.cluster_public)},
                          separators=(",", ":"))
        return PREFIX + _b64(body.encode())

    def __repr__(self) -> str:  # never the seed
        return f"Token(user={self.user!r})"

    @classmethod
    def new(cls, user: str, cluster_public: bytes) -> Token:
        return cls(check_name(user), os.urandom(32), cluster_public)

    @classmethod
    def parse(cls, text: str) -> Token:
        """The token ``text`` names; ``ConfigError`` saying what is wrong with it otherwise."""
        text = (text or "").strip()
        try:
            if not text.startswith(PREFIX):
                raise ValueError(f"it does not start with {PREFIX!r}")
            fields = json.loads(_unb64(text[len(PREFIX):]))
            token = cls(check_name(fields["u"]), _unb64(fields["s"]), _unb64(fields["c"]))
            if len(token.seed) != 32 or len(token.cluster_public) != 32:
                raise ValueError("a key has the wrong length")
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"GPULAYER_TOKEN is not a gpulayer token ({err}); copy the whole line "
                              "`gpulayer users add` printed") from None
        return token

    @property
    def signing_key(self) -> Ed25519PrivateKey:
        return _ed25519(self.seed)

    @property
    def sealing_key(self) -> X25519PrivateKey:
        """The X25519 key that opens results sealed to this user (derived from the seed)."""
        return _x25519(self.seed)

    def public_keys(self) -> dict[str, str]:
        """The entry's public halves: ``{"ed25519": ..., "x25519": ...}`` (base64url)."""
        return {"ed25519": _b64(raw_public(self.signing_key)), "x25519": _b64(raw_public(self.sealing_key))}


@lru_cache(maxsize=64)
def _ed25519(seed: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(seed)


@lru_cache(maxsize=64)
def _x25519(seed: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(hashlib.sha256(b"gpulayer x25519\0" + seed).digest())


@lru_cache(maxsize=256)
def ed25519_public(b64: str) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(_unb64(b64))


@lru_cache(maxsize=256)
def x25519_public(b64: str) -> X25519PublicKey:
    return X25519PublicKey.from_public_bytes(_unb64(b64))


@lru_cache(maxsize=8)
def cluster_key(secret: bytes) -> Ed25519PrivateKey:
    """The cluster's Ed25519 key: what workers sign messages to users with (public half in every token)."""
    return Ed25519PrivateKey.from_private_bytes(hmac.new(secret, b"gpulayer cluster ed25519", "sha256").digest())


def cluster_public(secret: bytes) -> bytes:
    return raw_public(cluster_key(secret))


def table_mac_key(secret: bytes) -> bytes:
    """The HMAC key of the user table's entries (distinct from the message MAC's key, the secret itself)."""
    return hmac.new(secret, b"gpulayer users table", "sha256").digest()
