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

import json
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from .errors import ConfigError

STATE_FILE_NAME = "cluster.json"


def home_dir() -> Path:
    """``$GPULAYER_HOME`` or ``~/.gpulayer``: the embedded cluster's data and state."""
    return Path(os.environ.get("GPULAYER_HOME") or "~/.gpulayer").expanduser()


def config_path() -> Path:
    return Path(os.environ.get("GPULAYER_CONFIG") or home_dir() / "config.toml").expanduser()


def state_path() -> Path:
    return home_dir() / STATE_FILE_NAME


def read_state(path: Path | None = None) -> dict[str, Any] | None:
    """The state file ``gpulayer up`` wrote, or None when there is none."""
    path = path or state_path()
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read the local cluster's state file {path}: {err}; "
                          "run `gpulayer down` then `gpulayer up` to write it again") from err


class Settings(BaseSettings):
    """Everything gpulayer reads from its environment. See module docstring for precedence."""

    model_config = SettingsConfigDict(env_prefix="GPULAYER_", frozen=True, extra="forbid")

    broker_url: str | None = Field(default=None, description="redis://[:password@]host:port/db of the cluster's Redis")
    secret: SecretStr | None = Field(default=None, description="cluster secret that signs every message")
    heartbeat_interval: float = Field(default=1.0, gt=0, description="seconds between worker heartbeats")
    worker_dead_after: float = Field(default=5.0, gt=0, description="seconds of silence before a worker is dead")
    registry_cache_seconds: float = Field(default=1.0, ge=0, description="how long a client reuses a registry snapshot")
    batch_chunk_size: int = Field(default=1000, gt=0, description="jobs per pipelined publish in submit_batch")
    result_expires: int = Field(default=7 * 86400, gt=0, description="seconds a job's result is kept")
    max_payload_bytes: int = Field(default=64 * 2**20, gt=0, description="largest signed message body")
    connect_timeout: float = Field(default=3.0, gt=0, description="seconds to wait for Redis before giving up")
    max_deliveries: int = Field(default=3, ge=1, le=100,
                                description="deliveries of a job whose process or worker dies, before it fails")
    # Set by the loader, not by users: where broker_url came from.
    broker_from_state: bool = Field(default=False, exclude=True)

    @field_validator("broker_url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"{v!r} is not a Redis URL; expected redis://[:password@]host:port/db")
        return v

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))

    def secret_bytes(self) -> bytes | None:
        return self.secret.get_secret_value().encode() if self.secret else None


class _FileSource(PydanticBaseSettingsSource):
    """The config file's ``[gpulayer]`` table."""

    def get_field_value(self, field, field_name):  # pragma: no cover - unused; __call__ does the work
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = config_path()
        if not path.exists():
            return {}
        try:
            return dict(tomllib.loads(path.read_text()).get("gpulayer", {}))
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise ConfigError(f"cannot read config file {path}: {err}") from err


def load_settings(**overrides: Any) -> Settings:
    """Build the frozen settings; a clear ``ConfigError`` names any bad key."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        settings = Settings(**overrides)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"invalid gpulayer settings: {problems} (see config/gpulayer.example.toml)") from err
    if settings.broker_url is None:
        state = read_state()
        if state and state.get("broker_url"):
            # The state file names a whole cluster: its URL and its secret go together.
            secret = settings.secret or (SecretStr(state["secret"]) if state.get("secret") else None)
            settings = settings.model_copy(update={"broker_url": state["broker_url"], "secret": secret,
                                                   "broker_from_state": True})
    return settings
