"""Boundary models: what crosses an API call, a CLI flag or the registry.

Validated once where data enters; plain values inside.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Resources(BaseModel):
    """What a job needs from the worker that runs it.

    >>> Resources(cuda=True, zone="europe-west1-b")
    Resources(cuda=True, gpus=1, zone='europe-west1-b', region=None, worker_ids=None)

    ``gpus`` counts GPUs per process and implies ``cuda``; ``worker_ids`` pins
    the job to one of the named workers.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cuda: bool = False
    gpus: int = Field(default=0, ge=0, le=64)
    zone: str | None = None
    region: str | None = None
    worker_ids: tuple[str, ...] | None = None

    @field_validator("zone", "region")
    @classmethod
    def _non_empty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must be a non-empty name or None")
        return v

    @field_validator("worker_ids", mode="before")
    @classmethod
    def _ids(cls, v):
        if isinstance(v, str):
            v = (v,)
        if v is not None and len(v) == 0:
            raise ValueError("must name at least one worker, or be None")
        return v

    @model_validator(mode="after")
    def _cuda_implies_gpu(self) -> Resources:
        if self.gpus > 0 and not self.cuda:
            object.__setattr__(self, "cuda", True)
        if self.cuda and self.gpus == 0:
            object.__setattr__(self, "gpus", 1)
        return self

    def describe(self) -> str:
        """A short human summary, e.g. ``cuda x1 zone=europe-west1-b``."""
        parts = [f"cuda x{self.gpus}" if self.cuda else "cpu"]
        if self.zone:
            parts.append(f"zone={self.zone}")
        if self.region:
            parts.append(f"region={self.region}")
        if self.worker_ids:
            parts.append("on " + ",".join(self.worker_ids))
        return " ".join(parts)


class WorkerInfo(BaseModel):
    """One worker's advertised capabilities, as heartbeated into the registry."""

    model_config = ConfigDict(frozen=True)

    id: str
    hostname: str
    address: str
    zone: str | None = None
    region: str | None = None
    gpus: int = 0
    gpu_names: tuple[str, ...] = ()
    slots: int = 1
    busy: int = 0
    pid: int = 0
    started_at: float = 0.0
    # Filled in by the snapshot reader from Redis's clock, not by the worker.
    heartbeat_age: float = 0.0

    @property
    def cuda(self) -> bool:
        return self.gpus > 0

    @property
    def free(self) -> int:
        return max(0, self.slots - self.busy)

    def describe(self) -> str:
        kind = f"cuda x{self.gpus}" if self.cuda else "cpu"
        where = " ".join(x for x in (self.zone, self.region) if x) or "no zone"
        return f"{self.id} {kind} {where}"


class JobStatus(str, Enum):
    PENDING = "PENDING"
    STARTED = "STARTED"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    REVOKED = "REVOKED"
