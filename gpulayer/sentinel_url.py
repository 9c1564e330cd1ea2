"""The broker URL of a Redis Sentinel group, read into what a connection needs: a pure parser.

``sentinel://[:password@]host:port[,host:port...]/<master name>[/<db>]`` names the sentinels to ask and the
group (Sentinel's "master name") whose primary gpulayer connects to; ``sentinels://`` is the same over TLS,
to the sentinels and the Redis servers alike, with the options ``rediss://`` takes (``ssl_ca_certs=...``).
The password is the Redis servers' (``requirepass``); the sentinels' own, when they have one
(``requirepass`` in sentinel.conf), comes from ``GPULAYER_SENTINEL_PASSWORD`` and travels in the URL's
query as ``sentinel_password`` (``config.with_tls`` puts it there), so every process that gets the URL
connects the same way.

>>> t = parse_sentinel_url("sentinel://:pw@10.0.0.1:26379,10.0.0.2:26379/gpulayer/2")
>>> t.sentinels, t.service, t.db, t.password, t.tls
((('10.0.0.1', 26379), ('10.0.0.2', 26379)), 'gpulayer', 2, 'pw', False)
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote

from .errors import ConfigError

SCHEMES = ("sentinel", "sentinels")
DEFAULT_PORT = 26379  # Sentinel's own port
SENTINEL_PASSWORD = "sentinel_password"  # the query key that carries GPULAYER_SENTINEL_PASSWORD
FORM = "sentinel://[:password@]host:port[,host:port...]/<master name>[/<db>]"


@dataclass(frozen=True)
class SentinelTarget:
    """A Sentinel group as a broker: whom to ask, which group, and how to talk to its servers."""

    sentinels: tuple[tuple[str, int], ...]
    service: str  # the group's name in sentinel.conf (``sentinel monitor <name> ...``)
    db: int = 0
    password: str | None = None  # the Redis servers'
    username: str | None = None
    sentinel_password: str | None = None  # the sentinels' own
    tls: bool = False
    tls_options: dict[str, str] = field(default_factory=dict)  # ssl_* as rediss:// takes them

    def key(self) -> tuple:
        """What tells two targets' sentinels apart (one ``redis.sentinel.Sentinel`` per key in a process)."""
        return (self.sentinels, self.sentinel_password, self.tls, tuple(sorted(self.tls_options.items())))


def is_sentinel_url(url: str | None) -> bool:
    return bool(url) and url.split("://", 1)[0].lower() in SCHEMES


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The :class:`SentinelTarget` of a ``sentinel://`` or ``sentinels://`` URL; ``ConfigError`` naming the fix."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ConfigError(f"not a Sentinel URL ({scheme or 'no scheme'}://...); write it as {FORM}")
    if ";" in rest or "sentinel://" in rest.lower():
        raise ConfigError("separate the sentinels with commas in one URL (sentinel://h1:26379,h2:26379/mymaster), "
                          "not with ';' and a scheme each as kombu does")
    rest, _, query = rest.partition("?")
    rest, _, fragment = rest.partition("#")
    userinfo, at, hostpart = rest.rpartition("@")
    hosts, slash, path = hostpart.partition("/")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(pw) if colon else None)
        if not colon:  # sentinel://pw@host is a user name in URL syntax; say how to write a password
            raise ConfigError("the Sentinel URL has a user name but no password before '@'; if that is the Redis "
                              "servers' password, write a ':' before it, as in a redis:// URL")
    sentinels = tuple(_address(h) for h in hosts.split(",")) if hosts.strip() else ()
    if not sentinels:
        raise ConfigError(f"the Sentinel URL names no sentinel; write it as {FORM}")
    segments = [unquote(s) for s in path.split("/")] if slash and path else []
    if not segments or not segments[0]:
        raise ConfigError("the Sentinel URL names no group: append the master name the sentinels monitor "
                          "(`sentinel monitor <name> ...` in sentinel.conf), e.g. "
                          f"{scheme}://{hosts}/mymaster")
    if len(segments) > 2 or (len(segments) == 2 and not segments[1]):
        raise ConfigError(f"the Sentinel URL's path /{path} has more than a group and a db; write it as {FORM}")
    db = _db(segments[1]) if len(segments) == 2 else 0
    options = dict(parse_qsl(query, keep_blank_values=True))
    sentinel_password = options.pop(SENTINEL_PASSWORD, None) or None
    tls_options = {k: v for k, v in options.items() if k.startswith("ssl_")}
    unknown = sorted(set(options) - set(tls_options))
    if unknown:
        raise ConfigError(f"the Sentinel URL has options gpulayer does not take ({', '.join(unknown)}); it takes "
                          "the TLS options of rediss:// (ssl_cert_reqs, ssl_ca_certs, ssl_certfile, ssl_keyfile) "
                          "with sentinels://, and the sentinels' password from GPULAYER_SENTINEL_PASSWORD")
    if tls_options and scheme.lower() == "sentinel":
        raise ConfigError(f"TLS options ({', '.join(sorted(tls_options))}) are set but the broker URL is "
                          "sentinel:// (no TLS); use sentinels://... to connect with TLS, or drop them")
    return SentinelTarget(sentinels=sentinels, service=segments[0], db=db, password=password, username=username,
                          sentinel_password=sentinel_password, tls=scheme.lower() == "sentinels",
                          tls_options=tls_options)


def broker_hosts(url: str) -> list[str]:
    """The hosts a broker URL names: the sentinels' for a Sentinel group, else the one Redis host."""
    if is_sentinel_url(url):
        return [host for host, _ in parse_sentinel_url(url).sentinels]
    from urllib.parse import urlsplit

    return [urlsplit(url).hostname or "localhost"]


def _address(text: str) -> tuple[str, int]:
    host, colon, port = text.strip().rpartition(":") if ":" in text else (text.strip(), "", "")
    host = host.strip("[]")  # [::1]:26379
    if not host:
        raise ConfigError(f"sentinel address {text!r} has no host; write host:port, e.g. 10.0.0.1:26379")
    if not colon:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"sentinel address {text!r} has no valid port; write host:port with a port from 1 to "
                          f"65535 (Sentinel's own is {DEFAULT_PORT})")
    return host, int(port)


def _db(text: str) -> int:
    if not text.isdigit():
        raise ConfigError(f"the Sentinel URL's db {text!r} is not a number; write /<master name>/<db> with db a "
                          "number such as 0")
    return int(text)


def primary_url(target: SentinelTarget, host: str, port: int) -> str:
    """A ``redis://`` (or ``rediss://``) URL for one server of the group, for a tool that needs one address."""
    auth = f":{target.password}@" if target.password else ""
    return f"{'rediss' if target.tls else 'redis'}://{auth}{host}:{port}/{target.db}"


def is_loopback_host(host: str) -> bool:
    """``host`` (a name or an address) is this machine: ``localhost`` or a loopback address. The one test, for
    the worker's broker (a password needed beyond loopback) and the monitor's listening address (auth needed)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback(url: str) -> bool:
    """Every host the broker URL names (each sentinel of a Sentinel group) is this machine."""
    return all(is_loopback_host(host) for host in broker_hosts(url))
