"""Cancel and time limits for ordinary jobs: kill the job's whole process tree, record why.

Runs in the worker's main process. A cancel is broadcast on one channel, one
signed message naming up to 1,000 jobs (gpulayer/cancel.py); on a cluster with users, only the job's owner's
or an admin's cancel stops it (users/permits.py). A job's ``timeout`` travels in its headers. Either way the
reaper kills the pool process running the job and every process below it, and
remembers why, so the request records "cancelled" or "timed out" instead of
delivering the job again.
"""

from __future__ import annotations

import logging
import time

import redis

from ..app import TIMEOUT_HEADER
from ..engine.qos import running
from ..engine.senders import owner_of
from ..errors import PayloadRejected
from ..users import permits
from ..store import keys
from ..store.results import STOPPED_WHILE_RUNNING
from ..store.connection import client_name, connect_redis
from ..engine.sentinel import broker_url
from ..procs.stop import kill_tree
from ..procs import runtime
from ..loopstep import LoopStep

log = logging.getLogger(__name__)
POLL = 0.1

# job id -> reason, for the request's on_failure (same process).
stopped: dict[str, str] = {}


class Reaper(LoopStep):
    thread_name = "gpulayer-reaper"

    def loop(self) -> None:
        client = connect_redis(broker_url(self.app), socket_timeout=10,
                               name=client_name(runtime.current_worker().id, "reaper"))
        sub = None
        cancelled: dict[str, tuple[float, str | None]] = {}  # job id -> when the cancel arrived, who signed it
        while not self.stopping.is_set():
            try:
                if sub is None:
                    sub = client.pubsub(ignore_subscribe_messages=True)
                    sub.subscribe(keys.CANCEL_CHANNEL)
                msg = sub.get_message(timeout=POLL)
                while msg:
                    try:
                        ids, signer = permits.unpack(msg["data"])  # one message names up to 1,000 jobs
                    except PayloadRejected as err:
                        log.warning("gpulayer: a cancel was refused: %s", err)
                        ids = []
                    for job_id in ids:
                        cancelled[job_id] = (time.monotonic(), signer)
                    msg = sub.get_message(timeout=0)
            except redis.RedisError:
                sub = None
                self.stopping.wait(1)
                continue
            now = time.time()
            for req in running():
                reason = None
                ran = f"after {max(0.0, now - req.time_start):.1f} s" if req.time_start else "just started"
                if req.id in cancelled:
                    refused = permits.refusal(cancelled[req.id][1], owner_of(req), req.id)
                    if refused:
                        log.warning("gpulayer: %s", refused)
                        del cancelled[req.id]
                        continue
                    reason = f"cancelled: {STOPPED_WHILE_RUNNING} ({ran})"
                else:
                    limit = (req.request_dict or {}).get(TIMEOUT_HEADER)
                    if limit and req.time_start and now - req.time_start > float(limit):
                        reason = f"timed out: ran over its {float(limit):g}s timeout ({STOPPED_WHILE_RUNNING}, {ran})"
                if reason and req.worker_pid and req.id not in stopped:
                    stopped[req.id] = reason
                    n = kill_tree(req.worker_pid)
                    log.warning("gpulayer: job %s %s; killed its %d process(es)", req.id, reason, n)
            horizon = time.monotonic() - 600  # a cancel for a job not (yet) here is kept for a while
            for job_id in [j for j, (t, _) in cancelled.items() if t < horizon]:
                del cancelled[job_id]
        if sub is not None:
            sub.close()
        client.close()
