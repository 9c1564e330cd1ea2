"""Gang records and the slot ledger in Redis (key schema in ``keys.py``)."""

from __future__ import annotations

import json
import time

import redis

from ..models import GangPlacement, GangSpec, GangState
from . import durability, fair, keys
from .registry import load_script

KEEP_SECONDS = 86400
PULLED_KEEP_SECONDS = 3600  # what came back from a gang's working directory waits this long for its client
FIRST_REASON = "waiting for the coordinator"  # a new gang's, until the coordinator places it or says why it waits
PRIORITY_STRIDE = 2.0 ** 40  # arrivals a priority step outweighs in the waiting line (exact in a double)


def line_score(priority: int, arrival: float) -> float:
    """A gang's place in the waiting line: higher priority first, then order of arrival."""
    return float(arrival) - priority * PRIORITY_STRIDE


class GangStore:
    def __init__(self, client: redis.Redis, waits: durability.Durability = durability.NONE):
        self.r = client
        self.waits = waits  # reserve() returns once a replica has the reservation (store/durability.py)
        self._reserve = load_script(client, "reserve")
        self._release = load_script(client, "release")

    # -- the record -------------------------------------------------------------------------------
    def create(self, spec: GangSpec, payload: bytes) -> None:
        """Record a new gang and put it in the waiting line (numbered by arrival, across every client).

        The working directory a gang ships (``spec.workdir``) is its code's archive (``spec.code``,
        ``keys.code_archive``), as every job's code is.
        """
        now = time.time()
        arrival = self.r.incr(keys.GANG_ARRIVALS)
        pipe = self.r.pipeline()
        pipe.hset(keys.gang(spec.gang_id), mapping={
            "spec": spec.model_dump_json(), "state": GangState.WAITING.value, "attempt": 0,
            "reason": FIRST_REASON, "created": now, "arrival": arrival})
        pipe.set(keys.gang_payload(spec.gang_id), payload)
        pipe.zadd(keys.GANGS, {spec.gang_id: now})
        pipe.zadd(keys.GANGS_WAITING, {spec.gang_id: line_score(spec.priority, arrival)})
        pipe.execute()

    def spec(self, gang_id: str) -> GangSpec:
        raw = self.r.hget(keys.gang(gang_id), "spec")
        if raw is None:
            raise KeyError(f"no gang {gang_id} in Redis (finished over a day ago, or never submitted)")
        return GangSpec.model_validate_json(raw)

    def record(self, gang_id: str) -> dict:
        raw = {k.decode(): v.decode() for k, v in self.r.hgetall(keys.gang(gang_id)).items()}
        out = {"gang_id": gang_id, "state": raw.get("state"), "reason": raw.get("reason", ""),
               "attempt": int(raw.get("attempt", 0)), "created": float(raw.get("created", 0))}
        if raw.get("waiting_since"):
            out["waiting_since"] = float(raw["waiting_since"])
        if raw.get("started"):
            out["started"] = float(raw["started"])
        out["preemptions"] = int(raw.get("preemptions", 0))
        if raw.get("preempted"):  # the last preemption, in a line: "preempted by <id> (<reason>)"
            out["preempted"] = raw["preempted"]
        if raw.get("preempting"):  # being stopped for another gang: {"attempt", "by", "reason", "grace"}
            out["preempting"] = json.loads(raw["preempting"])
        if raw.get("placement"):
            out["placement"] = json.loads(raw["placement"])
        if raw.get("spec"):
            out["spec"] = json.loads(raw["spec"])
        return out

    def state(self, gang_id: str) -> GangState:
        raw = self.r.hget(keys.gang(gang_id), "state")
        return GangState(raw.decode()) if raw else GangState.FAILED

    def set_waiting(self, gang_id: str, reason: str, since: float | None = None) -> None:
        """Why the gang waits; ``since`` (Redis's clock) starts its timeout if none started yet."""
        pipe = self.r.pipeline()
        pipe.hset(keys.gang(gang_id), mapping={"state": GangState.WAITING.value, "reason": reason})
        if since is not None:
            pipe.hsetnx(keys.gang(gang_id), "waiting_since", since)
        pipe.execute()

    def finish(self, gang_id: str, state: GangState, reason: str = "") -> None:
        pipe = self.r.pipeline()
        self._finish(pipe, gang_id, state, reason)
        pipe.execute()

    def finish_if_waiting(self, gang_id: str, state: GangState, reason: str) -> bool:
        """End a gang that still waits (its timeout, or a refusal); False if a coordinator placed it meanwhile."""
        key = keys.gang(gang_id)
        with self.r.pipeline() as pipe:
            try:
                pipe.watch(key)
                if pipe.hget(key, "state") != GangState.WAITING.value.encode():
                    return False
                pipe.multi()
                self._finish(pipe, gang_id, state, reason)
                pipe.execute()
                return True
            except redis.WatchError:  # reserve.lua made it run first
                return False

    def _finish(self, pipe, gang_id: str, state: GangState, reason: str) -> None:
        pipe.hset(keys.gang(gang_id), mapping={"state": state.value, "reason": reason, "finished": time.time()})
        pipe.zrem(keys.GANGS, gang_id)
        pipe.zrem(keys.GANGS_WAITING, gang_id)
        for key in (keys.gang(gang_id), keys.gang_payload(gang_id)):
            pipe.expire(key, KEEP_SECONDS)
        pipe.delete(keys.gang_restart_files(gang_id))  # no attempt starts after this
        pipe.publish(keys.gang_events(gang_id), f"done:{state.value}")

    def restart(self, gang_id: str, attempt: int, reason: str, preempted: str | None = None) -> None:
        """The whole gang waits again, as attempt ``attempt``, in its first arrival's place in line.

        ``preempted``: the attempt before was preempted (``"preempted by <id> (<reason>)"``), which uses up
        none of its restarts (``preemptions`` counts them)."""
        key = keys.gang(gang_id)
        arrival = float(self.r.hget(key, "arrival") or 0)
        priority = self.spec(gang_id).priority
        pipe = self.r.pipeline()
        pipe.hset(key, mapping={"state": GangState.WAITING.value, "attempt": attempt, "reason": reason})
        pipe.hdel(key, "placement", "waiting_since", "started", "preempting")
        if preempted is not None:
            pipe.hincrby(key, "preemptions", 1)
            pipe.hset(key, "preempted", preempted)
        pipe.zadd(keys.GANGS_WAITING, {gang_id: line_score(priority, arrival)})
        pipe.publish(keys.gang_events(gang_id), f"waiting:{attempt}")
        pipe.execute()

    def set_started(self, gang_id: str, at: float) -> None:
        """When the running attempt was placed (Redis's clock): preemption spares the youngest last."""
        self.r.hset(keys.gang(gang_id), "started", at)

    def preempt(self, gang_id: str, attempt: int, by: str, reason: str, grace: float, ran: float = 0.0) -> bool:
        """Ask every node of the running ``attempt`` to stop its ranks (SIGTERM, SIGKILL after ``grace`` s)
        for gang ``by``; the attempt then ends as preempted and the gang waits again (``restart``).
        False when that attempt no longer runs, or is already being stopped."""
        key = keys.gang(gang_id)
        with self.r.pipeline() as pipe:
            try:
                pipe.watch(key)
                state, current, already = pipe.hmget(key, "state", "attempt", "preempting")
                if state != GangState.RUNNING.value.encode() or int(current or -1) != attempt or already:
                    return False
                pipe.multi()
                pipe.hset(key, "preempting", json.dumps({"attempt": attempt, "by": by, "reason": reason,
                                                        "grace": grace, "ran": ran}))
                pipe.publish(keys.gang_events(gang_id), f"preempt:{attempt}:{grace}")
                pipe.execute()
                return True
            except redis.WatchError:  # it ended or changed meanwhile: the next pass looks again
                return False

    def place_in_line(self, gang_id: str) -> int | None:
        """The gang's place among those waiting for slots (1: the next to be placed), or None."""
        rank = self.r.zrank(keys.GANGS_WAITING, gang_id)
        return None if rank is None else rank + 1

    def waiting(self) -> list[str]:
        """Gangs waiting for slots, in order of arrival."""
        return [g.decode() for g in self.r.zrange(keys.GANGS_WAITING, 0, -1)]

    def add_attempt(self, gang_id: str, summary: dict) -> None:
        """Keep an ended attempt's summary (``gang/attempts.py``), as long as the gang's record."""
        key = keys.gang_attempts(gang_id)
        pipe = self.r.pipeline()
        pipe.rpush(key, json.dumps(summary))
        pipe.expire(key, KEEP_SECONDS)
        pipe.execute()

    def attempts(self, gang_id: str) -> list[dict]:
        return [json.loads(x) for x in self.r.lrange(keys.gang_attempts(gang_id), 0, -1)]

    def announce(self, gang_id: str, event: str) -> None:
        self.r.publish(keys.gang_events(gang_id), event)

    def active(self) -> list[dict]:
        return [self.record(g.decode()) for g in self.r.zrange(keys.GANGS, 0, -1)]

    def payload(self, gang_id: str) -> bytes:
        data = self.r.get(keys.gang_payload(gang_id))
        if data is None:
            raise KeyError(f"gang {gang_id} has no payload in Redis")
        return data

    def set_pulled(self, gang_id: str, record: dict) -> None:
        """What node 0's ranks wrote in their working directory: ``archive`` (signed bytes) or ``error``."""
        self._replace_hash(keys.gang_pulled(gang_id), record, PULLED_KEEP_SECONDS)

    def take_pulled(self, gang_id: str) -> dict[str, bytes] | None:
        """The pulled record, read once (the client writes it into its directory)."""
        pipe = self.r.pipeline()
        pipe.hgetall(keys.gang_pulled(gang_id))
        pipe.delete(keys.gang_pulled(gang_id))
        raw = pipe.execute()[0]
        return {k.decode(): v for k, v in raw.items()} or None

    def set_restart_files(self, gang_id: str, record: dict) -> None:
        """Node 0's files at the end of a failed attempt, for the next one: ``archive`` (signed) or ``error``."""
        self._replace_hash(keys.gang_restart_files(gang_id), record, KEEP_SECONDS)

    def _replace_hash(self, key: str, record: dict, ttl: int) -> None:
        """``key`` holds ``record`` alone, for ``ttl`` seconds, in one round trip."""
        pipe = self.r.pipeline()
        pipe.delete(key)
        pipe.hset(key, mapping=record)
        pipe.expire(key, ttl)
        pipe.execute()

    def restart_files(self, gang_id: str, with_archive: bool = True) -> dict[str, bytes] | None:
        """What ``set_restart_files`` stored (without ``archive`` unless asked), or None."""
        key = keys.gang_restart_files(gang_id)
        if with_archive:
            raw = self.r.hgetall(key)
        else:
            fields = ("attempt", "worker", "files", "bytes", "error")
            raw = {f.encode(): v for f, v in zip(fields, self.r.hmget(key, fields)) if v is not None}
        return {k.decode(): v for k, v in raw.items()} or None

    # -- the slot ledger --------------------------------------------------------------------------
    def held(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.r.hgetall(keys.SLOTS_HELD).items()}

    def reserve(self, gang_id: str, attempt: int, placement: GangPlacement, procs: int, user: str | None = None,
                gpus: int = 0) -> tuple[str, str, int]:
        """All or nothing, in one Lua script.

        On success the gang's record says running, with the placement, and it leaves the
        waiting line. Returns ("ok", "", 0), ("already", "", 0) if another coordinator
        reserved this attempt first, ("gone", "", 0) if the gang no longer waits (cancelled,
        timed out), ("full", worker that lacked room, its free slots), or ("quota", why, 0) while ``user``'s
        fair-share quota holds it back (``gpus``: per process; docs/FAIRSHARE.md).
        """
        waits = self.waits if durability.worker_waits(self.waits, self.r) else durability.NONE
        out, acked = durability.call_script(
            self.r, self._reserve, [keys.SLOTS_HELD, keys.WORKERS_INFO, keys.gang(gang_id), keys.GANGS_WAITING,
                                    *keys.FAIR_KEYS],
            [procs, attempt, placement.model_dump_json(), placement.reason, gang_id, user or "", gpus, time.time(),
             *placement.workers], waits)
        if waits:  # a miss is logged; the coordinator goes on (after a failover the ledger is reconciled)
            durability.worker_confirm(acked, waits, f"the reservation of gang {gang_id}", self.r)
        if int(out[0]) == 1:
            return "ok", "", 0
        if int(out[0]) == 2:
            return "already", "", 0
        if int(out[0]) == 3:
            return "gone", "", 0
        if int(out[0]) == 4:
            return "quota", out[1].decode(), 0
        return "full", out[1].decode(), int(out[2])

    def release(self, gang_id: str, attempt: int, worker_id: str, procs: int) -> bool:
        """Give one worker's slots back for this attempt, and its user's hold (charged); idempotent."""
        released = bool(self._release(keys=[keys.SLOTS_HELD, keys.gang_attempt(gang_id, attempt, "released")],
                                      args=[worker_id, procs]))
        pipe = self.r.pipeline(transaction=False)
        fair.release(pipe, [fair.gang_hold(gang_id, attempt, worker_id)], charge=True)
        pipe.execute()
        return released

    def forget_worker(self, worker_id: str) -> None:
        """A worker (re)starting holds nothing yet: drop stale holds and orders from a previous life."""
        pipe = self.r.pipeline()
        pipe.hdel(keys.SLOTS_HELD, worker_id)
        pipe.delete(keys.agent_orders(worker_id))
        fair.release(pipe, fair.gang_holds_of(self.r, worker_id), charge=True)
        pipe.execute()

    # -- orders and what comes back ---------------------------------------------------------------
    def send_orders(self, spec: GangSpec, attempt: int, placement: GangPlacement, broker_url: str) -> None:
        pipe = self.r.pipeline()
        for node, worker_id in enumerate(placement.workers):
            order = {"gang_id": spec.gang_id, "attempt": attempt, "node_rank": node, "spec": spec.model_dump(),
                     "workers": list(placement.workers), "addresses": list(placement.addresses),
                     "broker_url": broker_url}
            pipe.lpush(keys.agent_orders(worker_id), json.dumps(order))
        pipe.execute()

    def set_master(self, gang_id: str, attempt: int, addr: str, port: int, agent_store: bool = False) -> None:
        """Where the attempt's TCP store listens; ``agent_store``: node 0's worker hosts it (else rank 0)."""
        value = f"{addr}:{port}" + (" agent" if agent_store else "")
        self.r.set(keys.gang_attempt(gang_id, attempt, "master"), value, ex=KEEP_SECONDS)

    def master(self, gang_id: str, attempt: int) -> tuple[str, int] | None:
        """``(addr, port)`` of the attempt's TCP store, once node 0 has written it."""
        found = self.store_address(gang_id, attempt)
        return None if found is None else found[:2]

    def store_address(self, gang_id: str, attempt: int) -> tuple[str, int, bool] | None:
        """``(addr, port, agent_store)``: :meth:`master`, and whether node 0's worker hosts the store."""
        raw = self.r.get(keys.gang_attempt(gang_id, attempt, "master"))
        if raw is None:
            return None
        where, _, host = raw.decode().partition(" ")
        addr, _, port = where.rpartition(":")
        return addr, int(port), host == "agent"

    def push_failure(self, gang_id: str, attempt: int, report: dict) -> None:
        key = keys.gang_attempt(gang_id, attempt, "failures")
        pipe = self.r.pipeline()
        pipe.rpush(key, json.dumps(report))
        pipe.expire(key, KEEP_SECONDS)
        pipe.publish(keys.gang_events(gang_id), f"fail:{attempt}")
        pipe.execute()

    def failures(self, gang_id: str, attempt: int) -> list[dict]:
        return [json.loads(x) for x in self.r.lrange(keys.gang_attempt(gang_id, attempt, "failures"), 0, -1)]

    def cancel(self, gang_id: str) -> None:
        self.finish(gang_id, GangState.CANCELLED, "cancelled by the client")
        self.r.publish(keys.gang_events(gang_id), "cancel")

    def set_result(self, gang_id: str, attempt: int, rank: int, blob: bytes) -> None:
        key = keys.gang_attempt(gang_id, attempt, "results")
        pipe = self.r.pipeline()
        pipe.hset(key, str(rank), blob)
        pipe.expire(key, KEEP_SECONDS)
        pipe.execute()

    def results(self, gang_id: str, attempt: int) -> dict[int, bytes]:
        return {int(k): v for k, v in self.r.hgetall(keys.gang_attempt(gang_id, attempt, "results")).items()}

    def node_report(self, gang_id: str, attempt: int, node: int, report: dict) -> int:
        """Record that a node's ranks stopped; returns how many nodes of the attempt have reported."""
        key = keys.gang_attempt(gang_id, attempt, "nodes")
        pipe = self.r.pipeline()
        pipe.hset(key, str(node), json.dumps(report))
        pipe.expire(key, KEEP_SECONDS)
        pipe.hlen(key)
        return int(pipe.execute()[-1])

    def claim_conclusion(self, gang_id: str, attempt: int) -> bool:
        """True for exactly one caller per attempt: the one that ends it (succeeded, failed or restarted)."""
        return bool(self.r.set(keys.gang_attempt(gang_id, attempt, "concluded"), 1, nx=True, ex=KEEP_SECONDS))

    def result_count(self, gang_id: str, attempt: int) -> int:
        return int(self.r.hlen(keys.gang_attempt(gang_id, attempt, "results")))

    def nodes(self, gang_id: str, attempt: int) -> dict[int, dict]:
        return {int(k): json.loads(v) for k, v in self.r.hgetall(keys.gang_attempt(gang_id, attempt, "nodes")).items()}
