"""Flower on gpulayer's Celery app (it needs the cluster secret to read signed replies)."""

from __future__ import annotations

import ipaddress
import os

from .errors import ConfigError


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def run_flower(*, broker: str | None = None, port: int = 5555, address: str = "127.0.0.1",
               basic_auth: str | None = None) -> int:
    from .app import app
    from .client import init

    basic_auth = basic_auth or os.environ.get("FLOWER_BASIC_AUTH")
    if not _loopback(address) and not basic_auth:
        raise ConfigError(f"Flower bound to {address} would be open to the network: pass --basic-auth user:password "
                          "(or set FLOWER_BASIC_AUTH), or bind to 127.0.0.1")
    if basic_auth and ":" not in basic_auth:
        raise ConfigError("--basic-auth must be user:password")
    init(broker)
    argv = ["flower", f"--port={port}", f"--address={address}"]
    if basic_auth:
        os.environ["FLOWER_BASIC_AUTH"] = basic_auth  # not in argv, where `ps` would show it
    app.start(argv)
    return 0
