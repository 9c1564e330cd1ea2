"""Every Redis key gpulayer uses, built from one namespace.

Key schema (``gl`` is ``NAMESPACE``):

    gl:workers                 zset   worker id -> last heartbeat (Redis server time, seconds)
    gl:workers:info            hash   worker id -> WorkerInfo JSON
    gl.q.<...>                 list   kombu queues; names built in ``gpulayer/queues.py``
    celery-task-meta-<job id>  string job results, owned by Celery's Redis result backend
    _kombu.binding.<exchange>  set    kombu's exchange bindings, owned by kombu

Lua scripts under ``store/lua/`` receive these names through ``KEYS[]`` only.
"""

from __future__ import annotations

NAMESPACE = "gl"

WORKERS = f"{NAMESPACE}:workers"
WORKERS_INFO = f"{NAMESPACE}:workers:info"

# Slot ledger: how many slots gangs hold on each worker (reserved or running).
#   gl:slots:held              hash   worker id -> slots held by gangs
SLOTS_HELD = f"{NAMESPACE}:slots:held"

# Gangs (distributed jobs). <a> is the attempt number (restarts start a new attempt).
#   gl:gangs                   zset   gang id -> created (time); the index `gpulayer status` reads
#   gl:gang:<id>               hash   spec, state, reason, placement, attempt, created, finished
#   gl:gang:<id>:payload       string the signed (function, args, kwargs)
#   gl:gang:<id>:<a>:master    string "addr:port" of rank 0's TCP store, written by node 0's agent
#   gl:gang:<id>:<a>:results   hash   rank -> signed return value
#   gl:gang:<id>:<a>:failures  list   JSON failure reports, in the order Redis received them
#   gl:gang:<id>:<a>:nodes     hash   node rank -> JSON node report (worker, state, stopped_at)
#   gl:gang:<id>:<a>:released  hash   worker id -> 1 once its slots for this attempt went back
#   gl:gang:<id>:events        channel "fail" / "cancel" for every agent of the gang
#   gl:gang:<id>:out           channel JSON lines of every rank's output
#   gl:agent:<worker id>       list   gang orders for that worker's agent
GANGS = f"{NAMESPACE}:gangs"


def gang(gang_id: str) -> str:
    return f"{NAMESPACE}:gang:{gang_id}"


def gang_payload(gang_id: str) -> str:
    return f"{gang(gang_id)}:payload"


def gang_attempt(gang_id: str, attempt: int, what: str) -> str:
    """``what``: master, results, failures, nodes or released."""
    return f"{gang(gang_id)}:{attempt}:{what}"


def gang_events(gang_id: str) -> str:
    return f"{gang(gang_id)}:events"


def gang_output(gang_id: str) -> str:
    return f"{gang(gang_id)}:out"


def agent_orders(worker_id: str) -> str:
    return f"{NAMESPACE}:agent:{worker_id}"

# Reliability: which worker holds which message, and what happened to each job.
#   gl:inflight:<worker id>    hash   kombu delivery tag -> job id, while the worker holds the message
#   gl:job:<id>:lost           string how many deliveries of the job died with their process or worker
#   gl:job:<id>:history        list   JSON events: {"event": "lost"|"redelivered", "worker", "at"}
#   gl:janitor                 string lock: one janitor at a time hands back dead workers' messages
JANITOR_LOCK = f"{NAMESPACE}:janitor"


def inflight(worker_id: str) -> str:
    return f"{NAMESPACE}:inflight:{worker_id}"


def job_lost(job_id: str) -> str:
    return f"{NAMESPACE}:job:{job_id}:lost"


def job_history(job_id: str) -> str:
    return f"{NAMESPACE}:job:{job_id}:history"


def job_done(job_id: str) -> str:
    """Set once when a job's final result is stored; later results of reruns are dropped."""
    return f"{NAMESPACE}:job:{job_id}:done"


# Cancels of ordinary jobs, broadcast to every worker's reaper.
CANCEL_CHANNEL = f"{NAMESPACE}:cancel"
