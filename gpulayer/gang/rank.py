"""One rank of a distributed job: ``python -m gpulayer.gang.rank <gang id> <attempt>``.

Started by a worker's gang agent (directly, or under torchrun) with torchrun's
environment already set. It loads the signed function, runs it, and stores the
return value under its rank; a failure is recorded for the rank runner
(``ranks.report_failure``), which reports it through its agent.
"""

from __future__ import annotations

import base64
import os
import sys
import traceback

# At the top, not in main(): the warm template imports this module (``procs/warm.py``), so a forked
# rank finds Celery, the app and the store already imported (0.6-0.9 s of a fresh import on 2 cores).
from gpulayer import app as app_mod
from gpulayer import signing
from gpulayer.config import load_settings
from gpulayer.payload import resolve_function
from gpulayer.procs.runner import fast_exit, report_failure
from gpulayer.store.connection import connect_redis
from gpulayer.store.gangs import GangStore
from gpulayer.workspace import cache as code_cache
from gpulayer.workspace.shipping import CODE_ENV


def main(argv: list[str]) -> int:
    gang_id, attempt = argv[0], int(argv[1])
    rank = int(os.environ["RANK"])
    # The rank can use gpulayer itself (submit jobs, read the registry) like any client.
    app_mod.configure(load_settings(broker_url=os.environ["GPULAYER_BROKER_URL"],
                                    secret=os.environ["GPULAYER_SECRET"]))
    client = connect_redis(os.environ["GPULAYER_BROKER_URL"], socket_connect_timeout=5)
    store = GangStore(client)
    # A rank that returns leaves its process group to the exit (fast_exit: os._exit closes its connections):
    # destroying it first cost 30-60 ms per rank on the way to the result. A failing rank still destroys it.
    # It waits for its peers first (_leave_together): gloo's init returns on one side of a pair before the
    # other side has finished its handshake, and a rank that exited at once failed that peer's init.
    code = os.environ.get(CODE_ENV) or None
    owner = None  # the user who signed the payload: its ranks' results are sealed to it (signing.py GL4)
    try:
        try:
            code_cache.enter(code, lambda: client)  # the user's modules first on sys.path (workspace/cache.py)
            fn_ref, args, kwargs = signing.loads(store.payload(gang_id))
            owner = signing.last_signer()
            fn = resolve_function(fn_ref)
            result = fn(*args, **kwargs)
        except ModuleNotFoundError as err:
            if code_cache.explained(err):
                raise
            worker = os.environ.get("GPULAYER_WORKER_ID")
            raise code_cache.explain(err, code, worker).with_traceback(err.__traceback__) from None
    except SystemExit as exit_:  # sys.exit(n) in the rank: exit with n, like the script would
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if code == 0:
            with signing.sealed_to(owner):
                store.set_result(gang_id, attempt, rank, signing.dumps(None))
            _leave_together()
            return 0
        report_failure(exit_code=code, message=f"sys.exit({exit_.code!r})")
        _destroy_process_group()
        return code
    except BaseException as exc:  # record (with the time), then exit non-zero: the runner stops the others
        tb = traceback.format_exc()
        report_failure(exc, tb=tb, extra=_exception_class(exc))
        sys.stderr.write(tb)
        sys.stderr.flush()
        _destroy_process_group()
        return 1
    with signing.sealed_to(owner):
        store.set_result(gang_id, attempt, rank, signing.dumps(result))
    _leave_together()
    return 0


def _exception_class(exc: BaseException) -> dict:
    """The report's fields that let the client raise a ``GangFailed`` that is also ``type(exc)``
    (gpulayer/remote_errors.py), the exception's pack only while it is small."""
    try:
        from gpulayer.remote_errors import pack

        packed = pack(exc)
        out = {"exc_module": packed["module"], "exc_qualname": packed["qualname"]}
        if packed.get("pickle") and len(packed["pickle"]) <= _RANK_PACK_MAX:
            out["exc_pack"] = base64.b64encode(packed["pickle"]).decode()
        return out
    except Exception:
        return {}


_RANK_PACK_MAX = 16 * 1024  # bytes of a rank's pickled exception sent in its failure report


def _leave_together() -> None:
    """A rank whose function returned with its process group still up waits until every rank got there.

    gloo's ``init_process_group`` can return on one rank of a pair while its peer is still finishing the
    handshake; had the first rank exited at once, the peer's init failed with "Connection closed by peer"
    (1 in 12 two-rank gangs on a loaded 2-core machine, 2026-12-03). The result is already stored: an
    error here (a peer that failed and closed its side) changes nothing, and a failed peer makes the
    runner stop this rank anyway.
    """
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
    except Exception:
        pass


def _destroy_process_group() -> None:
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


if __name__ == "__main__":
    fast_exit(main(sys.argv[1:]))
