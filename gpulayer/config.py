"""Settings: built once, frozen.

Precedence, highest first:

1. keyword arguments (``gpulayer.init(broker_url=...)``, CLI flags);
2. environment variables ``GPULAYER_*`` (``GPULAYER_BROKER_URL``, ``GPULAYER_SECRET``, ...);
3. the config file: ``$GPULAYER_CONFIG``, else ``$GPULAYER_HOME/config.toml``;
4. the state file ``gpulayer up`` writes (``$GPULAYER_HOME/cluster.json``): broker URL and secret only;
5. defaults.

``config/gpulayer.example.toml`` documents every key.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import ssl
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from .errors import ConfigError
from .masking import mask_url
from .sentinel_url import SENTINEL_PASSWORD, is_sentinel_url, parse_sentinel_url
from .state_file import STATE_FILE_NAME, home_dir, read_state, state_path  # noqa: F401  (re-exported)

# TLS options of a rediss:// broker, named as redis-py, kombu and Celery name them (URL query or GPULAYER_SSL_*).
TLS_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
# What an acknowledged write means (store/durability.py): a replica confirmed it, or the primary has it.
REPLICATED, LOCAL = "replicated", "local"
STRICT = "strict"  # "replicated" with min_replicas at least 1: a write no replica confirmed is refused


def config_path() -> Path:
    return Path(os.environ.get("GPULAYER_CONFIG") or home_dir() / "config.toml").expanduser()


ENV_PREFIX = "GPULAYER_"


class Settings(BaseModel):
    """Everything gpulayer reads from its environment. See module docstring for precedence; ``load_settings``
    gathers the values (a plain model, not pydantic-settings': that library's import alone was a tenth of a
    one-job script's run)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    broker_url: str | None = Field(default=None, description="redis://[:password@]host:port/db of the cluster's Redis "
                                                            "(rediss://... for TLS), or sentinel://[:password@]"
                                                            "host:port[,host:port...]/<master name>[/<db>] of a "
                                                            "Sentinel group (sentinels://... for TLS)")
    sentinel_password: SecretStr | None = Field(default=None, description="sentinel:// only: the sentinels' own "
                                                                          "password (requirepass in sentinel.conf)")
    secret: SecretStr | None = Field(default=None, description="cluster secret that signs every message")
    token: SecretStr | None = Field(default=None, description="a user's token (`gpulayer users add` prints it): "
                                                              "this process sends as that user, and needs no "
                                                              "cluster secret")
    heartbeat_interval: float = Field(default=1.0, gt=0, description="seconds between worker heartbeats")
    worker_dead_after: float = Field(default=5.0, gt=0, description="seconds of silence before a worker is dead")
    registry_cache_seconds: float = Field(default=1.0, ge=0, description="how long a client reuses a registry snapshot")
    batch_chunk_size: int = Field(default=1000, gt=0, description="jobs per pipelined publish in submit_batch")
    result_expires: int = Field(default=86400, gt=0, description="seconds a job's result is kept (and the "
                                                                 "objects it holds in the object store)")
    max_payload_bytes: int = Field(default=64 * 2**20, gt=0, description="largest signed message body")
    object_store: str | None = Field(default=None, description="where values over inline_limit_bytes go: "
                                                              "s3://bucket/prefix, file:///path or a plain path "
                                                              "(a directory every host mounts at that path); "
                                                              "unset: the embedded cluster's own directory while "
                                                              "the broker is on this host, else none (a large "
                                                              "value is refused)")
    inline_limit_bytes: int = Field(default=2**20, gt=0, description="an argument or result larger than this "
                                                                      "travels as a reference to the object store, "
                                                                      "not inside its message")
    object_store_max_bytes: int | None = Field(default=None, gt=0, description="most bytes the object store may "
                                                                               "hold; unset: its disk's free "
                                                                               "space")
    object_cache_bytes: int | None = Field(default=None, gt=0, description="most bytes each host keeps of "
                                                                           "objects copied from a remote store "
                                                                           "(s3://); unset: 20% of the free "
                                                                           "disk space, at least 1 GiB")
    connect_timeout: float = Field(default=3.0, gt=0, description="seconds to wait for Redis before giving up")
    events: bool = Field(default=False, description="workers send Celery's task and worker-heartbeat events from "
                                                    "start; off, they send them once a monitor asks (Flower does, "
                                                    "and `celery control enable_events`)")
    log_jobs: bool = Field(default=False, description="workers log a line for every job received and every job "
                                                      "that succeeds (INFO); off, a job shows in the log when it "
                                                      "fails, is retried or is lost")
    prefetch_multiplier: int = Field(default=4, ge=0, le=64,
                                     description="messages a worker takes per free slot while no gang holds slots "
                                                 "on it, up to 4x that while its jobs are tiny (0 or 1: one per "
                                                 "free slot, no prefetch)")
    prefetch_hold: float = Field(default=1.0, ge=0, description="seconds prefetched messages wait on a worker whose "
                                                                "slots stay busy before they go back to their queue")
    fair_share_half_life: float = Field(default=86400.0, gt=0, description="seconds in which a user's recorded "
                                                                        "usage halves (Slurm's PriorityDecayHalfLife; "
                                                                        "fair share is on while gl:users holds a "
                                                                        "policy: docs/FAIRSHARE.md)")
    fair_share_weight: float = Field(default=1000.0, ge=0, description="weight of the fair-share factor in a user's "
                                                                      "priority (Slurm's PriorityWeightFairshare)")
    fair_share_age_weight: float = Field(default=0.0, ge=0, description="weight of a job's age in its priority "
                                                                        "(Slurm's PriorityWeightAge)")
    fair_share_priority_weight: float = Field(default=0.0, ge=0, description="weight of the user's policy "
                                                                             "priority in its priority")
    fair_share_max_age: float = Field(default=7 * 86400.0, gt=0, description="age at which a job's age factor "
                                                                             "reaches 1 (Slurm's PriorityMaxAge)")
    max_deliveries: int = Field(default=3, ge=1, le=100,
                                description="deliveries of a job whose process or worker dies, before it fails")
    preempt_grace: float = Field(default=30.0, ge=0, description="seconds a preempted gang's ranks have between "
                                                                 "SIGTERM and SIGKILL (to save a checkpoint)")
    preempt_min_runtime: float = Field(default=60.0, ge=0, description="seconds a gang must have run before a gang "
                                                                       "of higher priority may preempt it")
    log_to_client: bool = Field(default=True, description="print the output lines (print, logging) of the jobs "
                                                          "this process sends on its own stdout/stderr as they "
                                                          "come, prefixed (fn pid=N on worker); off, they are "
                                                          "only kept in each job's tail (handle.logs(), "
                                                          "`gpulayer logs ID`)")
    client_id: str | None = Field(default=None, description="who sends this process's jobs, recorded with each job "
                                                            "and gang for `gpulayer cancel --all-mine` "
                                                            "(default: user@host)")
    durability: str | None = Field(default=None, description="what an acknowledged write means: \"replicated\" "
                                                            "(a replica confirmed it: Redis WAIT; the default for "
                                                            "a sentinel:// broker; while no replica is in sync "
                                                            "writes go on, degraded), \"strict\" (replicated, "
                                                            "and refused while none confirms: min_replicas = 1) "
                                                            "or \"local\" (the primary has it; the default for "
                                                            "one Redis)")
    min_replicas: int = Field(default=0, ge=0, description="replicated: replicas that must confirm each write, "
                                                          "else it is refused (NotReplicated); 0: a write waits "
                                                          "for a replica in sync and, while none is, goes on "
                                                          "acknowledged by the primary alone (docs/RELIABILITY.md, Sentinel)")
    durability_timeout: float = Field(default=2.0, gt=0, description="replicated: seconds a write waits for a "
                                                                     "replica's confirmation before it counts as "
                                                                     "unconfirmed (docs/RELIABILITY.md, Sentinel)")
    ssl_cert_reqs: str | None = Field(default=None, description="rediss:// only: check Redis's certificate: "
                                                                "required (default), optional or none")
    ssl_ca_certs: str | None = Field(default=None, description="rediss:// only: CA file that signed Redis's "
                                                               "certificate (default: the system's CAs)")
    ssl_certfile: str | None = Field(default=None, description="rediss:// only: client certificate, for a Redis "
                                                               "with tls-auth-clients")
    ssl_keyfile: str | None = Field(default=None, description="rediss:// only: the client certificate's key")
    # Set by the loader, not by users: where broker_url came from.
    broker_from_state: bool = Field(default=False, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _tls_in_url(cls, data: Any) -> Any:
        """The broker URL carries its TLS options, so every process and client that gets the URL gets them."""
        if isinstance(data, dict) and data.get("broker_url"):
            url = with_tls(data["broker_url"], **{k: data.get(k) for k in TLS_OPTIONS})
            data = {**data, "broker_url": with_sentinel_password(url, data.get("sentinel_password"))}
        return data

    @field_validator("durability")
    @classmethod
    def _known_durability(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if value.strip().lower() in (REPLICATED, STRICT, LOCAL):
            return value.strip().lower()
        raise ConfigError(f"durability={value!r} (GPULAYER_DURABILITY or the config file) is not {REPLICATED!r}, "
                          f"{STRICT!r} or {LOCAL!r}: \"replicated\" waits for a replica in sync to confirm each "
                          "write (Redis WAIT) and goes on without while none is, \"strict\" refuses a write no "
                          "replica confirmed, \"local\" takes the primary's word; unset it for the broker's "
                          "default (replicated on a sentinel:// group, local on one Redis)")

    def durability_mode(self) -> str:
        """``durability``, or the broker's default: "replicated" for a Sentinel group, "local" otherwise
        ("strict" is "replicated" with :meth:`required_replicas` at least 1)."""
        mode = self.durability or (REPLICATED if is_sentinel_url(self.broker_url) else LOCAL)
        return REPLICATED if mode == STRICT else mode

    def required_replicas(self) -> int:
        """Replicas that must confirm a replicated write, else it is refused: ``min_replicas``, at least 1 for
        ``durability = "strict"``; 0: writes go on while no replica is in sync (store/durability.py)."""
        return max(self.min_replicas, 1) if self.durability == STRICT else self.min_replicas

    def client_identity(self) -> str:
        """The token's user, else ``client_id``, else ``user@host``: what `gpulayer cancel --all-mine` means by
        "mine"."""
        if self.token:
            return token_user(self.token.get_secret_value())
        if self.client_id:
            return self.client_id
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no name for this uid (a bare container)
            user = f"uid{os.getuid()}"
        return f"{user}@{socket.gethostname()}"

    def secret_bytes(self) -> bytes | None:
        return self.secret.get_secret_value().encode() if self.secret else None

    @field_validator("*", mode="before")
    @classmethod
    def _sizes(cls, value: Any, info) -> Any:
        """Every ``*_bytes`` setting takes a size with its unit (``400MB``, ``64MiB``) as well as a count of bytes;
        empty (the example config's way to leave one unset) is None."""
        if not info.field_name.endswith("_bytes"):
            return value
        return None if isinstance(value, str) and not value.strip() else parse_size(value, info.field_name)

    @field_validator("object_store")
    @classmethod
    def _store_or_none(cls, value: str | None) -> str | None:
        return value.strip() if value and value.strip() else None

    @field_validator("token", mode="before")
    @classmethod
    def _token_or_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    def __repr_args__(self):
        # repr and str (a notebook shows what init() returns) mask the broker URL's password; the secret is a
        # SecretStr already. The field itself keeps the URL whole: connections use it.
        for name, value in super().__repr_args__():
            yield name, (mask_url(value) if name == "broker_url" else value)


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*", re.IGNORECASE)
_UNITS = {"b": 1, **{f"{p}b": 1000 ** (i + 1) for i, p in enumerate("kmgt")},
          **{f"{p}ib": 1024 ** (i + 1) for i, p in enumerate("kmgt")}}


def token_user(token: str) -> str:
    """The user name a token carries (``users/token.py`` checks the rest where it is used)."""
    from .users.token import Token  # (config sits below users/: imported where a token is set)

    return Token.parse(token).user


def parse_size(value: Any, key: str = "size") -> Any:
    """A size in bytes from ``400MB``, ``64MiB``, ``2GiB``, ``1.5GB`` or ``67108864`` (any case; KB, MB, GB, TB are
    powers of 1000, KiB, MiB, GiB, TiB of 1024); anything but a string is left to the field's own check.

    >>> parse_size("64MiB"), parse_size("400MB"), parse_size("2 GiB")
    (67108864, 400000000, 2147483648)
    """
    if not isinstance(value, str):
        return value
    m = _SIZE.fullmatch(value)
    if not m:
        raise ConfigError(f"{key} = {value!r} ({ENV_PREFIX}{key.upper()} or the config file) is not a size: give bytes "
                          "(67108864) or a number and a unit (400MB, 64MiB, 2GiB; KB, MB, GB, TB are powers of "
                          "1000, KiB, MiB, GiB, TiB of 1024)")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "b").lower()])


def _from_file() -> dict[str, Any]:
    """The config file's ``[gpulayer]`` table."""
    path = config_path()
    if not path.exists():
        return {}
    try:
        return dict(tomllib.loads(path.read_text()).get("gpulayer", {}))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"cannot read config file {path}: {err}") from err


def _from_env() -> dict[str, str]:
    """``GPULAYER_<KEY>`` for each key of ``Settings`` (the name in any case); other variables are left alone."""
    env = {name.lower(): value for name, value in os.environ.items()}
    prefix = ENV_PREFIX.lower()
    return {key: env[prefix + key] for key in Settings.model_fields if prefix + key in env}


def load_settings(**overrides: Any) -> Settings:
    """Build the frozen settings; a clear ``ConfigError`` names any bad key."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        settings = Settings(**{**_from_file(), **_from_env(), **overrides})  # later ones win
    except ValidationError as err:
        for e in err.errors():  # a ConfigError from a validator already says it all
            if isinstance((e.get("ctx") or {}).get("error"), ConfigError):
                raise e["ctx"]["error"] from None
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"invalid gpulayer settings: {problems} (see config/gpulayer.example.toml)") from err
    if settings.broker_url is None:
        state = read_state()
        if state and state.get("broker_url"):
            # The state file names a whole cluster: its URL and its secret go together.
            secret = settings.secret or (SecretStr(state["secret"]) if state.get("secret") else None)
            url = with_tls(state["broker_url"], **{k: getattr(settings, k) for k in TLS_OPTIONS})
            password = settings.sentinel_password.get_secret_value() if settings.sentinel_password else None
            url = with_sentinel_password(url, password)
            settings = settings.model_copy(update={"broker_url": url, "secret": secret, "broker_from_state": True})
    return settings


def with_tls(url: str, **options: str | None) -> str:
    """``url`` with the TLS ``options`` (``ssl_ca_certs=...``) folded into its query, checked and normalised.

    ``redis://`` and ``sentinel://`` take none; ``rediss://`` and ``sentinels://`` check Redis's certificate unless told otherwise
    (``ssl_cert_reqs=required``, where kombu alone would default to not checking it). Other schemes are
    refused: gpulayer's transport, with the take a SIGKILL cannot lose, speaks Redis over TCP or TLS only.

    >>> with_tls("rediss://:pw@redis:6380/0", ssl_ca_certs=None)
    'rediss://:pw@redis:6380/0?ssl_cert_reqs=required'
    """
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "sentinel", "sentinels"):
        raise ConfigError(f"the broker URL ({parts.scheme or 'no scheme'}://...) is not a Redis URL gpulayer can use: "
                          "its transport takes messages from Redis over TCP or TLS only (no unix sockets); use "
                          "redis://[:password@]host:port/db, rediss://... for TLS, or sentinel://[:password@]"
                          "host:port[,host:port...]/<master name>[/<db>] for a Sentinel group")
    if is_sentinel_url(url):
        parse_sentinel_url(url)  # a clear error for a malformed one, before anything connects
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    given = {k: v for k, v in options.items() if v}  # empty: not set (the example config's way to say so)
    if unknown := set(given) - set(TLS_OPTIONS):
        raise ConfigError(f"unknown TLS options {sorted(unknown)}; gpulayer takes {', '.join(TLS_OPTIONS)}")
    if parts.scheme in ("redis", "sentinel"):
        tls = sorted({k for k in (*query, *given) if k in TLS_OPTIONS})
        if tls:
            raise ConfigError(f"TLS options ({', '.join(tls)}) are set but the broker URL is {parts.scheme}:// (no "
                              f"TLS); use {parts.scheme}s://... to connect with TLS, or drop them")
        return url
    for key, value in given.items():
        if query.get(key, value) != value:
            raise ConfigError(f"{key} is {query[key]!r} in the broker URL but {value!r} in the settings "
                              f"(GPULAYER_{key.upper()} or the config file); set it in one place")
        query[key] = value
    reqs = query.setdefault("ssl_cert_reqs", "required")
    query["ssl_cert_reqs"] = reqs.lower().removeprefix("cert_")  # CERT_REQUIRED, as Celery spells it, too
    if query["ssl_cert_reqs"] not in _CERT_REQS:
        raise ConfigError(f"ssl_cert_reqs={reqs!r} is not one of {', '.join(_CERT_REQS)}")
    for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if key in query and not os.path.isfile(query[key]):
            raise ConfigError(f"{key}={query[key]} is not a file; give the path of the PEM file on this machine")
    return urlunsplit(parts._replace(query=urlencode(query)))


def with_sentinel_password(url: str, password: str | SecretStr | None) -> str:
    """``url`` with the sentinels' own password (``GPULAYER_SENTINEL_PASSWORD``) in its query, so every process
    that gets the URL reaches the sentinels; a clear error when the URL is not a Sentinel group's."""
    if isinstance(password, SecretStr):
        password = password.get_secret_value()
    if not password:
        return url
    if not is_sentinel_url(url):
        raise ConfigError("GPULAYER_SENTINEL_PASSWORD (sentinel_password) is set but the broker URL is not a "
                          "Sentinel group's; unset it, or point GPULAYER_BROKER_URL at the group as "
                          "sentinel://host:port[,host:port...]/<master name>")
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if query.get(SENTINEL_PASSWORD, password) != password:
        raise ConfigError("the sentinels' password is in the broker URL and in GPULAYER_SENTINEL_PASSWORD, "
                          "and they differ; set it in one place")
    query[SENTINEL_PASSWORD] = password
    return urlunsplit(parts._replace(query=urlencode(query)))


def tls_options(url: str) -> dict[str, Any]:
    """The TLS options of a URL ``with_tls`` made, as kombu's ``broker_use_ssl`` and Celery's
    ``redis_backend_use_ssl`` take them; empty for ``redis://``."""
    parts = urlsplit(url)
    if parts.scheme not in ("rediss", "sentinels"):
        return {}
    options: dict[str, Any] = {k: v for k, v in parse_qsl(parts.query) if k in TLS_OPTIONS}
    options["ssl_cert_reqs"] = _CERT_REQS[options.get("ssl_cert_reqs", "required")]
    return options
