"""gpulayer: run PyTorch work on a fleet of machines, on Celery and Redis.

>>> import gpulayer
>>> from gpulayer import submit, Resources
>>> gpulayer.init()                      # GPULAYER_BROKER_URL, else `gpulayer up`, else an embedded cluster
>>> submit.delay(pow, 2, 10).get()
1024

The public names load on first use (PEP 562): ``import gpulayer`` and ``gpulayer status``
import neither the Celery app nor the client until a name that needs them is touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time each name loads on first use
    from celery import group

    from .client import BatchHandle, connect, init, submit_batch, wait_for_workers
    from .errors import (ClusterUnavailable, ConfigError, DurabilityDegraded, GangFailed, GpulayerError, InvalidRequest,
                         JobFailed, JobRejected, JobStopped, JobTimeout, NotReplicated, ObjectMissing, ObjectStoreFull,
                         PayloadError, PayloadRejected, UnsupportedOption)
    from .distributed_job import GangHandle, distributed, init_process_group
    from .models import Resources, WorkerInfo
    from .objects.api import free, get, put
    from .objects.ref import ObjectRef
    from .job_handle import JobHandle, submit
    from .procs.runtime import current_job, current_worker

# public name -> the module that defines it (names of errors and models are cheap: no Celery, no torch)
_WHERE = {
    "group": "celery",
    **dict.fromkeys(("BatchHandle", "connect", "init", "submit_batch", "wait_for_workers"), "gpulayer.client"),
    **dict.fromkeys(("ClusterUnavailable", "ConfigError", "DurabilityDegraded", "GangFailed", "GpulayerError",
                     "InvalidRequest", "JobFailed", "JobRejected",
                     "JobStopped", "JobTimeout", "NotReplicated", "PayloadError", "PayloadRejected",
                     "ObjectMissing", "ObjectStoreFull", "UnsupportedOption"), "gpulayer.errors"),
    **dict.fromkeys(("GangHandle", "distributed", "init_process_group"), "gpulayer.distributed_job"),
    **dict.fromkeys(("Resources", "WorkerInfo"), "gpulayer.models"),
    **dict.fromkeys(("JobHandle", "submit"), "gpulayer.job_handle"),
    **dict.fromkeys(("put", "get", "free"), "gpulayer.objects.api"),
    "ObjectRef": "gpulayer.objects.ref",
    **dict.fromkeys(("current_job", "current_worker"), "gpulayer.procs.runtime"),
}

__all__ = [
    "BatchHandle", "ClusterUnavailable", "DurabilityDegraded", "GangHandle", "distributed", "init_process_group", "ConfigError", "GpulayerError", "InvalidRequest", "JobFailed", "JobHandle", "JobRejected",
    "NotReplicated", "PayloadError", "PayloadRejected", "UnsupportedOption", "GangFailed", "JobStopped", "JobTimeout", "Resources", "WorkerInfo", "connect", "current_job", "current_worker",
    "group", "init", "submit", "submit_batch", "wait_for_workers",
    "ObjectMissing", "ObjectRef", "ObjectStoreFull", "free", "get", "put",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'gpulayer' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # the next lookup is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
