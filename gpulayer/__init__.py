"""gpulayer: run PyTorch work on a fleet of machines, on Celery and Redis.

>>> import gpulayer
>>> from gpulayer import submit, Resources
>>> gpulayer.init()                      # GPULAYER_BROKER_URL, else `gpulayer up`, else an embedded cluster
>>> submit.delay(pow, 2, 10).get()
1024
"""

from celery import group

from .client import BatchHandle, connect, init, submit_batch, wait_for_workers
from .gang.handle import GangHandle, distributed, init_process_group
from .errors import (ClusterUnavailable, ConfigError, GangFailed, GpulayerError, JobFailed, JobRejected,
                     JobStopped, PayloadError, PayloadRejected, UnsupportedOption)
from .models import Resources, WorkerInfo
from .tasks.submit import submit
from .worker.runtime import current_job, current_worker

__all__ = [
    "BatchHandle", "ClusterUnavailable", "GangHandle", "distributed", "init_process_group", "ConfigError", "GpulayerError", "JobFailed", "JobRejected",
    "PayloadError", "PayloadRejected", "UnsupportedOption", "GangFailed", "JobStopped", "Resources", "WorkerInfo", "connect", "current_job", "current_worker",
    "group", "init", "submit", "submit_batch", "wait_for_workers",
]
__version__ = "0.1.0"
