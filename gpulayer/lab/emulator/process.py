"""One emulator process: a shard of emulated workers on the real registry and queues.

``python -m gpulayer.lab.emulator.process '<json config>'`` (started by ``EmulatedFleet``).

- Heartbeats: every worker of the shard once per interval, with its busy and held
  slots, ``BEAT_SLICE`` workers per script call, the calls spread evenly over the
  interval as independent workers' beats are.
- Jobs: the transport's own take script (``store/lua/take.lua``), one message for
  each emulated worker that will run one, recorded (kombu's unacked entry and the
  worker's delivery record) in the same step, as ``gpulayer/engine/transport.py``
  does; completions store the result (``store_once.lua``) and ack, pipelined.
  Only priority-0 queue keys are read. Idle, it blocks on the capability queues'
  bells; private queues are swept every second.
- Gang orders: read for the workers the slot ledger says hold slots; each node
  acknowledges (node 0 publishes a rendezvous address), waits its scripted time
  and stores its ranks' results, or the scripted failure; then gives its slots
  back and reports, as the gang agent does.
- The coordinator: each process serves the control queue as a worker does
  (``gang/consumer.py``), for real.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import os
import signal
import sys
import threading
import time

import redis
from celery import states

from ... import app as app_mod
from ... import queues, signing
from ...engine import envelope, transport
from ...engine.delivery import UNACKED, UNACKED_INDEX, forget
from ...config import load_settings
from ...store import keys
from ...store.connection import connect_redis
from ...store.gangs import GangStore
from ...models import WorkerInfo
from ...store.registry import Registry, load_script, static_record
from ...gang.consumer import ControlConsumer
from ...gang.coordinator import node_stopped
from .fleet import emulated_workers
from .jobs import REF

log = logging.getLogger("gpulayer.lab.emulator")

BEAT_SLICE = 50  # workers per heartbeat script call: Redis runs each in ~0.4 ms (see heartbeat_loop)
TAKE_BATCH = 64  # takes pipelined per round trip
SWEEP_EVERY = 1.0  # seconds between sweeps of every queue (private queues, and messages put back without a bell)
GANG_POLL = 0.02  # seconds between reads of the slot ledger for new gang orders


def gang_script(payload: tuple) -> dict:
    """What an emulated gang node does, from the gang's signed payload: a ``jobs.emulated`` call's
    seconds, value, fail_rank and exit_code; any other function fails every rank (no user code)."""
    fn, args, kwargs = payload
    if fn != REF:
        return {"seconds": 0.0, "value": None, "fail_rank": "all", "exit_code": 1,
                "message": f"emulated workers run no user code (got {getattr(fn, 'name', fn)!r}); use {REF}"}
    names = ("seconds", "value", "fail_rank", "exit_code")
    call = {"seconds": 0.0, "value": None, "fail_rank": None, "exit_code": 1, **dict(zip(names, args)), **kwargs}
    return {**call, "message": "scripted failure of an emulated rank"}


class Emulator:
    def __init__(self, cfg: dict):
        settings = load_settings(broker_url=cfg["url"], secret=cfg["secret"])
        app_mod.configure(settings)
        self.settings = settings
        self.client = connect_redis(cfg["url"], socket_timeout=30)
        self.bell_client = connect_redis(cfg["url"], socket_timeout=30)
        self.registry = Registry(self.client, settings.worker_dead_after)
        self.interval = cfg.get("heartbeat_interval", 1.0)
        pid = os.getpid()
        self.workers = emulated_workers(cfg["n"], pid=pid, **cfg["spec"])[cfg["lo"]:cfg["hi"]]
        self.by_id = {w.id: w for w in self.workers}
        self.statics = {w.id: static_record(w) for w in self.workers}
        self.lives = {w.id: keys.life(w.id, pid) for w in self.workers}
        self.busy = {w.id: 0 for w in self.workers}
        self.held = {w.id: 0 for w in self.workers}
        self.readers: dict[str, list[str]] = {}  # queue key -> workers reading it
        for w in self.workers:
            for q in queues.for_worker(w.id, w.gpus, w.zone, w.region):
                self.readers.setdefault(q, []).append(w.id)
        self.shared = [q for q in self.readers if not q.startswith(queues.private(""))]
        self.bells = [keys.bell(q) for q in self.shared]
        self._cursor = {q: 0 for q in self.readers}
        self.backlog: set[str] = set()  # queues left with messages while every reader was full
        self.take = self.client.register_script(transport.TAKE)
        self.store_once = load_script(self.client, "store_once")
        self.gangs = GangStore(self.client)
        self.timers: list = []  # (due, seq, kind, payload)
        self._seq = itertools.count()
        self.stopping = threading.Event()
        self.taken = self.done = 0

    # -- heartbeats -------------------------------------------------------------------------------
    def beat(self, workers: list[WorkerInfo] | None = None) -> None:
        self.registry.beat([(w.id, self.statics[w.id], self.busy[w.id], self.held[w.id])
                            for w in (self.workers if workers is None else workers)])

    def heartbeat_loop(self) -> None:
        """Each worker beats once per interval, one ``Registry.beat`` chunk at a time spread over it.

        Real workers beat independently, at scattered moments, each in a script call of its own; beating
        ``BEAT_SLICE`` at once holds Redis for a fraction of a millisecond (500 held it ~4 ms, 20 times a second
        at 10,000 workers: every other client's command that came meanwhile waited behind it, a submit's p99).
        """
        slices = [self.workers[i:i + BEAT_SLICE] for i in range(0, len(self.workers), BEAT_SLICE)] or [[]]
        step = self.interval / len(slices)
        due = time.monotonic()
        while True:
            for part in slices:
                due += step
                if self.stopping.wait(max(0.0, due - time.monotonic())):
                    return
                try:
                    self.beat(part)
                except redis.RedisError as err:
                    log.warning("emulator heartbeat failed: %s", err)
            if time.monotonic() - due > self.interval:  # fell behind (a starved host): no burst to catch up
                due = time.monotonic()

    # -- jobs -------------------------------------------------------------------------------------
    def free_readers(self, queue: str, limit: int) -> list[str]:
        ws, start, out = self.readers[queue], self._cursor[queue], []
        for k in range(len(ws)):
            wid = ws[(start + k) % len(ws)]
            if self.busy[wid] + self.held[wid] < self.by_id[wid].slots:
                out.append(wid)
                if len(out) == limit:
                    self._cursor[queue] = (start + k + 1) % len(ws)
                    break
        return out

    def take_from(self, queue: str) -> int:
        """Take up to one message per free reader of ``queue``, in pipelined batches; how many were taken."""
        total = 0
        while not self.stopping.is_set():
            takers = self.free_readers(queue, TAKE_BATCH)
            if not takers:
                self.backlog.add(queue)
                return total
            pipe = self.client.pipeline(transaction=False)
            now = time.time()
            for wid in takers:
                self.take(keys=[queue, UNACKED, UNACKED_INDEX, keys.inflight(self.lives[wid])], args=[1, now, 0, 0],
                          client=pipe)
            got = [(wid, r) for wid, r in zip(takers, pipe.execute()) if r]
            if got:
                self.record(got)
            total += len(got)
            if len(got) < len(takers):  # the queue is empty
                self.backlog.discard(queue)
                return total
        return total

    def record(self, got) -> None:
        """Start what the takes brought (take.lua recorded each message as it took it)."""
        now = time.monotonic()
        for wid, (_, item) in got:
            message = envelope.parse(item)
            tag = envelope.delivery_tag(message)
            job_id = envelope.job_id(message)
            self.busy[wid] += 1
            self.taken += 1
            self.start_job(wid, tag, job_id, message, now)

    def start_job(self, wid: str, tag: str, job_id: str, message: dict, now: float) -> None:
        try:  # (the serializer the message names: the signed one refuses a bad signature)
            args, kwargs, _ = envelope.decode(message, accept=None)
        except Exception as err:  # a bad signature or a foreign message: fail it, as a worker would refuse it
            self.schedule(now, "job", (wid, tag, job_id, None, f"emulated worker could not decode the job: {err}"))
            return
        task = envelope.task_name(message)
        if task == app_mod.SUBMIT:
            fn = args[0] if args else None
            if fn == REF:
                call = list(args[1:])
                seconds = float(kwargs.get("seconds", call[0] if call else 0.0))
                value = kwargs.get("value", call[1] if len(call) > 1 else None)
                self.schedule(now + seconds, "job", (wid, tag, job_id, value, None))
            else:
                self.schedule(now, "job", (wid, tag, job_id, None,
                                           f"emulated worker {wid} runs no user code (got {getattr(fn, 'name', fn)!r}); "
                                           f"submit {REF} jobs to emulated workers, or pin real ones with worker_ids"))
        else:
            self.schedule(now, "job", (wid, tag, job_id, None, f"emulated worker {wid} does not know task {task!r}"))

    def schedule(self, due: float, kind: str, payload) -> None:
        heapq.heappush(self.timers, (due, next(self._seq), kind, payload))

    def complete(self, jobs) -> None:
        """Store every result (at most once) and ack, one pipeline for the batch."""
        if not jobs:
            return
        backend = app_mod.app.backend
        expires = int(backend.expires or 86400)
        pipe = self.client.pipeline(transaction=False)
        for wid, tag, job_id, value, error in jobs:
            if job_id:
                if error is None:
                    meta = {"status": states.SUCCESS, "result": value, "traceback": None, "children": [],
                            "date_done": None, "task_id": job_id}
                else:
                    meta = {"status": states.FAILURE, "result": backend.prepare_exception(RuntimeError(error)),
                            "traceback": None, "children": [], "date_done": None, "task_id": job_id}
                self.store_once(keys=[backend.get_key_for_task(job_id), keys.job_done(job_id)],
                                args=[backend.encode(meta), expires, "1"], client=pipe)
            forget(pipe, tag)
            pipe.hdel(keys.inflight(self.lives[wid]), tag)
        pipe.execute()
        for wid, *_ in jobs:
            self.busy[wid] -= 1
            self.done += 1

    # -- gangs ------------------------------------------------------------------------------------
    def poll_gangs(self) -> None:
        holders = [k.decode() for k, v in self.client.hgetall(keys.SLOTS_HELD).items() if int(v) > 0]
        mine = [w for w in holders if w in self.by_id]
        if not mine:
            return
        pipe = self.client.pipeline(transaction=False)
        for wid in mine:
            pipe.rpop(keys.agent_orders(wid))
        now = time.monotonic()
        for wid, raw in zip(mine, pipe.execute()):
            if raw:
                order = json.loads(raw)
                m = order["spec"]["procs_per_node"]
                self.held[wid] += m
                if order["node_rank"] == 0:
                    self.gangs.set_master(order["gang_id"], order["attempt"], self.by_id[wid].address, 29500)
                try:
                    script = gang_script(signing.loads(self.gangs.payload(order["gang_id"])))
                except Exception as err:
                    script = {"seconds": 0.0, "value": None, "fail_rank": "all", "exit_code": 1,
                              "message": f"emulated node could not read the gang's payload: {err}"}
                self.schedule(now + float(script["seconds"]), "gang", (wid, order, script))

    def finish_node(self, wid: str, order: dict, script: dict) -> None:
        gid, attempt, node = order["gang_id"], order["attempt"], order["node_rank"]
        m = order["spec"]["procs_per_node"]
        ranks = range(node * m, node * m + m)
        fail = script["fail_rank"]
        failing = ranks[0] if fail == "all" else (fail if fail in ranks else None)
        failed = failing is not None
        if failed:
            self.gangs.push_failure(gid, attempt, {
                "rank": failing, "worker": wid, "address": self.by_id[wid].address, "host": self.by_id[wid].hostname,
                "kind": "exit", "exit_code": script["exit_code"], "message": script["message"],
                "stderr_tail": "", "at": time.time()})
        else:
            for rank in ranks:
                self.gangs.set_result(gid, attempt, rank, signing.dumps(script["value"]))
        self.gangs.release(gid, attempt, wid, m)
        self.held[wid] -= m
        node_stopped(self.client, gid, attempt, node, {"worker": wid, "state": "failed" if failed else "succeeded",
                                                       "exit_codes": [script["exit_code"] if failed else 0] * m,
                                                       "stopped_at": None, "finished_at": time.time()})

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        self.beat()
        beater = threading.Thread(target=self.heartbeat_loop, name="emu-heartbeat", daemon=True)
        beater.start()
        control = threading.Thread(target=ControlConsumer(self.settings.broker_url).serve, args=(self.stopping,),
                                   name="emu-control", daemon=True)
        control.start()
        next_sweep = next_gangs = 0.0
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                due = []
                while self.timers and self.timers[0][0] <= now:
                    _, _, kind, payload = heapq.heappop(self.timers)
                    if kind == "job":
                        due.append(payload)
                    else:
                        self.finish_node(*payload)
                self.complete(due)
                if now >= next_gangs:
                    self.poll_gangs()
                    next_gangs = now + GANG_POLL
                took = 0
                if now >= next_sweep:
                    took += self.sweep()
                    next_sweep = now + SWEEP_EVERY
                for q in list(self.backlog):
                    took += self.take_from(q)
                if took == 0:
                    wait = min(GANG_POLL, max(0.0, (self.timers[0][0] - time.monotonic()) if self.timers else GANG_POLL))
                    if wait >= 0.01 and self.bells:
                        rang = self.bell_client.brpop(self.bells, timeout=wait)
                        if rang:
                            self.take_from(rang[0].decode()[len(keys.bell("")):])
        finally:
            self.stopping.set()
            beater.join(5)
            control.join(5)
            self.deregister()

    def sweep(self) -> int:
        pipe = self.client.pipeline(transaction=False)
        names = list(self.readers)
        for q in names:
            pipe.llen(q)
        return sum(self.take_from(q) for q, n in zip(names, pipe.execute()) if n)

    def deregister(self) -> None:
        try:
            self.registry.remove_many([w.id for w in self.workers])
        except redis.RedisError as err:
            log.warning("emulator could not deregister its workers: %s", err)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    em = Emulator(json.loads(argv[0]))
    signal.signal(signal.SIGTERM, lambda *_: em.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: em.stopping.set())
    log.info("emulating %d workers (%s .. %s)", len(em.workers), em.workers[0].id, em.workers[-1].id)
    em.run()
    log.info("stopped after %d jobs taken, %d done", em.taken, em.done)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
