"""The gang coordinator: a short task that places a gang, reserves its slots and hands out its ranks.

One attempt per call, milliseconds long: it never holds a worker slot while
the gang waits or runs. The client calls it again while the gang waits. When
every slot of the fleet is held (so no worker takes the task), the client runs
the same task body itself (``coordinate.apply``); the reservation script makes a
second coordinator for the same attempt a no-op.
"""

from __future__ import annotations

from .. import app as app_mod
from ..errors import JobRejected
from ..models import GangState
from ..placement import GangWaiting, place_gang
from ..store.gangs import GangStore

COORDINATE = "gpulayer.gang.coordinate"


@app_mod.app.task(name=COORDINATE, bind=True)
def coordinate(self, gang_id: str, attempt: int) -> dict:
    client = app_mod.redis_client()
    try:
        store = GangStore(client)
        spec = store.spec(gang_id)
        state = store.state(gang_id)
        if state != GangState.WAITING:
            return {"state": state.value}
        workers = app_mod.registry().snapshot()
        try:
            placement = place_gang(spec, workers, store.held())
        except GangWaiting as waiting:
            store.set_waiting(gang_id, str(waiting))
            return {"state": "waiting", "reason": str(waiting)}
        except JobRejected as rejected:
            store.finish(gang_id, GangState.FAILED, str(rejected))
            return {"state": "failed", "reason": str(rejected)}
        outcome, short, free = store.reserve(gang_id, attempt, placement, spec.procs_per_node)
        if outcome == "already":
            return {"state": store.state(gang_id).value}
        if outcome == "full":
            reason = f"waiting: {short} has {max(free, 0)} free slots now (taken since the snapshot); retrying"
            store.set_waiting(gang_id, reason)
            return {"state": "waiting", "reason": reason}
        store.set_running(gang_id, attempt, placement)
        store.send_orders(spec, attempt, placement, app_mod.settings().broker_url)
        return {"state": "running", "placement": placement.model_dump()}
    finally:
        client.close()
