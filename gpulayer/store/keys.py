"""Every Redis key gpulayer uses, built from one namespace.

Key schema (``gl`` is ``NAMESPACE``):

    gl:workers                 zset   worker id -> last heartbeat (Redis server time, seconds)
    gl:workers:info            hash   worker id -> WorkerInfo JSON (busy and held as of its last heartbeat)
    gl:workers:static          hash   worker id -> WorkerInfo JSON without busy, held, heartbeat_age
    gl:workers:load            hash   worker id -> "<busy> <held>"
    gl:workers:version         string counter, bumped by every change a snapshot reader must see
    gl:workers:changed         zset   worker id -> version of its last static change (registration,
                                      new capabilities, coming back after it was dead)
    gl:workers:load:changed    zset   worker id -> version of its last busy/held change
    gl:workers:compact:1       hash   worker id -> the record packed in layout 1 (store/registry.py PACKED)
    gl:workers:compact:1:synced string the version the packed records reflect (the full read uses them
                                      only while it equals gl:workers:version)
    gl:workers:starting        hash   worker id -> pid: registered, not yet answering Celery's control
                                      (worker/starting.py; a broadcast waits for them, engine/broadcast.py)
    gl.q.<...>                 list   kombu queues; names built in ``gpulayer/queues.py``
    celery-task-meta-<job id>  string job results, owned by Celery's Redis result backend
    _kombu.binding.<exchange>  set    kombu's exchange bindings, owned by kombu

Lua scripts under ``store/lua/`` receive these names through ``KEYS[]`` only.
"""

from __future__ import annotations

NAMESPACE = "gl"

# The cluster's identity on a host (gpulayer/store/cluster.py): made once, with SET NX, by the first worker.
#   gl:cluster:id              string random hex; each machine's local state of the cluster lives under
#                                     <temp root>/gpulayer-<id>/ (gang/workdir.py), never under a worker name alone
CLUSTER_ID = f"{NAMESPACE}:cluster:id"

# The embedded cluster's Redis, as its supervisor (gpulayer/local/supervisor.py) restarted it; `gpulayer status` shows it.
#   gl:local:redis             hash   restarts, last_exit (its exit code), last_at (wall time): JSON values
LOCAL_REDIS = f"{NAMESPACE}:local:redis"

# The user's code, shipped by digest (gpulayer/workspace/): uploaded once per digest by a client, unpacked once
# per digest on each machine under <temp root>/gpulayer-<cluster id>/code/<digest>/.
#   gl:code:<digest>           string the signed gzipped tar (workspace/archive.py), of a script's directory or of
#                                     `gpulayer train`'s working directory; expires CODE_TTL seconds after its last
#                                     use by a client (a client that keeps sending with it renews it)
CODE_TTL = 24 * 3600


def code_archive(digest: str) -> str:
    return f"{NAMESPACE}:code:{digest}"


WORKERS = f"{NAMESPACE}:workers"
WORKERS_INFO = f"{NAMESPACE}:workers:info"
# The versioned registry (gpulayer/store/registry.py): a reader that knows version v reads only
# the workers whose record or load changed after v, not the whole fleet.
WORKERS_STATIC = f"{NAMESPACE}:workers:static"
WORKERS_LOAD = f"{NAMESPACE}:workers:load"
WORKERS_VERSION = f"{NAMESPACE}:workers:version"
WORKERS_CHANGED = f"{NAMESPACE}:workers:changed"
WORKERS_LOAD_CHANGED = f"{NAMESPACE}:workers:load:changed"
# The full read's records, packed (no JSON to build in Lua or parse in Python); the layout number
# is in the name, so a reader or writer of another layout never mixes with this one.
WORKERS_PACKED = f"{NAMESPACE}:workers:compact:1"
WORKERS_PACKED_SYNCED = f"{WORKERS_PACKED}:synced"
# Workers in the registry that do not answer a control broadcast yet (they would miss it: Celery's broadcast is a
# PUBLISH, heard only by those subscribed when it is sent).
WORKERS_STARTING = f"{NAMESPACE}:workers:starting"

# Slot ledger: how many slots gangs hold on each worker (reserved or running).
#   gl:slots:held              hash   worker id -> slots held by gangs
SLOTS_HELD = f"{NAMESPACE}:slots:held"

# Gangs (distributed jobs). <a> is the attempt number (restarts start a new attempt).
#   gl:gangs                   zset   gang id -> created (time); the index `gpulayer status` reads
#   gl:gang:<id>               hash   spec, state, reason, placement, attempt, created, finished; started (the
#                                     attempt's placing), preempting (JSON, while a preemption stops it),
#                                     preemptions (count), preempted (the last one's line)
#   gl:gang:<id>:payload       string the signed (function, args, kwargs)
#   gl:gang:<id>:pulled        hash   what node 0's ranks wrote in that directory, for the client: attempt, worker,
#                                     files (JSON), archive (signed gzipped tar) or error (one line); expires in an hour
#   gl:gang:<id>:restart       hash   node 0's new and changed files at the end of a failed attempt, for the next
#                                     attempt's nodes (`--restart-from node0`): attempt, worker, files (JSON),
#                                     bytes, archive (signed gzipped tar) or error; deleted when the gang finishes
#   gl:gang:<id>:<a>:master    string "addr:port" of the TCP store, written by node 0's agent; " agent" after it
#                               when that agent hosts the store (procs/env.py StoreHost), else rank 0 does
#   gl:gang:<id>:<a>:results   hash   rank -> signed return value
#   gl:gang:<id>:<a>:failures  list   JSON failure reports, in the order Redis received them
#   gl:gang:<id>:<a>:nodes     hash   node rank -> JSON node report (worker, state, stopped_at)
#   gl:gang:<id>:<a>:released  hash   worker id -> 1 once its slots for this attempt went back
#   gl:gang:<id>:<a>:concluded string set once by whoever ends the attempt (its last node report)
#   gl:gang:<id>:events        channel "fail:<a>" / "cancel" / "preempt:<a>:<grace s>" for every agent of the
#                                     gang; "placed:<a>",
#                                     "waiting:<a>", "stopped:<a>", "done:<state>" for the client's handle
#   gl:agent:<worker id>       list   gang orders for that worker's agent
#   gl:gangs:waiting           zset   gang id -> its place: arrival number, less PRIORITY_STRIDE per priority
#                                     step (store/gangs.line_score), the gangs the coordinator tries, in that order
#   gl:gangs:arrivals          string counter that numbers the arrivals
#   gl:coordinator:lock        string one coordinator pass at a time (gang/coordinator.py)
#   gl:coordinator:again       string "try again": set by whoever asks for a pass, taken by the pass
#   gl:coordinator:sweep       string at most one sweep of the waiting gangs per second, fleet-wide
GANGS = f"{NAMESPACE}:gangs"
GANGS_WAITING = f"{NAMESPACE}:gangs:waiting"
GANG_ARRIVALS = f"{NAMESPACE}:gangs:arrivals"
COORDINATOR_LOCK = f"{NAMESPACE}:coordinator:lock"
COORDINATOR_AGAIN = f"{NAMESPACE}:coordinator:again"
COORDINATOR_SWEEP = f"{NAMESPACE}:coordinator:sweep"


def gang(gang_id: str) -> str:
    return f"{NAMESPACE}:gang:{gang_id}"


def gang_payload(gang_id: str) -> str:
    return f"{gang(gang_id)}:payload"


def gang_pulled(gang_id: str) -> str:
    return f"{gang(gang_id)}:pulled"


def gang_restart_files(gang_id: str) -> str:
    return f"{gang(gang_id)}:restart"


def gang_attempt(gang_id: str, attempt: int, what: str) -> str:
    """``what``: master, results, failures, nodes, released or concluded."""
    return f"{gang(gang_id)}:{attempt}:{what}"


def gang_attempts(gang_id: str) -> str:
    """List: one JSON summary per ended attempt (where it ran, how it ended, the workers lost)."""
    return f"{gang(gang_id)}:attempts"


def gang_events(gang_id: str) -> str:
    return f"{gang(gang_id)}:events"


def agent_orders(worker_id: str) -> str:
    return f"{NAMESPACE}:agent:{worker_id}"

# Reliability: which worker holds which message, and what happened to each job.
#   gl:inflight:<life>         hash   kombu delivery tag -> job id, while that worker process holds the message
#                                     (written with the take, removed with the ack: gpulayer/engine/transport.py);
#                                     <life> is "<worker id>:<pid>": a restarted worker is a new life, so the
#                                     janitor burying the old one never touches what the new one holds
#   gl:job:<id>:lost           string how many deliveries of the job died with their process or worker
#   gl:job:<id>:history        list   JSON events: {"event": "lost"|"redelivered", "worker", "at"}
#   gl:job:<id>:objects        set    oids the job's arguments hold (holder arg:<id>, tasks/refs.py), for a cancel
#                                     to let go of; only for a job that takes refs, expiring with its result
#   gl:janitor                 string lock: one janitor at a time hands back dead workers' messages
JANITOR_LOCK = f"{NAMESPACE}:janitor"
#   gl:objs:sweeping           string lock, expiring after a sweep period: one worker at a time sweeps the object
#                                     store (worker/object_sweep.py), at most once a period across the fleet
OBJECT_SWEEP_LOCK = f"{NAMESPACE}:objs:sweeping"


def life(worker_id: str, pid: int) -> str:
    """One run of a worker: its records are keyed by this, not by the worker's (reusable) name."""
    return f"{worker_id}:{pid}"


def inflight(life: str) -> str:
    return f"{NAMESPACE}:inflight:{life}"


def lives_of(worker_id: str) -> str:
    """SCAN pattern for every life's inflight key of ``worker_id`` (glob characters escaped)."""
    return f"{NAMESPACE}:inflight:{glob_escape(worker_id)}:*"


# Taking a message (gpulayer/engine/transport.py): a message is always in a queue, or in kombu's unacked hash
# with a delivery record (one script takes and records), so a worker killed at any instant loses nothing.
#   gl:bell:<queue key>        list   wake-up tokens pushed with each message (capped); idle workers block on them
def bell(queue_key: str) -> str:
    return f"{NAMESPACE}:bell:{queue_key}"


def job_lost(job_id: str) -> str:
    return f"{NAMESPACE}:job:{job_id}:lost"


def job_objects(job_id: str) -> str:
    return f"{NAMESPACE}:job:{job_id}:objects"


def job_history(job_id: str) -> str:
    return f"{NAMESPACE}:job:{job_id}:history"


def job_done(job_id: str) -> str:
    """Set once when a job's final result is stored; later results of reruns are dropped."""
    return f"{NAMESPACE}:job:{job_id}:done"


# A job's output (gpulayer/output/): its lines go to the channel of the client process that sent it, and its
# last lines stay beside its result, as long as it.
#   gl:out:<output id>         channel JSON batches of lines (output/lines.py Chunk) of the jobs and ranks one client
#                                      process sent (its output id: the gl_out header, a gang's spec.output)
#   gl:job:<id>:out            stream  a job's last lines (fields s: out|err, t: text), bounded (output/lines.py)
#   gl:job:<id>:out:<rank>     stream  the same for one rank of a distributed job (<id>: the gang's)
def output_channel(output_id: str) -> str:
    return f"{NAMESPACE}:out:{output_id}"


def job_output(job_id: str, rank: int | None = None) -> str:
    return f"{NAMESPACE}:job:{job_id}:out" + ("" if rank is None else f":{rank}")


# Cancels of ordinary jobs, broadcast to every worker's reaper (signed: ids, one a line; gpulayer/cancel.py).
CANCEL_CHANNEL = f"{NAMESPACE}:cancel"

# Users the cluster knows (gpulayer/users/table.py); absent or empty: no users, today's single-secret cluster.
#   gl:users                   hash   user name -> JSON {share, max_slots, max_gpus, max_gangs, priority, admin,
#                                     revoked, keys: {ed25519, x25519}, created_at, mac}; the mac (HMAC with a key
#                                     derived from the cluster secret) is made by `gpulayer users`, checked by readers
USERS = f"{NAMESPACE}:users"


# Who sent what, for `gpulayer cancel` from a shell (the sending process may be gone). The transport records
# both with the publish itself (engine/transport.py ``_put``), in the pipeline that sends the message:
#   gl:clients                 set    every client identity that sent a job (config ``client_id``, default user@host)
#   gl:client:<identity>:jobs  zset   job id -> when it was sent (client clock); expires a day after the last send
#   gl:batch:<id>              set    the job ids of one submit_batch or Celery group (its id); expires in a day
#   gl:batches                 zset   batch or group id -> when it was sent: the index a short id is looked up in
#                                     (gpulayer/ids.py), trimmed to the last day when it is read
# A gang's identity is its spec's ``client`` (gl:gang:<id>), its index gl:gangs.
CLIENTS = f"{NAMESPACE}:clients"
BATCHES = f"{NAMESPACE}:batches"
SENT_KEEP_SECONDS = 86400


def glob_escape(text: str) -> str:
    """``text`` with Redis's glob characters escaped, for a SCAN/ZSCAN ``MATCH`` pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def client_jobs(identity: str) -> str:
    return f"{NAMESPACE}:client:{identity}:jobs"


def batch(batch_id: str) -> str:
    return f"{NAMESPACE}:batch:{batch_id}"


# Reconciliation after a broker failover (store/reconcile.py). A primary is named by its epoch: its run id and
# replication id, both new when a replica is promoted or a server restarts. A new primary may lack the old one's
# last writes, so every worker re-asserts what it runs there before the coordinator places anything:
#   gl:reconciled              hash   worker id -> the epoch it last re-asserted its registry entry and slots on
#   gl:reconciled:claims       hash   worker id -> JSON ["<gang id> <attempt> <node>", ...]: the gang nodes it runs
#                                     or has orders for, as of that re-assertion
#   gl:broker:seen             hash   epoch -> Redis time a gpulayer process first saw that server as the primary
#   gl:broker:audited          string the epoch whose running gangs were last audited against the claims
RECONCILED = f"{NAMESPACE}:reconciled"
RECONCILED_CLAIMS = f"{RECONCILED}:claims"
PRIMARY_SEEN = f"{NAMESPACE}:broker:seen"
GANGS_AUDITED = f"{NAMESPACE}:broker:audited"


# The object store (gpulayer/objects/): large values live in a store beside Redis; Redis holds only records.
#   gl:obj:<oid>               hash   size, store (URL), created (unix time), state (live|deleting), deleting_at,
#                                     fetches (hosts that copied it from a remote store)
#   gl:obj:<oid>:holders       zset   holder -> expiry (unix time): put:<process token>, arg:<job id>,
#                                     res:<job id>; an object left with no unexpired holder is deleted
#   gl:objs                    set    every oid with a record (the sweep's index)
#   gl:objs:stats              hash   count, bytes: the objects with a record, live or being deleted
#   gl:objs:store              string the embedded cluster's default store URL, set once (NX) by the first
#                                     process that needed one, so all of its processes use the same directory
OBJECTS = f"{NAMESPACE}:objs"
OBJECTS_STATS = f"{OBJECTS}:stats"
OBJECTS_DEFAULT_STORE = f"{OBJECTS}:store"


def obj(oid: str) -> str:
    return f"{NAMESPACE}:obj:{oid}"


def obj_holders(oid: str) -> str:
    return f"{obj(oid)}:holders"


# Fair share and quotas (gpulayer/fairshare.py the formulas, store/fair.py the edge, docs/FAIRSHARE.md). Off while
# gl:users is empty or missing: then nothing below is read or written and jobs run first come, first served.
#   gl:users                   hash   user (the job's client identity) -> JSON {share, max_slots, max_gpus, max_gangs,
#                                     priority, account?}; other fields (signatures) are ignored here
#   gl:accounts                hash   account -> JSON {share, parent?}: the tree above users (none: users under root)
#   <queue key>\x06\x15<user>  list   a user's jobs of one queue (priority key included), taken in fair-share order
#                                     before the queue's own list (jobs of users without a policy, and restores
#                                     of messages whose user has none)
#   gl:fair:taken              hash   delivery tag -> "<user>\t<start>\t<weight>\t<gpus>": a job taken for a user,
#                                     until its ack, give-back or requeue
#   gl:fair:running            hash   slots:<user>, gpus:<user>, weight:<user> (slot-weights charging now),
#                                     since:<user> (sum of weight x start), gangs:<user>
#   gl:fair:usage              hash   u:<user> decayed slot-seconds as of at:<user> (Unix time)
#   gl:fair:waiting            hash   user -> why its next job waits (a quota), set by the take that held it back
USERS = f"{NAMESPACE}:users"
ACCOUNTS = f"{NAMESPACE}:accounts"
USER_SEP = "\x06\x15"
FAIR_TAKEN = f"{NAMESPACE}:fair:taken"
FAIR_RUNNING = f"{NAMESPACE}:fair:running"
FAIR_USAGE = f"{NAMESPACE}:fair:usage"
FAIR_WAITING = f"{NAMESPACE}:fair:waiting"
FAIR_KEYS = (USERS, FAIR_TAKEN, FAIR_RUNNING, FAIR_USAGE, FAIR_WAITING)  # take.lua's and fair_release.lua's order


def user_queue(queue_key: str, user: str) -> str:
    """``user``'s list of the queue kept at ``queue_key``."""
    return f"{queue_key}{USER_SEP}{user}"


def base_queue(key: str) -> str:
    """The queue key a user's list belongs to (``key`` itself for a queue's own list)."""
    return key.split(USER_SEP, 1)[0]
