"""What gpulayer borrows from Celery, kombu, billiard, Flower, redis-py, pydantic and CPython, pinned to the source it
was written against.

Each entry names one upstream method (or attribute) that gpulayer overrides, copies, patches, or whose
inside it relies on, where gpulayer's code for it lives, and a hash of the upstream source in the versions
of ``WRITTEN_FOR`` (the ones ``pyproject.toml`` pins; for CPython's standard library, the Python minor version
the hashes were taken on). ``tests/test_engine_contract.py`` hashes each in the
installed packages and fails, naming the method, when one changed: an upgrade is then a decision (re-read
our code against the new source, record the new hash here, move the pin), never a silent loss.

    python -m gpulayer.engine.upstream        # every entry: recorded and installed hash, and what changed

A hash covers the source as ``inspect.getsource`` gives it, dedented, without blank lines, comment-only
lines or trailing spaces (so reindenting or commenting upstream does not count as a change). Patching
goes through :func:`patch`, which refuses a target not listed here.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import inspect
import platform
import sys
import textwrap
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterable

# The versions whose source the hashes below were taken from; pyproject.toml pins each package to its minor version
# ("python" stands for the standard library: requires-python admits it, and the contract test names what differs on
# another minor version).
WRITTEN_FOR = {"celery": "5.7.0", "kombu": "5.7.0", "flower": "2.2.0", "redis": "8.1.0", "billiard": "4.3.2",
               "pydantic": "2.14.4", "python": "3.11.7"}

HOW = {"overrides": "our override", "copies": "our copy", "patches": "our patch", "relies on": "the code that relies on it"}


@dataclass(frozen=True)
class Borrowed:
    """One upstream method or attribute gpulayer depends on the inside of."""

    target: str  # "module:Class.name" (or "module:NAME" for a module attribute), as upstream defines it
    digest: str  # the first 16 hex digits of sha256 over its normalised source, in WRITTEN_FOR's version
    ours: str  # the file of gpulayer's code that depends on it
    how: str  # a key of HOW
    also: tuple[str, ...] = ()  # other files of gpulayer's code (in engine/) that rely on it too

    @property
    def files(self) -> tuple[str, ...]:
        return (self.ours, *self.also)

    @property
    def package(self) -> str:
        """The distribution the target comes from; ``"python"`` for a module of the standard library."""
        top = self.target.split(".", 1)[0].split(":", 1)[0]
        return "python" if top in sys.stdlib_module_names else top

    @property
    def name(self) -> str:
        """Dotted, as a reader writes it: ``kombu.transport.redis.Channel._brpop_read``."""
        return self.target.replace(":", ".")


_T, _R, _Q, _E = ("gpulayer/engine/transport.py", "gpulayer/engine/results.py", "gpulayer/engine/request.py",
                  "gpulayer/engine/events.py")
_L, _QOS, _P, _C = ("gpulayer/engine/loop.py", "gpulayer/engine/qos.py", "gpulayer/engine/prefetch.py",
                    "gpulayer/engine/carry.py")
_ENV, _D, _TO = "gpulayer/engine/envelope.py", "gpulayer/engine/delivery.py", "gpulayer/engine/takeover.py"
_RS, _RV = "gpulayer/engine/respawn.py", "gpulayer/engine/revoke.py"
_S = "gpulayer/engine/sentinel.py"
_PUB = "gpulayer/engine/publish.py"
_PS = "gpulayer/engine/pool_stop.py"
_B = "gpulayer/engine/batches.py"

BORROWED: tuple[Borrowed, ...] = (
    # kombu's Redis transport: takes a SIGKILL cannot lose, bells, one client per pool
    Borrowed("kombu.transport.redis:QoS.append", "c7daa00b15fd856c", _QOS, "overrides", also=(_ENV,)),
    Borrowed("kombu.transport.redis:QoS._remove_from_indices", "1d16cda1cc93f5ad", _QOS, "overrides", also=(_D,)),
    Borrowed("kombu.transport.redis:QoS.ack", "e327206e27ae8803", _QOS, "overrides"),
    Borrowed("kombu.transport.virtual.base:QoS.ack", "10a753d3357edafb", _QOS, "relies on"),
    Borrowed("kombu.transport.redis:QoS.restore_by_tag", "da84a4be670b4345", _TO, "relies on", also=(_D,)),
    Borrowed("kombu.transport.virtual.base:QoS.append", "f66e99e79deefec4", _QOS, "relies on"),
    Borrowed("kombu.transport.redis:Channel.__init__", "c85cbfeb45bd4cb4", _T, "overrides"),
    Borrowed("kombu.transport.redis:Channel.conn_or_acquire", "73c0765b5280564e", _T, "overrides"),
    Borrowed("kombu.transport.redis:Channel._put", "b341c110d926fbb3", _T, "overrides", also=(_PUB,)),
    Borrowed("kombu.transport.redis:Channel._do_restore_message", "a3c0ee19848b62a2", _T, "overrides"),
    Borrowed("kombu.transport.redis:Channel._brpop_start", "225ed3a7dba80b8d", _T, "overrides"),
    Borrowed("kombu.transport.redis:Channel._brpop_read", "8dffdd33e02e92cf", _T, "overrides"),
    Borrowed("kombu.transport.redis:Channel.close", "e432a00c5593503e", _T, "overrides"),
    # a taken message decoded without kombu's JSON hook where it has nothing to change
    Borrowed("kombu.utils.json:object_hook", "cf29125995c05973", _ENV, "relies on"),
    # a cheaper loop turn: kombu's on_poll_start, with a reader added only for a socket that has none
    Borrowed("kombu.transport.redis:Transport.register_with_event_loop", "0979cb1d0b41a986", _T, "overrides"),
    Borrowed("kombu.transport.redis:MultiChannelPoller._register", "84a2b49e9aeff3fd", _L, "relies on"),
    Borrowed("kombu.asynchronous.hub:Hub.add", "09bb121b537d9a49", _L, "relies on"),
    Borrowed("kombu.asynchronous.hub:Hub.remove_writer", "403748aced7cf852", _L, "relies on"),
    Borrowed("celery.concurrency.asynpool:AsynPool._create_write_handlers", "c7381a1afb8c8e9c", _L, "relies on"),
    # the event loop turn that Celery's acks wait for (the prefetch's _turn_soon_if_acks_wait, carry's timer)
    Borrowed("kombu.asynchronous.hub:Hub.create_loop", "8faca5b8e3b64640", _P, "relies on", also=(_C,)),
    Borrowed("kombu.asynchronous.hub:Hub.fire_timers", "22f549d5283e7c45", _P, "relies on", also=(_C,)),
    # the slot gate (engine/qos.py), asked by the transport's QoS
    Borrowed("kombu.transport.virtual.base:QoS.can_consume", "49da5047156f5223", _QOS, "overrides", also=(_P,)),
    # ... set on the task consumer's channel's QoS; the worker's requests, as Celery's worker state keeps them
    Borrowed("celery.worker.consumer.tasks:Tasks.start", "c86185b905f34044", _QOS, "relies on"),
    Borrowed("kombu.transport.virtual.base:Channel.qos", "919fa972ef27f344", _QOS, "relies on"),
    Borrowed("celery.worker.state:task_reserved", "31688234dd7ecd41", _QOS, "relies on"),
    Borrowed("celery.worker.state:task_accepted", "fda3b2b9d59c296f", _QOS, "relies on"),
    Borrowed("celery.worker.state:task_ready", "c828c23270b019e9", _QOS, "relies on"),
    # a message's layout in a queue and in kombu's unacked records (read by the control consumer, the janitor, the
    # emulator through engine/envelope.py and engine/delivery.py)
    Borrowed("kombu.transport.virtual.base:Channel.prepare_message", "2beb8edc7692d609", _ENV, "relies on",
             also=(_PUB,)),
    Borrowed("kombu.transport.virtual.base:Channel._inplace_augment_message", "1556dfbeca73f122", _ENV, "relies on",
             also=(_PUB,)),
    Borrowed("kombu.transport.redis:Channel.unacked_key", "d74ac3dfa7ca8407", _D, "relies on"),
    Borrowed("kombu.transport.redis:Channel.unacked_index_key", "9d26d870ab19d81d", _D, "relies on"),
    # Celery's Redis result backend: stored once, failures as JobFailed
    Borrowed("celery.backends.redis:RedisBackend.__init__", "b25298d88bf82498", _R, "overrides"),
    Borrowed("celery.backends.redis:RedisBackend._set_with_state", "37db08ec94802d6e", _R, "overrides"),
    Borrowed("celery.backends.redis:RedisBackend.on_task_call", "cc5438d6a248cc13", _R, "overrides"),
    Borrowed("celery.backends.redis:ResultConsumer.on_wait_for_pending", "a530b00bb90811f7", _R, "relies on"),
    Borrowed("celery.result:AsyncResult.get", "03853d62e5dc75e1", _R, "relies on"),
    Borrowed("celery.result:AsyncResult._maybe_set_cache", "8880e55f95b14579", _R, "relies on"),
    # submit's own publish (send_job): the message Celery's send_task would build for it
    # (and its direct publish: the same message, built with kombu's own steps; tests/test_publish.py compares them)
    Borrowed("celery.app.base:Celery.send_task", "0f94519120b9a7f9", _PUB, "relies on"),
    Borrowed("celery.app.amqp:AMQP._create_task_sender", "477b5497539d6acd", _PUB, "relies on"),
    Borrowed("celery.app.amqp:AMQP.as_task_v2", "e94ea35a5b32847b", _PUB, "relies on"),
    Borrowed("kombu.messaging:Producer.publish", "b727bf7c4ba1d22e", _PUB, "relies on"),
    Borrowed("kombu.messaging:Producer._publish", "1f5819aa0bd4fe7c", _PUB, "relies on"),
    Borrowed("celery.backends.base:BaseKeyValueStoreBackend._store_result", "53e3e1e9911e32c0", _R, "overrides"),
    Borrowed("celery.backends.base:Backend._get_result_meta", "eedbd98d0f7b1b25", _R, "overrides"),
    Borrowed("celery.backends.base:Backend.meta_from_decoded", "4d526017ca11ce6d", _R, "overrides"),
    # a failure's record (exc_type, exc_module, exc_message: a non-pickle serializer's), with the job's own
    # exception packed beside it (gpulayer/remote_errors.py), read back through Celery's rebuild of the record
    Borrowed("celery.backends.base:Backend.prepare_exception", "06696dcd10e2dea8", _R, "relies on"),
    Borrowed("celery.backends.base:Backend.exception_to_python", "6197f3800904edb1", _R, "relies on"),
    Borrowed("celery.backends.asynchronous:AsyncBackendMixin.remove_pending_result", "744fbbd18bc30225", _R,
             "overrides"),
    # a lost broker: one reconnect, then the broker's own error for the waiter to ride out (no RuntimeError)
    Borrowed("celery.backends.redis:RedisBackend.ResultConsumer", "f5d3d583bb2775db", _R, "overrides"),
    Borrowed("celery.backends.asynchronous:BaseResultConsumer.reconnect_on_error", "275347b412de818d", _R,
             "overrides"),
    Borrowed("celery.backends.redis:ResultConsumer._reconnect", "4120a7560dada207", _R, "overrides"),
    Borrowed("celery.backends.asynchronous:BaseResultConsumer.drain_events_until", "53bdea246c3f71a5", _R,
             "overrides"),
    Borrowed("celery.backends.asynchronous:Drainer.drain_events_until", "c25e91ad76606e2b", _R, "relies on"),
    Borrowed("celery.backends.asynchronous:Drainer.wait_for", "30a5538ba7395629", _R, "relies on"),
    Borrowed("celery.backends.redis:ResultConsumer._reconnect_pubsub", "e641622641700878", _R, "relies on"),
    Borrowed("celery.backends.redis:ResultConsumer.consume_from", "78d150a7d8fca094", _R, "relies on"),
    # the worker's request: bounded redelivery, summaries instead of pickles
    Borrowed("celery.worker.request:Request.__init__", "3bb3f5995d780969", _Q, "overrides", also=(_TO,)),
    Borrowed("celery.worker.request:Request.info", "e3d30d7615008072", _Q, "overrides"),
    Borrowed("celery.worker.request:Request.on_failure", "98f98c5f0542af2b", _Q, "overrides"),
    Borrowed("celery.app.trace:LOG_RECEIVED", "1bd53e34652b424d", _Q, "patches"),
    # A success's result goes back to the main process and is stored with the job's ack (engine/results.py):
    # the pool runs our trace around Celery's, whose (failed, summary, runtime) it returns; the requests
    # create_request_cls builds hand the pool ``self.on_success``, the instance attribute JobRequest sets.
    Borrowed("celery.worker.request:fast_trace_task", "4b58dc439242c7f2", _Q, "patches"),
    Borrowed("celery.worker.request:trace_task_ret", "13f1c1eadda4dbf1", _Q, "patches"),
    Borrowed("celery.worker.request:create_request_cls", "0fca8bbbce2b55ee", _Q, "relies on"),
    Borrowed("celery.worker.strategy:default", "571fb318589c876f", _Q, "relies on"),
    # a revoke(terminate=True) of a running job says how long it ran
    Borrowed("celery.worker.request:Request._announce_revoked", "54aaa988d89bbe4c", _Q, "overrides"),
    Borrowed("celery.worker.request:Request.terminate", "01cef3174fb3a7bd", _Q, "relies on"),
    Borrowed("celery.worker.request:Request.on_accepted", "2a588d0a50df3d7a", _Q, "relies on"),
    # a revoke(terminate=True) is told by the worker that holds the job, not stored as "revoked" by the others
    Borrowed("celery.worker.control:_revoke", "ff1e7f0e28141b02", _RV, "patches"),
    Borrowed("celery.worker.control:_find_requests_by_id", "e040e2f75b23d31a", _RV, "relies on"),
    Borrowed("celery.worker.control:revoke", "afe167a0a2d54838", _RV, "relies on"),
    # a pool process that died is replaced at once (the exit event retried; the heap frozen before forks)
    Borrowed("celery.concurrency.asynpool:AsynPool._event_process_exit", "a8405bca6bf91b93", _RS, "patches"),
    Borrowed("celery.concurrency.asynpool:AsynPool._create_worker_process", "28598922829a7af9", _RS, "relies on"),
    Borrowed("celery.concurrency.asynpool:AsynPool.timers", "b83744b6be358e50", _RS, "relies on"),
    # a stopping worker's pool ends once its jobs are done: billiard's join in its order, the processes killed
    # instead of waited out (their 1-s exit sleep), the timer thread woken instead of slept out
    Borrowed("celery.concurrency.prefork:TaskPool.on_stop", "8afc20f93c14cc7f", _PS, "patches"),
    Borrowed("celery.concurrency.prefork:_run_ready_callbacks", "e86c2cf7108eccb4", _PS, "relies on"),
    Borrowed("billiard.pool:Pool.join", "1a4fc3dd96804e0a", _PS, "relies on"),
    Borrowed("billiard.pool:Pool.close", "d0062d83971ede21", _PS, "relies on"),
    Borrowed("billiard.pool:Worker._do_exit", "47d158821a7a0566", _PS, "relies on"),
    Borrowed("celery.concurrency.asynpool:AsynPool._stop_task_handler", "b1d17db19c811d11", _PS, "relies on"),
    Borrowed("celery.concurrency.asynpool:ResultHandler.on_stop_not_started", "338c8c08d977fa90", _PS, "relies on"),
    # several tiny jobs to one pool process: the pool's applies collected, Celery's per-request semaphore left out
    # (the slot gate admits requests), the batch run as billiard's worker loop runs a job, each request's
    # callbacks called with its own outcome; a job of a lost batch goes back marked redelivered
    Borrowed("celery.concurrency.prefork:TaskPool.on_start", "b70a73103b425317", _B, "patches"),
    Borrowed("celery.worker.worker:WorkController._process_task_sem", "0b67129962976889", _B, "patches"),
    Borrowed("celery.concurrency.base:BasePool.apply_async", "9bbeebd3f147f6fc", _B, "relies on"),
    Borrowed("billiard.pool:Pool.apply_async", "f7c11d86271caccc", _B, "relies on"),
    Borrowed("billiard.pool:ApplyResult._set", "cea757e81f669ba5", _B, "relies on"),
    Borrowed("billiard.pool:ApplyResult._ack", "259bcebbc5705d92", _B, "relies on"),
    Borrowed("billiard.pool:Worker.workloop", "4d5b107d2f283a04", _B, "relies on"),
    Borrowed("celery.worker.request:Request.execute_using_pool", "b57624ea980eda65", _B, "relies on"),
    Borrowed("celery.worker.consumer.consumer:Consumer.update_strategies", "81a35b4e77738ceb", _B, "relies on"),
    # a job's body decoded by its pool process only: kombu's message with a _decode of ours, made by the channel
    Borrowed("kombu.message:Message._decode", "5da17ff9e399c139", _T, "overrides"),
    Borrowed("kombu.transport.virtual.base:Channel.message_to_python", "779e7025c97e98b8", _T, "relies on"),
    # task events, paced
    Borrowed("celery.bootsteps:Step.__init__", "1f7b8cd57cb9aee6", _E, "overrides"),
    Borrowed("celery.bootsteps:StartStopStep.start", "90fe302ae41c3143", _E, "overrides"),
    Borrowed("celery.worker.consumer.consumer:Consumer.on_send_event_buffered", "506493be4fe40822", _E, "patches"),
    Borrowed("celery.worker.consumer.consumer:Consumer._flush_events", "9c88ccdd61f9062e", _E, "relies on"),
    Borrowed("celery.worker.consumer.events:Events.start", "ebada5243c706e78", _E, "relies on"),
    # events off until a monitor asks: a lazy dispatcher connection, enable/disable that turn it on and off
    Borrowed("celery.worker.consumer.consumer:Consumer.connection_for_write", "9dae6bfb3d79cbfe", _E, "patches"),
    Borrowed("celery.worker.control:enable_events", "4bf3886114b13bc4", _E, "overrides"),
    Borrowed("celery.worker.control:disable_events", "d9da4f561d4bfa78", _E, "overrides"),
    Borrowed("kombu.connection:Connection.get_heartbeat_interval", "3b5bd32c4e47a06d", _E, "patches"),
    Borrowed("kombu.transport.base:Transport.get_heartbeat_interval", "67cd00d11471e9c5", _E, "relies on"),
    Borrowed("celery.worker.loops:_enable_amqheartbeats", "ade575d3813b0bdb", _E, "relies on"),
    Borrowed("celery.worker.consumer.events:Events.__init__", "65c6b03527e3f5fc", _E, "relies on"),
    Borrowed("celery.events.dispatcher:EventDispatcher.send", "f7d28b95b3ee8802", _E, "relies on"),
    # celery inspect: replies awaited until every live worker answered
    Borrowed("celery.app.control:Control.broadcast", "cc294dfcc1ec4cad", "gpulayer/engine/broadcast.py", "overrides"),
    # the app's clock: Celery's, without the checks a UTC time never needs
    Borrowed("celery.app.base:Celery.now", "d0f4a315db0d5a61", "gpulayer/engine/celery_app.py", "overrides"),
    Borrowed("celery.utils.time:to_utc", "ab691003a3252d6c", "gpulayer/engine/celery_app.py", "relies on"),
    Borrowed("celery.utils.time:make_aware", "5f6084ccb25b8eda", "gpulayer/engine/celery_app.py", "relies on"),
    # pointing the app at another Redis
    Borrowed("celery.app.base:Celery._after_fork", "95d61721ecb980d2", "gpulayer/engine/pools.py", "relies on"),
    Borrowed("celery.app.base:Celery.pool", "c602313400413fda", "gpulayer/engine/pools.py", "relies on"),
    Borrowed("celery.app.base:Celery._backend", "8b13cc34d82908ea", "gpulayer/engine/pools.py", "relies on"),
    Borrowed("celery.app.amqp:AMQP.producer_pool", "56ab6c3b9fc55f33", "gpulayer/engine/pools.py", "relies on"),
    # Flower's pages, masked
    Borrowed("flower.app:Flower.__init__", "baa7ff74d616ec05", "gpulayer/engine/flower.py", "patches"),
    # ... its API: bad input answered with a 4xx and the reason, and logged as a refusal, not a crash
    Borrowed("flower.utils.blocking:BlockingOperationRunner.run", "1ee1be151b2b959b", "gpulayer/engine/flower.py",
             "patches"),
    Borrowed("flower.api:BaseApiHandler.write_error", "201e67437a0c8188", "gpulayer/engine/flower.py", "relies on"),
    # ... and our pages: Flower's login (basic auth) and its render (template functions, url_prefix)
    Borrowed("flower.views:BaseHandler.get_current_user", "9acc869401b007b9", "gpulayer/engine/flower.py", "relies on"),
    Borrowed("flower.views:BaseHandler.render", "0f48dfbe215a5a6c", "gpulayer/engine/flower.py", "relies on"),
    # redis-py's TLS connection, one SSLContext per process (installed into store/connection.py's connect_redis)
    Borrowed("redis.connection:SSLConnection._wrap_socket_with_ssl", "21d551d80815de5f",
             "gpulayer/engine/redis_tls.py", "copies"),
    # a Sentinel group as the broker: kombu's and Celery's pools ask the sentinels for the primary, and a
    # connection waits out a failover (installed into store/sentinel.py's pools)
    Borrowed("kombu.transport.redis:Channel._get_pool", "53a48983897d686c", _S, "overrides", also=(_T,)),
    Borrowed("kombu.transport.redis:Channel._connparams", "ec0dc65b9428e4ee", _S, "relies on"),
    Borrowed("celery.backends.redis:RedisBackend._get_pool", "602753b613faacb2", _R, "overrides", also=(_S,)),
    Borrowed("redis.sentinel:SentinelManagedConnection.connect", "acc4327a00305abc", _S, "overrides"),
    # ... a READONLY reply (a demoted primary) drops the connection, so the next connect asks the sentinels
    Borrowed("redis.sentinel:SentinelManagedConnection.read_response", "27091757efcb87c9", _S, "overrides"),
    Borrowed("redis.sentinel:SentinelConnectionPoolProxy.get_master_address", "0ca46368ea0e9cfe", _S, "relies on"),
    # ... and a connection dropped mid-retry reconnects through the sentinels, not to its old address
    Borrowed("redis.connection:Connection.send_packed_command", "d1db59721749c830", _S, "overrides"),
    Borrowed("redis.connection:AbstractConnection.send_packed_command", "d1db59721749c830", _S, "overrides"),
    # ... and a frozen primary's connections are cut when the sentinels announce the switch (SwitchWatch)
    Borrowed("redis.connection:ConnectionPool._get_free_connections", "db71b26c25276313", _S, "relies on"),
    Borrowed("redis.connection:ConnectionPool._get_in_use_connections", "cde4d312756fffb4", _S, "relies on"),
    Borrowed("redis.connection:ConnectionPool._get_pool_lock", "fe2b67aa72838995", _S, "relies on"),
    Borrowed("redis.connection:BlockingConnectionPool._get_free_connections", "33d11665f51e35df", _S, "relies on"),
    Borrowed("redis.connection:BlockingConnectionPool._get_in_use_connections", "d1c4f6e79bc6cc37", _S,
             "relies on"),
    # ... and Flower's broker page on a Sentinel group: the queues of the primary of the moment
    Borrowed("flower.views:BaseHandler.get_broker", "279d42ab972f9d52", "gpulayer/engine/flower_sentinel.py",
             "patches"),
    # Outside Celery's stack (not overrides, so their code stays where it is used; these entries are its pins).
    # The registry's full read makes 10,000 WorkerInfo records by setting a model's four slots, as
    # model_construct(_fields_set=...) does without its per-field loop (a tenth of its time); a shared fields set is
    # safe because a copy copies it first. tests/test_engine_contract.py also compares the two slot by slot.
    Borrowed("pydantic.main:BaseModel.__slots__", "ee20ca05baa55101", "gpulayer/store/packed.py", "relies on"),
    Borrowed("pydantic.main:BaseModel.model_construct", "3acca818511bdad4", "gpulayer/store/packed.py", "copies"),
    Borrowed("pydantic.main:BaseModel.__copy__", "78740488b5218d76", "gpulayer/store/packed.py", "relies on"),
    # a rank's fast exit switches off torch.library's exit finalizers: CPython's table of live finalizers
    # (finalize._registry, read as __init__ fills it and _select_for_exit reads it) and atexit's own runner
    Borrowed("weakref:finalize.__init__", "5523d6cade0941db", "gpulayer/procs/runner.py", "relies on"),
    Borrowed("weakref:finalize._select_for_exit", "7171ea29b41052ad", "gpulayer/procs/runner.py", "relies on"),
    Borrowed("weakref:finalize.atexit", "7b32198fca030dd2", "gpulayer/procs/runner.py", "relies on"),
    Borrowed("atexit:_run_exitfuncs", "863f7d4c9a63677c", "gpulayer/procs/runner.py", "relies on"),
)

# Files outside engine/ that touch a private name of pydantic or CPython (each listed above as an entry's ``ours``),
# and the names: tests/test_engine_contract.py fails on such a name anywhere else.
PRIVATE_OUTSIDE = {**dict.fromkeys(("__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__"),
                                  "gpulayer/store/packed.py"),
                   **dict.fromkeys(("_registry", "_run_exitfuncs"), "gpulayer/procs/runner.py")}

_BY_TARGET = {b.target: b for b in BORROWED}
_originals: dict[str, Any] = {}  # what patch() replaced on a class or module of this process, by target


# -- hashing ---------------------------------------------------------------------------------------
def normalise(source: str) -> str:
    """``source`` dedented, without blank lines, comment-only lines or trailing spaces."""
    lines = textwrap.dedent(source).splitlines()
    return "\n".join(line.rstrip() for line in lines if line.strip() and not line.lstrip().startswith("#"))


def digest(source: str) -> str:
    return hashlib.sha256(normalise(source).encode()).hexdigest()[:16]


def _split(target: str) -> tuple[str, list[str]]:
    module, _, qualname = target.partition(":")
    return module, qualname.split(".")


def resolve(target: str) -> Any:
    """The upstream object ``target`` names, as its module defines it (never a patch of this process)."""
    if target in _originals:
        return _originals[target]
    module, parts = _split(target)
    obj: Any = importlib.import_module(module)
    for part in parts:
        obj = inspect.getattr_static(obj, part)
    return obj


def source_of(obj: Any) -> str:
    """The source text of a function, method, property or class; the ``repr`` of a plain value."""
    if isinstance(obj, property):
        return "\n".join(source_of(f) for f in (obj.fget, obj.fset, obj.fdel) if f is not None)
    if isinstance(obj, (staticmethod, classmethod)):
        return source_of(obj.__func__)
    if isinstance(obj, functools.cached_property):
        return source_of(obj.func)
    if inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isclass(obj):
        return inspect.getsource(obj)
    return repr(obj)


def upstream_source(target: str) -> str:
    return source_of(resolve(target))


# -- the check -------------------------------------------------------------------------------------
def installed_version(package: str) -> str | None:
    if package == "python":
        return platform.python_version()
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Change:
    """An entry whose upstream source is not the one it was written against (or is gone)."""

    entry: Borrowed
    installed: str | None  # the installed version of its package
    found: str | None  # the installed source's hash; None when the method no longer exists

    def __str__(self) -> str:
        e = self.entry
        pinned = f"{e.package} {WRITTEN_FOR.get(e.package, '?')}"
        now = f"{e.package} {self.installed or 'not installed'}"
        pin = ("the python version in WRITTEN_FOR" if e.package == "python" else
               f"the {e.package} pin in pyproject.toml")
        todo = (f"then record its new hash in gpulayer/engine/upstream.py (`python -m gpulayer.engine.upstream` prints "
                f"them) and update {pin}")
        where = f"{HOW[e.how]} in {e.ours}" + "".join(f" and the code that relies on it in {f}" for f in e.also)
        if self.found is None:
            return (f"{e.name} no longer exists in {now} (gpulayer was written against {pinned}): rewrite "
                    f"{where} for the new version, {todo}")
        return (f"{e.name} changed upstream since {pinned} (installed: {now}; source hash {self.found}, recorded "
                f"{e.digest}): re-read {where} against the new source, {todo}")


def changes(entries: Iterable[Borrowed] = BORROWED,
            source: Callable[[str], str] = upstream_source) -> list[Change]:
    """The entries whose installed upstream source differs from the recorded one."""
    out = []
    for entry in entries:
        try:
            found: str | None = digest(source(entry.target))
        except (ImportError, AttributeError, OSError, TypeError):
            found = None
        if found != entry.digest:
            out.append(Change(entry, installed_version(entry.package), found))
    return out


UPSTREAM_PACKAGES = ("celery", "kombu", "flower", "redis", "billiard")


def _upstream(cls: type) -> bool:
    return cls.__module__.split(".")[0] in UPSTREAM_PACKAGES


def overrides_in(module: types.ModuleType) -> set[str]:
    """Targets (``module:Class.name``) of every upstream method a class defined in ``module`` overrides, itself
    or through a mixin of ours ahead of the upstream class in its MRO (engine/prefetch.py's ``Prefetch``)."""
    found = set()
    for cls in vars(module).values():
        if not inspect.isclass(cls) or cls.__module__ != module.__name__:
            continue
        mro = cls.__mro__
        for i, definer in enumerate(mro):
            if _upstream(definer) or definer is object:
                break
            for name, value in vars(definer).items():
                for base in mro[i + 1:]:
                    if _upstream(base) and name in vars(base):
                        # a method; not a class attribute naming a class (Channel.QoS = QoS)
                        if inspect.isfunction(value) or isinstance(value, (property, staticmethod, classmethod,
                                                                           functools.cached_property)):
                            found.add(f"{base.__module__}:{base.__name__}.{name}")
                        break
    return found


def unlisted(modules: Iterable[types.ModuleType]) -> set[str]:
    """Upstream methods the classes of ``modules`` override that ``BORROWED`` does not list."""
    return {t for m in modules for t in overrides_in(m)} - set(_BY_TARGET)


# -- patching --------------------------------------------------------------------------------------
def patch(owner: Any, target: str, value: Any, attribute: str | None = None) -> None:
    """Set ``target``'s attribute on ``owner`` (its class, an instance, or its module) to ``value``; or, for
    an instance attribute that upstream sets in ``target`` (no source of its own), ``attribute``.

    The one way engine/ replaces upstream code: ``target`` must be listed in ``BORROWED`` as patched,
    so the contract test watches what the patch stands in for.

    >>> patch(celery_trace, "celery.app.trace:LOG_RECEIVED", "Job %(id)s received")   # doctest: +SKIP
    """
    entry = _BY_TARGET.get(target)
    if entry is None or entry.how != "patches":
        raise LookupError(f"gpulayer.engine.upstream.patch: {target!r} is not listed as patched in "
                          "gpulayer/engine/upstream.py BORROWED; add it there (with its source hash) so the contract "
                          "test notices when upstream changes it")
    name = attribute or _split(target)[1][-1]
    if isinstance(owner, (type, types.ModuleType)) and attribute is None:
        _originals.setdefault(target, inspect.getattr_static(owner, name))
    setattr(owner, name, value)


def main(argv: list[str] | None = None) -> int:
    for entry in BORROWED:
        try:
            found = digest(upstream_source(entry.target))
        except (ImportError, AttributeError, OSError, TypeError) as err:
            found = f"missing ({type(err).__name__})"
        state = "ok" if found == entry.digest else "CHANGED"
        also = f"; also relied on in {', '.join(entry.also)}" if entry.also else ""
        print(f"{state:8} {entry.target:75} recorded {entry.digest} installed {found}  "
              f"[{entry.how}: {entry.ours}{also}]")
    print("installed: " + ", ".join(f"{p} {installed_version(p)}" for p in WRITTEN_FOR) +
          "; written for: " + ", ".join(f"{p} {v}" for p, v in WRITTEN_FOR.items()))
    found_changes = changes()
    for change in found_changes:
        print(change, file=sys.stderr)
    return 1 if found_changes else 0


if __name__ == "__main__":
    raise SystemExit(main())
