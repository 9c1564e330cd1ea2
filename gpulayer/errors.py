"""One error hierarchy. Each message says what was asked, what was found, and what to do."""

from __future__ import annotations


class GpulayerError(Exception):
    """Base class of every error gpulayer raises on purpose."""


class ConfigError(GpulayerError, ValueError):
    """Configuration (environment, config file, state file, CLI flags) is invalid."""


class ClusterUnavailable(GpulayerError, ConnectionError):
    """The broker cannot be reached or refuses our credentials."""


class JobRejected(GpulayerError):
    """No live worker can run the request; refused at submission, never queued."""


class PayloadError(GpulayerError, ValueError):
    """A job's function, arguments or result cannot be serialised or is too large."""


class PayloadRejected(GpulayerError):
    """A message body failed signature verification and was not unpickled."""


class JobStopped(GpulayerError):
    """A job was cancelled or ran over its timeout, and its processes were killed."""


class JobFailed(GpulayerError):
    """A job ran and raised, or its process died.

    Carries the remote exception's type name, message and traceback text.
    """

    def __init__(self, type_name: str, message: str, traceback: str | None = None, job_id: str | None = None):
        self.type_name = type_name
        self.message = message
        self.traceback = traceback
        self.job_id = job_id
        super().__init__(type_name, message, traceback, job_id)

    def __str__(self) -> str:
        head = f"job {self.job_id} failed: " if self.job_id else "job failed: "
        text = f"{head}{self.type_name}: {self.message}"
        if self.traceback:
            text += "\n--- remote traceback ---\n" + self.traceback.rstrip()
        return text
