"""The gang agent: runs in each worker's main process, beside Celery's consumer.

It takes gang orders from the worker's order list, holds the reserved slots
(the consumer takes no ordinary job on them), and hands the local ranks to the
rank runner (``ranks.py``: forked from the worker's warm template, or started
fresh, or under torchrun), which streams their output and stops them all on
the first local failure. The agent tells the other nodes (a failure report in
Redis, which publishes the gang's event) and stops its ranks on theirs.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import redis
from celery import bootsteps

from .. import signing
from ..deadline import Deadline
from . import workdir
from ..workspace import cache as code_cache
from ..workspace.shipping import CODE_ENV
from ..app import settings as app_settings
from ..engine.qos import gate_consumer, reserved_count, running_count
from ..procs import warm
from .coordinator import node_stopped, worker_lost
from ..procs.env import (BACKEND_ENV, RankLayout, StoreHost, free_port, rank_env, socket_ifname_env,
                         torchrun_command)
from ..procs.runner import RankCommand, RankFailure, RankRunner
from ..output.lines import ERR, OUT
from ..output.sink import JobOutput, process_sink
from ..models import GangSpec, GangState
from ..store import keys
from ..store.cluster import cluster_id
from ..store.connection import client_name, connect_redis
from ..engine.sentinel import broker_url
from ..store.gangs import GangStore
from ..store.broker_loss import LOST
from ..store.reconcile import node_id, switched_within
from ..procs import runtime
from ..loopstep import LoopStep

log = logging.getLogger(__name__)

POLL = 0.01  # seconds between checks of the local ranks and the gang's events
SWEEP_EVERY = 2.0  # seconds between sweeps of this worker's gang directories whose gang ended elsewhere
GRACE = 0.5  # seconds between SIGTERM and SIGKILL when a gang is cancelled or its worker stops
FAIL_GRACE = 0.1  # the same once the gang has failed: nothing is left to save (torchrun ignores SIGTERM)


class Slots:
    """How many of this worker's slots gangs hold; the consumer and heartbeat read it."""

    def __init__(self) -> None:
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        return self._held

    def add(self, n: int) -> None:
        with self._lock:
            self._held = max(0, self._held + n)


slots = Slots()


class Runs:
    """This worker life's gang nodes: those running (with their slots), and every order it took.

    ``gang/reconcile.py`` reads both under ``lock`` to re-assert the worker's ledger entry after a broker
    failover; a node that ends gives its slots back under the same lock, so the entry counts it either
    before its release or not at all. An order taken twice (its pop was lost in a failover, so the new primary
    hands it out again) runs once.
    """

    KEEP = 10_000  # orders remembered; a failover hands back at most the last few

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[str, GangRun] = {}  # node id (store.reconcile.node_id) -> its run
        self.taken: dict[str, None] = {}  # node ids of the orders taken, oldest first

    def take(self, node: str) -> bool:
        """False when this life already took the order for ``node`` (call it under ``lock``)."""
        if node in self.taken:
            return False
        self.taken[node] = None
        while len(self.taken) > self.KEEP:
            del self.taken[next(iter(self.taken))]
        return True


runs = Runs()


def ordinary_active() -> int:
    """Jobs running on this worker's pool (the coordinator runs beside it, in ``gang/consumer.py``)."""
    return running_count()


class SlotGate(bootsteps.StartStopStep):
    """Consumer step: take a message only while ordinary jobs + gang-held slots < slots.

    Like Celery's ``worker_disable_prefetch``, so reserved slots are not eaten by
    messages already buffered, with the gangs' holds subtracted. While no gang holds
    slots here, the transport may take ``prefetch_multiplier`` messages per free slot
    and keep the extra ones itself, recorded, until a slot frees (engine/transport.py).
    """

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def start(self, c) -> None:
        total = runtime.current_worker().slots
        settings = app_settings()
        multiplier, hold = (settings.prefetch_multiplier, settings.prefetch_hold) if settings else (1, 0.0)
        # Taking ahead only while no gang holds slots here: the transport hands its buffer back once one does.
        gate_consumer(c, lambda: total - slots.held - reserved_count(), lambda: 0 if slots.held else multiplier, hold)


class GangAgent(LoopStep):
    thread_name = "gpulayer-gang-agent"

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.worker_info = runtime.current_worker()
        self.url = broker_url(worker.app)
        self.runs: dict[str, GangRun] = {}
        self.cluster_id = ""  # the cluster's id (store/cluster.py), read at start
        self.root = None  # this cluster's root on this machine (workdir.py), where gang directories live

    def start(self, worker) -> None:
        client = connect_redis(self.url)
        self.cluster_id = cluster_id(client)
        self.root = workdir.root(self.cluster_id)
        # (A previous life's nodes were failed before this worker registered: forget_previous_life.)
        self._sweep(client)  # a previous life's directories of gangs that ended meanwhile
        client.close()
        warm.shared_template()  # imports torch in the background; the first gang forks from it
        super().start(worker)

    def _sweep(self, client) -> None:
        cluster_id(client, self.cluster_id)  # given back to a Redis that lost it: the next worker uses it too
        store = GangStore(client)
        busy = {r.base for r in list(self.runs.values()) if r.base is not None and not r.ended.is_set()}
        workdir.sweep(self.root, self.worker_info.id, busy, lambda gang_id: store.state(gang_id).done)
        code_cache.sweep(self.root / code_cache.CODE_DIR)  # archives no job here used for a day

    def loop(self) -> None:
        client = connect_redis(self.url, socket_timeout=10, name=client_name(self.worker_info.id, "gang-agent"))
        next_sweep = time.monotonic() + SWEEP_EVERY
        connected = False
        orders = keys.agent_orders(self.worker_info.id)
        while not self.stopping.is_set():
            if time.monotonic() > next_sweep:
                next_sweep = time.monotonic() + SWEEP_EVERY
                try:
                    self._sweep(client)
                except (redis.RedisError, OSError) as err:
                    log.warning("gpulayer agent: cannot sweep gang directories (%s); retrying", err)
            try:
                if not connected:
                    self.blocks_on(client)  # stop() ends the read at once
                    connected = True
                # Waits for an order without taking it (the list turns round): it is taken below, under runs.lock,
                # so a re-assertion of the ledger after a failover finds each order in the list or among the runs.
                item = client.brpoplpush(orders, orders, timeout=1)
            except redis.RedisError as err:
                connected = False
                if not self.stopping.is_set():
                    log.warning("gpulayer agent: cannot read orders (%s); retrying", err)
                self.stopping.wait(1)
                continue
            if not item:
                continue
            with runs.lock:
                try:
                    raw = client.rpop(orders)
                except redis.RedisError as err:
                    log.warning("gpulayer agent: cannot take an order (%s); retrying", err)
                    continue
                if raw is None:
                    continue
                order = json.loads(raw)
                node = node_id(order["gang_id"], order["attempt"], order["node_rank"])
                if not runs.take(node):
                    log.warning("gpulayer agent: the order for gang %s attempt %s node %s came again (its first "
                                "take was lost in a broker failover); it runs once", *node.split())
                    continue
                run = GangRun(order, self.worker_info, self.url, self.root)
                runs.running[node] = run
                self.runs[order["gang_id"]] = run
                threading.Thread(target=run.run, name=f"gang-{order['gang_id'][:8]}", daemon=True).start()
        client.close()

    def stop(self, worker) -> None:
        active = list(self.runs.values())
        for run in active:
            run.abort("the worker is shutting down")
        super().stop(worker)
        deadline = Deadline(GRACE + 2.0)
        for run in active:  # each removes its own directory once its ranks are stopped
            run.ended.wait(deadline.remaining())
        # What is left (gangs between attempts, a run that did not end in time): nothing on a
        # stopped worker resumes from it.
        if self.root is not None:
            workdir.sweep(self.root, self.worker_info.id, set(), lambda gang_id: True)
        warm.close_shared_template()


_sink_clients: dict[str, redis.Redis] = {}  # the rank sink's own connection (a gang's closes when it ends)


def rank_sink(url: str):
    """This worker's sink for its ranks' lines (gpulayer/output/sink.py)."""
    def client():
        if url not in _sink_clients:
            _sink_clients[url] = connect_redis(url, socket_timeout=10)
        return _sink_clients[url]

    settings = app_settings()
    return process_sink(client, settings.result_expires if settings else 86400)


class GangRun:
    """One gang attempt's ranks on this worker."""

    def __init__(self, order: dict, info, url: str, root):
        self.order = order
        self.spec = GangSpec.model_validate(order["spec"])
        self.gang_id, self.attempt, self.node = order["gang_id"], order["attempt"], order["node_rank"]
        self.node_id = node_id(self.gang_id, self.attempt, self.node)
        self.worker_info = info
        self.url = url
        self.client = connect_redis(url, socket_timeout=10)
        self.store = GangStore(self.client)
        self.registry = runtime.registry.using(self.client)  # the worker's death line (worker.main sets it)
        self.runner: RankRunner | None = None
        self.outputs: dict[int, JobOutput] = {}  # rank -> its lines, on their way home (gpulayer/output/)
        self.store_host: StoreHost | None = None  # node 0: the attempt's TCP store, while its ranks run
        self._aborted = threading.Event()
        self.abort_reason = ""
        self.abort_kind = "agent"
        self.preempted_grace: float | None = None  # set once a gang of higher priority preempts this attempt
        self.ended = threading.Event()
        # This node's gang directory (``workdir.py``): the shipped working directory (the ranks' cwd)
        # and torchrun's logs live in it, and nothing else of the gang's is left on this worker.
        self.base = (workdir.base_for(root, self.gang_id, info.id)
                     if self.spec.workdir is not None or self.spec.launcher == "torchrun" else None)
        self.cwd = None

    def abort(self, reason: str, kind: str = "agent") -> None:
        """Stop this node's ranks and report ``reason`` as the attempt's failure (``kind``: the report's)."""
        self.abort_reason, self.abort_kind = reason, kind
        self._aborted.set()

    def run(self) -> None:
        m = self.spec.procs_per_node
        slots.add(m)
        outcome, stopped_at, codes = "failed", None, []
        events = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            events.subscribe(keys.gang_events(self.gang_id))
            if not self._wait_for_room(events) or not self._launch():
                outcome = "stopped"
            else:
                outcome, stopped_at, codes = self._watch(events)
        except Exception as err:
            log.exception("gpulayer agent: gang %s failed on this worker", self.gang_id)
            self._report({"rank": self.node * m, "kind": "agent", "message": f"{type(err).__name__}: {err}"})
            if self.runner is not None:
                stopped_at = self.runner.stop(FAIL_GRACE).stopped_at
        finally:
            events.close()
            if self.store_host is not None:  # as when rank 0 hosted it: the store ends with node 0's ranks
                self.store_host.close()
            kept = self._end_workdir(outcome)
            # Slots first, then the report: a client that saw every node report finds the slots free. Under
            # runs.lock: a re-assertion of the ledger (a failover) counts this node before its release or not at all.
            with runs.lock:
                runs.running.pop(self.node_id, None)
                self.store.release(self.gang_id, self.attempt, self.worker_info.id, m)
            slots.add(-m)
            self._close_outputs()
            # The last node to report ends the attempt, and the waiting gangs are tried on the freed slots.
            node_stopped(self.client, self.gang_id, self.attempt, self.node, {
                "worker": self.worker_info.id, "state": outcome, "exit_codes": codes, "stopped_at": stopped_at,
                "finished_at": time.time(), "workdir": kept})
            self.client.close()
            self.ended.set()

    # -- start ------------------------------------------------------------------------------------
    def _wait_for_room(self, events) -> bool:
        """Ordinary jobs already running keep their slots; start the ranks once they fit beside them.

        False if the gang ends meanwhile: a peer failed, the worker stops, or it is cancelled (the event on
        ``events``, or its state if the cancel came before this agent subscribed)."""
        if ordinary_active() > self.worker_info.slots - slots.held and self.store.state(self.gang_id).done:
            return False
        while ordinary_active() > self.worker_info.slots - slots.held:
            if self._aborted.is_set() or self.store.failures(self.gang_id, self.attempt):
                return False
            try:
                msg = events.get_message(timeout=POLL)
            except LOST:  # a broker failover: the loop reads the failures and the state again
                msg = None
                time.sleep(POLL)
            if msg and (msg["data"] == b"cancel" or self._preempt_grace(msg["data"]) is not None):
                return False
        return True

    def _preempt_grace(self, data) -> float | None:
        """The grace of a ``preempt:<attempt>:<grace>`` event for this attempt, else None."""
        text = data.decode() if isinstance(data, bytes) else str(data)
        head, _, grace = text.rpartition(":")
        if head != f"preempt:{self.attempt}":
            return None
        try:
            return float(grace)
        except ValueError:
            return None

    def _preempt_mark(self) -> float | None:
        """The grace when the record says this attempt is being preempted (its event may have come before
        this agent listened, or been lost in a broker failover), else None."""
        mark = self.store.record(self.gang_id).get("preempting")
        if mark and int(mark["attempt"]) == self.attempt:
            return float(mark["grace"])
        return None

    def _master(self) -> tuple[str, int, bool] | None:
        """The attempt's TCP store: ``(addr, port, agent_store)``. Node 0 hosts it here when it can (direct
        launcher, torch imported: ``StoreHost``), so it listens before any rank starts; else rank 0 will."""
        if self.node == 0:
            addr = self.worker_info.address
            if self.spec.launcher == "direct":
                try:
                    self.store_host = StoreHost.start(addr)
                except (RuntimeError, OSError) as err:  # torch's store could not listen here: rank 0 will
                    log.warning("gpulayer agent: cannot host gang %s's TCP store (%s); rank 0 hosts it",
                                self.gang_id, err)
            port = self.store_host.port if self.store_host is not None else free_port(addr)
            self.store.set_master(self.gang_id, self.attempt, addr, port, agent_store=self.store_host is not None)
            return addr, port, self.store_host is not None
        deadline = Deadline(120)
        while not deadline.expired() and not self._aborted.is_set():
            found = self.store.store_address(self.gang_id, self.attempt)
            if found:
                return found
            if self.store.failures(self.gang_id, self.attempt):
                return None
            time.sleep(POLL)
        self._report({"rank": self.node * self.spec.procs_per_node, "kind": "agent",
                      "message": "node 0 did not publish its rendezvous address within 120 s"})
        return None

    def _launch(self) -> bool:
        # A peer that failed before this agent subscribed to the gang's events (its workdir could not be made,
        # say) published its "fail" to nobody here: read the record, or these ranks would wait for it forever.
        if self.store.failures(self.gang_id, self.attempt) or self._preempt_mark() is not None:
            return False
        if self.spec.workdir is not None:  # before the rendezvous address is out: unpacking takes a while
            self.cwd, how = workdir.for_attempt(
                self.base, self.gang_id, self.worker_info.id, self._shipped,
                self.spec.workdir.keep, attempt=self.attempt, restart_from=self.spec.workdir.restart_from,
                node0=self._node0_files)
            if self.attempt:
                log.info("gpulayer agent: gang %s attempt %d node %d starts in %s (%s)", self.gang_id,
                         self.attempt, self.node, self.cwd, how)
        master = self._master()
        if master is None:
            return False
        addr, port, agent_store = master
        s, m = self.spec, self.spec.procs_per_node
        base = dict(os.environ)
        base.update(GPULAYER_BROKER_URL=self.url, GPULAYER_SECRET=signing.current_secret().decode(),
                    GPULAYER_WORKER_ID=self.worker_info.id, GPULAYER_WORKER_ADDR=self.worker_info.address,
                    GPULAYER_GANG_ID=self.gang_id, PYTHONUNBUFFERED="1")
        base.pop("OMP_NUM_THREADS", None)  # the worker's per-slot value; ranks get cores / local ranks
        base.update(socket_ifname_env(self.worker_info.address, base))
        if self.cwd is not None:
            base["GPULAYER_WORKDIR"] = str(self.cwd)
        if s.code and self.cwd is None:  # the user's code, first on each rank's sys.path (workspace/cache.py);
            base[CODE_ENV] = s.code      # with a working directory, that copy of it is the ranks' (run_script)
        else:
            base.pop(CODE_ENV, None)
        args = [self.gang_id, str(self.attempt)]
        cwd = str(self.cwd) if self.cwd is not None else None  # the shipped workdir (None: the worker's)
        if s.launcher == "torchrun":
            if self.cwd is None:
                workdir.make(self.base)  # for its logs; made here, in this user's own cluster root
            env = dict(base, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // m)), **{BACKEND_ENV: s.backend})
            cmd = torchrun_command(s.nodes, m, self.node, addr, port, ["-m", "gpulayer.gang.rank", *args],
                                   max_restarts=0, run_id=self.gang_id, log_dir=str(self.base / "torchrun"))
            commands = [RankCommand(tuple(range(self.node * m, self.node * m + m)), tuple(cmd[1:]), env, cwd,
                                    warm=False, dies_of_sigterm=False)]
        else:
            commands = []
            for local in range(m):
                layout = RankLayout(self.node, local, s.nodes, m)
                env = rank_env(layout, master_addr=addr, master_port=port, run_id=self.gang_id,
                               restart_count=self.attempt, max_restarts=s.max_restarts, base_env=base,
                               backend=s.backend, agent_store=agent_store)
                commands.append(RankCommand((layout.rank,), ("-m", "gpulayer.gang.rank", *args), env, cwd))
        template = warm.shared_template() if s.warm and s.launcher == "direct" else None
        self.runner = RankRunner(commands, on_output=self._publish_line, on_failure=self._first_failure,
                                 template=template, grace=FAIL_GRACE,
                                 split_line=_torchrun_line if s.launcher == "torchrun" else None)
        self.runner.start()
        return True

    def _shipped(self) -> bytes:
        """The archive of the working directory this gang ships: its code's (workspace/, ``spec.code``)."""
        blob = self.client.get(keys.code_archive(self.spec.code)) if self.spec.code else None
        if blob is None:
            raise KeyError(f"gang {self.gang_id}'s working directory (code {self.spec.code}) is not in Redis any "
                           "more (expired, or lost with the broker's data); run the job again")
        return signing.verify(blob)

    def _publish_line(self, rank: int, stream: str, line: str) -> None:
        """A rank's output line: to the sending client and the rank's tail, limited and batched as a job's."""
        out = self.outputs.get(rank)
        if out is None:
            out = self.outputs[rank] = JobOutput(lambda: rank_sink(self.url), self.gang_id, self.spec.name,
                                                 self.worker_info.id, 0, self.spec.output, rank)
        out.line(OUT if stream == "stdout" else ERR, line)

    def _close_outputs(self) -> None:
        """The ranks ended: their last lines go before this node reports (the client's get() waits for them)."""
        for out in list(self.outputs.values()):
            try:
                out.close()
            except Exception:
                log.debug("gpulayer agent: gang %s's last output lines were not sent", self.gang_id, exc_info=True)

    def _end_workdir(self, outcome: str) -> str | None:
        """Node 0 packs what its ranks wrote for the client; the directory goes once the gang is over.

        Returns the ranks' directory when it is kept for the user (``--keep-workdir``).
        """
        if self.base is None or not self.base.exists():
            return None
        if self.spec.workdir is None:  # torchrun's logs only: the stderr tails are already in the reports
            workdir.remove(self.base)
            return None
        try:
            rec = self.store.record(self.gang_id)
            cancelled = rec["state"] == GangState.CANCELLED.value
            preempted = outcome == "preempted" and not cancelled  # requeued whole: the next attempt resumes
            failed_before = self.attempt - rec["preemptions"]  # the restarts used (a preemption uses none)
            all_results = outcome == "succeeded" and len(self.store.results(self.gang_id, self.attempt)) == \
                self.spec.world_size
            pull, over = workdir.end_of_attempt(outcome, failed_before, self.spec.max_restarts, cancelled=cancelled,
                                                aborted=self._aborted.is_set(), all_results=all_results)
            if preempted:
                pull, over = False, False
            node0 = self.node == 0 and self.cwd is not None
            pull = pull and node0 and self.spec.workdir.pull
            # A restart may follow: the next attempt's nodes start from these files (--restart-from node0).
            restart = (node0 and self.spec.workdir.restart_from == "node0" and not cancelled
                       and (preempted or failed_before < self.spec.max_restarts)
                       and not (outcome == "succeeded" and all_results))
            packed = self._pack() if pull or restart else None
            if restart:  # before this node's report: the attempt cannot be concluded (and restarted) without it
                self.store.set_restart_files(self.gang_id, packed)
            if pull:
                self.store.set_pulled(self.gang_id, packed)
        except Exception:  # the ranks' outcome stands; only what comes back is lost (the sweep removes it)
            log.exception("gpulayer agent: cannot pack gang %s's working directory", self.gang_id)
            over = False
        if self.spec.workdir.keep:
            return str(self.base / "work")
        if over:
            workdir.remove(self.base)
        return None

    def _pack(self) -> dict:
        """Node 0's new and changed files, signed: for the client at the end, for the other nodes on a restart."""
        record = {"attempt": self.attempt, "worker": self.worker_info.id}
        try:
            blob, files = workdir.collect(self.base, self.spec.workdir.max_pull_bytes)
            record.update(archive=signing.sign(blob), files=json.dumps(files), bytes=sum(n for _, n in files))
        except workdir.PullTooBig as too_big:
            record["error"] = str(too_big)
        return record

    def _node0_files(self) -> workdir.Node0Files | None:
        """What node 0's agent packed at the end of the attempt before (``_end_workdir``), or None."""
        raw = self.store.restart_files(self.gang_id)
        if raw is None:
            return None
        return workdir.Node0Files(
            attempt=int(raw["attempt"]), worker=raw["worker"].decode(),
            archive=signing.verify(raw["archive"]) if "archive" in raw else None,
            error=raw["error"].decode() if "error" in raw else None)

    # -- watch and stop ---------------------------------------------------------------------------
    def _watch(self, events) -> tuple[str, float | None, list]:
        """Until the ranks end, a peer fails (its agent's event), the gang is cancelled or a peer is lost."""
        runner = self.runner
        next_peer_check = time.monotonic() + 1.0
        missed = False  # the events' connection broke (a broker failover): what was published meanwhile is lost
        while True:
            out = runner.wait(0)
            if out is not None:
                self._report_final(out)
                return out.state, out.stopped_at, out.exit_codes
            try:
                msg = events.get_message(timeout=POLL)  # connects (to the new primary) and subscribes again
                data = str(msg["data"], "utf-8", "replace") if msg else ""
                if missed and not data:
                    data = self._missed_event()
                missed = False
            except LOST as err:  # the ranks run on: the broker is away, not the gang
                if not missed:
                    log.warning("gpulayer agent: gang %s lost its events' connection (%s); listening again",
                                self.gang_id, err)
                missed, data = True, ""
                time.sleep(POLL)
            stop = None
            grace = self._preempt_grace(data) if data.startswith("preempt:") else None
            if grace is None and data == "" and time.monotonic() > next_peer_check:
                try:
                    grace = self._preempt_mark()  # its event may have come before this agent listened
                except LOST:
                    grace = None
            if grace is not None:
                # SIGTERM, then SIGKILL after the grace: the ranks may save a checkpoint. Not a failure: no report,
                # so the other nodes keep their own grace too; the coordinator requeues the gang (conclude).
                self.preempted_grace = grace
                stop = runner.stop(grace, reason="preempted")
                return "preempted", stop.stopped_at, stop.exit_codes
            if data == f"fail:{self.attempt}":
                stop = runner.stop(FAIL_GRACE, reason="peer failed")
            elif data == "cancel":
                stop = runner.stop(GRACE, reason="cancelled")
            elif self._aborted.is_set():
                self._report({"rank": self.node * self.spec.procs_per_node, "kind": self.abort_kind,
                              "message": self.abort_reason})
                stop = runner.stop(GRACE, reason="aborted")
                return "failed", stop.stopped_at, stop.exit_codes
            elif time.monotonic() > next_peer_check:
                next_peer_check = time.monotonic() + 1.0
                try:
                    lost = self._lost_peer()
                except LOST:  # the broker is away: its heartbeats cannot be judged now
                    lost = None
                if lost is not None:
                    node, worker_id = lost
                    self._report({"rank": node * self.spec.procs_per_node, "kind": "worker_lost",
                                  "worker": worker_id,
                                  "message": f"worker {worker_id} (node {node}) stopped heartbeating"})
                    stop = runner.stop(FAIL_GRACE, reason="peer lost")
                    return "failed", stop.stopped_at, stop.exit_codes
            if stop is not None:
                if stop.state == "failed":  # our own failure's event came back to us: already handled
                    continue
                self._report_final(stop)
                return "stopped", stop.stopped_at, stop.exit_codes

    def _missed_event(self) -> str:
        """The event this node may have missed while its connection was away: a peer's failure, or a cancel."""
        if self.store.failures(self.gang_id, self.attempt):
            return f"fail:{self.attempt}"
        grace = self._preempt_mark()
        if grace is not None:
            return f"preempt:{self.attempt}:{grace}"
        return "cancel" if self.store.state(self.gang_id) == GangState.CANCELLED else ""

    def _lost_peer(self) -> tuple[int, str] | None:
        """The first node whose worker is silent past ``worker_dead_after`` (or buried), by Redis's clock.

        One ZSCORE per node of this gang, pipelined: its cost follows the gang, not the fleet.
        """
        if switched_within(self.client, self.registry.dead_after) is not None:
            return None  # the broker just failed over: its heartbeats are as old as the switch (store/reconcile.py)
        workers = self.order["workers"]
        ages = self.registry.ages(workers)
        for node, worker_id in enumerate(workers):
            age = ages.get(worker_id)
            if age is None or age > self.registry.dead_after:
                return node, worker_id
        return None

    def _report_final(self, outcome) -> None:
        """Every local failure, with the complete stderr tails: the client names the earliest of all nodes'.

        Also when this node was stopped by a peer's event: its own ranks may have failed first.
        """
        for failure in outcome.failures:
            self._report(dict(failure.to_dict(), final=True))

    def _first_failure(self, failure: RankFailure) -> None:
        """The runner's first local failure: tell every other node now (they stop on the event)."""
        self._report(failure.to_dict())

    def _report(self, report: dict) -> None:
        report = dict(report)
        report.setdefault("worker", self.worker_info.id)
        report.setdefault("host", socket.gethostname())
        report.update(address=self.worker_info.address, at=time.time())
        if report.get("worker") is None:
            report["worker"] = self.worker_info.id
        self.store.push_failure(self.gang_id, self.attempt, report)


def _torchrun_line(command: RankCommand, line: str) -> tuple[int, str]:
    """torchrun's ``--tee 3`` prefixes each line with ``[default<local rank>]:``."""
    if line.startswith("[default") and "]:" in line:
        tag, _, rest = line.partition("]:")
        local = tag[len("[default"):]
        if local.isdigit():
            return command.ranks[0] + int(local), rest
    return command.ranks[0], line
