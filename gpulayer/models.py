"""Boundary models: what crosses an API call, a CLI flag or the registry.

Validated once where data enters; plain values inside.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import InvalidRequest

# What a rule says, by pydantic's error type (its ``ctx`` fills the braces); others keep pydantic's message.
_RULES = {"greater_than_equal": "must be at least {ge}", "greater_than": "must be greater than {gt}",
          "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}",
          "int_parsing": "must be a whole number", "int_type": "must be a whole number",
          "int_from_float": "must be a whole number", "bool_parsing": "must be True or False",
          "bool_type": "must be True or False", "string_type": "must be a string (a name)"}


def describe_invalid(model: type[BaseModel], err: ValidationError, name: str | None = None) -> str:
    """pydantic's ``err`` about ``model``'s fields in one line: each field named, with what was given and the
    rule, and for a field that does not exist the nearest ones. ``name``: what the user called (default the
    model's name).

    >>> Resources(gpus=-1)
    Traceback (most recent call last):
    gpulayer.errors.InvalidRequest: Resources(gpus=-1): gpus must be at least 0
    """
    import difflib

    called = name or model.__name__
    fields = list(model.model_fields)
    faults = []
    for e in err.errors(include_url=False):
        top = str(e["loc"][0]) if e["loc"] else ""
        field = ".".join(str(part) for part in e["loc"])
        given = f"{top}={e['input']!r}" if top else ""
        if e["type"] == "extra_forbidden":
            close = difflib.get_close_matches(top, fields, n=2, cutoff=0.5)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            faults.append(f"{called}({given}): no field {top!r}; {hint}(fields: {', '.join(fields)})")
            continue
        rule = _RULES.get(e["type"])
        rule = rule.format(**e.get("ctx", {})) if rule else \
            e["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
        faults.append(f"{called}({given}): {field} {rule}" if field else f"{called}: {rule}")
    return "; ".join(faults)


class _Request(BaseModel):
    """A model a user builds by hand: a bad field is an ``InvalidRequest`` in one line, not pydantic's report."""

    def __init__(self, **data):
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise InvalidRequest(describe_invalid(type(self), err), err.errors(include_url=False)) from None


class Resources(_Request):
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
    busy: int = 0  # slots running ordinary jobs
    held: int = 0  # slots gangs hold (reserved or running ranks)
    pid: int = 0
    started_at: float = 0.0
    # Filled in by the snapshot reader from Redis's clock, not by the worker.
    heartbeat_age: float = 0.0

    @property
    def cuda(self) -> bool:
        return self.gpus > 0

    @property
    def free(self) -> int:
        return max(0, self.slots - self.busy - self.held)

    def describe(self) -> str:
        kind = f"cuda x{self.gpus}" if self.cuda else "cpu"
        where = " ".join(x for x in (self.zone, self.region) if x) or "no zone"
        return f"{self.id} {kind} {where}"


class WorkdirSpec(BaseModel):
    """A gang that ships a working directory (``gpulayer train``): each node's agent unpacks it once,
    and every rank of that node runs in it, across restarts (``gpulayer/gang/workdir.py``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keep: bool = False  # leave the directories on the workers at the end (--keep-workdir)
    pull: bool = True  # node 0's new and changed files come back to the client (--no-pull turns it off)
    max_pull_bytes: int = Field(default=48 * 2**20, ge=0)
    # Where a restarted attempt's nodes start: node 0's files at the end of the failed attempt, as a shared
    # file system would show them ("node0"); each worker's own directory ("own"); the shipped copy ("fresh").
    restart_from: Literal["node0", "own", "fresh"] = "node0"


class GangSpec(BaseModel):
    """A distributed job: ``nodes`` workers x ``procs_per_node`` processes each."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gang_id: str
    nodes: int = Field(ge=1, le=4096)
    procs_per_node: int = Field(ge=1, le=512)
    resources: Resources = Resources()
    backend: Literal["gloo", "nccl"] = "gloo"
    launcher: Literal["direct", "torchrun"] = "direct"
    timeout: float | None = Field(default=None, gt=0)
    max_restarts: int = Field(default=0, ge=0, le=100)
    name: str = "job"
    workdir: WorkdirSpec | None = None  # the ranks' cwd: a copy of the code (``code``), per node
    warm: bool = True  # direct launcher: fork ranks from the worker's warm template (False: fresh interpreters)
    client: str | None = None  # the identity that sent it (config ``client_id``): `gpulayer cancel --all-mine`
    output: str | None = None  # the sending process's output id: where its ranks' lines go (gpulayer/output/)
    code: str | None = None  # the digest of the user's code its ranks import from (gpulayer/workspace/)
    # Higher wins: a waiting gang of higher priority is placed first and may preempt running gangs of lower
    # priority (gpulayer/preemption.py); 0, the default, is the lowest and preempts nothing.
    priority: int = Field(default=0, ge=0, le=9)

    @model_validator(mode="after")
    def _nccl_needs_cuda(self) -> GangSpec:
        if self.backend == "nccl" and not self.resources.cuda:
            raise ValueError("backend='nccl' runs on CUDA GPUs only: give resources=Resources(cuda=True) "
                             "(or gpus=N), or use backend='gloo' for CPU ranks")
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


class GangPlacement(BaseModel):
    """Which workers run a gang (index = node rank), and why there."""

    model_config = ConfigDict(frozen=True)

    workers: tuple[str, ...]
    addresses: tuple[str, ...]
    hosts: tuple[str, ...] = ()
    reason: str

    def __str__(self) -> str:
        return f"{self.reason}: " + ", ".join(f"node {i} {w} ({a})" for i, (w, a) in
                                              enumerate(zip(self.workers, self.addresses)))


class GangState(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        return self in (GangState.SUCCEEDED, GangState.FAILED, GangState.CANCELLED)


class JobStatus(str, Enum):
    PENDING = "PENDING"
    STARTED = "STARTED"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    REVOKED = "REVOKED"
