"""``JobHandle``: what ``submit`` returns, a submitted job (``get()``, ``cancel()``, ``history()``, ``logs()``).

A handle of the client API, beside ``BatchHandle`` (client.py) and ``GangHandle`` (distributed_job.py). The
``submit`` task (tasks/submit.py, a layer below) builds its handles with the class it is handed: importing this
module installs ``JobHandle`` there, and ``gpulayer.submit`` and ``gpulayer.client`` import it.
"""

from __future__ import annotations

from celery import states
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult

from . import app as app_mod
from .deadline import Deadline
from .engine.results import prime_result
from .errors import JobFailed
from .session import BROKER_ERRORS, broker_lost, outage
from .tasks import readahead, refs
from .tasks import submit as submit_task

WAIT_SLICE = 1.0  # seconds a JobHandle.get waits on the job's channel before it reads the stored result again


class JobHandle(AsyncResult):
    """A submitted job: ``get()`` (the value, or ``JobFailed``), ``cancel()``, ``history()``."""

    def get(self, timeout=None, *args, **kwargs):
        """The job's value, or ``JobFailed``; Ctrl-C says the job still runs and how to stop it.

        A finished job's result is read with one MGET, which also reads the results of the next jobs this
        process sent and has not read yet (``tasks/readahead.py``: a loop of ``get`` over many handles costs a
        round trip per ``WINDOW`` finished jobs, not one per job; an unfinished job among them is polled for a
        moment first). Celery's ``get`` subscribes to the job's channel,
        reads the stored result and unsubscribes, three round trips and as much of a client's CPU as the
        ``delay`` that sent the job; it still waits for the jobs that have not finished, a second at a
        time, reading the stored result again between waits: its subscription goes on one connection and
        its read of the result on another, and Redis may run the read first, so a result stored between
        the two is announced before anyone listens (a wait that would last until the timeout).

        A broker that goes away meanwhile (a Redis restart) is waited for, up to a minute and never past
        ``timeout``; the wait then resumes, or ``ClusterUnavailable`` names the broker.

        ``timeout`` (seconds) is kept to, not rounded up; when it runs out, ``gpulayer.JobTimeout`` (a
        ``TimeoutError``, and Celery's) says what the job is doing: ``queued on gl.q.cpu (3 jobs waiting
        there)``, or ``running on local-2 for 12.0 s``. The job runs on; ``get()`` may be called again.
        """
        deadline = Deadline(timeout)
        lost = outage(deadline, f"job {self.id} was sent; its result waits in Redis if the broker comes back "
                                "with its data: call get() again then")
        primed = self._cache is not None or self.ignored or kwargs.get("on_message") is not None
        try:
            while True:
                try:
                    if not primed:  # with the results of other jobs this process sent (tasks/readahead.py)
                        meta = readahead.meta(self.backend, self.id)
                        if meta["status"] not in states.READY_STATES and readahead.others_unread():
                            meta = readahead.wait_briefly(self.backend, self.id, deadline)
                        prime_result(self, meta)
                        primed = True
                    # an auto ref (a large result, kept in the object store) is the value it holds
                    return refs.value_of(super().get(max(deadline.left(WAIT_SLICE), 0.001), *args, **kwargs))
                except JobFailed as err:  # raised here: the traceback shows no frame of Celery's or vine's
                    raise err.with_traceback(None)
                except CeleryTimeoutError:
                    lost.back()
                    if deadline.expired():
                        from .tasks.whereabouts import job_timeout

                        raise job_timeout(self.id, timeout, getattr(self, "sent_to", None)) from None
                except BROKER_ERRORS as err:  # Redis is restarting, or gone: wait for it within the deadline
                    lost.lost(err)
        except KeyboardInterrupt:
            from .cancel import interrupted

            raise interrupted([self.id], "handle.cancel()") from None  # not redis-py's frames: the job runs on

    def forget(self) -> None:
        """Delete the job's stored result, and the objects only it held (a large result, refs it returned)."""
        readahead.forget(self.id)
        try:
            refs.forget_result(self)
        except BROKER_ERRORS as err:
            raise broker_lost(err, f"the result of job {self.id} was not forgotten") from err
        super().forget()

    def cancel(self) -> None:
        """Drop the job if it is still queued, or kill its whole process tree if it runs."""
        from .cancel import cancel_jobs

        cancel_jobs([self.id], only_unfinished=False)

    def history(self) -> list[dict]:
        """Deliveries that died (``lost``), reruns (``redelivered``) and tries that raised and were sent again
        (``retried``: ``attempt``, ``error``, ``delay``; ``retry-not-sent`` when the broker refused the next try),
        with their workers, oldest first."""
        from .store.jobs import JobRecords

        client = app_mod.redis_client()
        try:
            return JobRecords(client).history(self.id)
        except BROKER_ERRORS as err:
            raise broker_lost(err, f"the history of job {self.id} was not read") from err
        finally:
            client.close()

    def logs(self) -> str:
        """What the job printed (stdout, stderr and ``logging`` records, in order), as kept with its result:
        its newest lines, up to 1 MiB; "" if it printed nothing (yet: a running job's lines so far)."""
        from .output import tail

        client = app_mod.redis_client()
        try:
            return tail.text(client, self.id)
        except BROKER_ERRORS as err:
            raise broker_lost(err, f"the output of job {self.id} was not read") from err
        finally:
            client.close()

    @property
    def attempts(self) -> int:
        """How many times the job was delivered so far: 1, and one more for each delivery that died and each
        try that raised and was retried (``max_retries``)."""
        events = [h["event"] for h in self.history()]
        return 1 + events.count("lost") + events.count("retried") - events.count("retry-not-sent")


submit_task.SubmitTask.handle_class = JobHandle
submit = submit_task.submit  # ``gpulayer.submit``: the task, its handles JobHandles
