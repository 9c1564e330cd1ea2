"""One rank of a distributed job: ``python -m gpulayer.gang.rank <gang id> <attempt>``.

Started by a worker's gang agent (directly, or under torchrun) with torchrun's
environment already set. It loads the signed function, runs it, and stores the
return value, or the exception with its traceback, under its rank.
"""

from __future__ import annotations

import os
import sys
import time
import traceback


def main(argv: list[str]) -> int:
    gang_id, attempt = argv[0], int(argv[1])
    rank = int(os.environ["RANK"])
    from .. import app as app_mod
    from .. import signing
    from ..config import load_settings
    from ..payload import resolve_function
    from ..store.connection import connect_redis
    from ..store.gangs import GangStore

    # The rank can use gpulayer itself (submit jobs, read the registry) like any client.
    app_mod.configure(load_settings(broker_url=os.environ["GPULAYER_BROKER_URL"],
                                    secret=os.environ["GPULAYER_SECRET"]))
    client = connect_redis(os.environ["GPULAYER_BROKER_URL"], socket_connect_timeout=5)
    store = GangStore(client)
    try:
        fn_ref, args, kwargs = signing.loads(store.payload(gang_id))
        fn = resolve_function(fn_ref)
        result = fn(*args, **kwargs)
    except SystemExit as exit_:  # sys.exit(n) in the rank: exit with n, like the script would
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if code == 0:
            store.set_result(gang_id, attempt, rank, signing.dumps(None))
            return 0
        store.push_failure(gang_id, attempt, {
            "rank": rank, "worker": os.environ.get("GPULAYER_WORKER_ID"), "address": os.environ.get("GPULAYER_WORKER_ADDR"),
            "kind": "exit", "exit_code": code, "message": f"sys.exit({exit_.code!r})", "at": time.time()})
        return code
    except BaseException as exc:  # report, then exit non-zero: the agent stops the other ranks
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        sys.stderr.flush()
        collateral = _peer_lost(exc)
        if collateral:
            # Most likely a peer died first and this rank only lost its connection: give the
            # peer's own report a head start (we are usually stopped before ours is sent).
            time.sleep(0.3)
        store.push_failure(gang_id, attempt, {"collateral": collateral,
            "rank": rank, "worker": os.environ.get("GPULAYER_WORKER_ID"), "address": os.environ.get("GPULAYER_WORKER_ADDR"),
            "kind": "exception", "type": type(exc).__name__, "message": str(exc), "traceback": tb, "at": time.time()})
        return 1
    finally:
        _destroy_process_group()
    store.set_result(gang_id, attempt, rank, signing.dumps(result))
    return 0


def _peer_lost(exc: BaseException) -> bool:
    """Does ``exc`` look like a lost connection to another rank (gloo/NCCL), not a failure of this rank?"""
    text = f"{type(exc).__name__}: {exc}"
    return type(exc).__name__ in ("DistBackendError", "DistNetworkError") or any(
        s in text for s in ("Connection closed by peer", "Connection reset by peer", "gloo/transport",
                            "NCCL communicator was aborted", "Broken pipe"))


def _destroy_process_group() -> None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
