"""What a failed gang attempt says: the rank that failed first, from the attempt's failure reports.

Pure: the cluster writes the message into the gang's record when it ends (or
restarts) the attempt, and the client raises the same ``GangFailed``.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import GangFailed


def first_failure(reports: Sequence[dict]) -> dict:
    """The report of the rank that failed first, among reports from one or several machines.

    Genuine failures beat collateral ones (a rank that lost its peer). Reports
    from one host compare on that host's shared clock; across hosts, on wall
    clocks. Reports without a time (an agent's) keep their order of arrival.
    """
    if not reports:
        raise ValueError("no failure reports")
    pool = [r for r in reports if not r.get("collateral")] or list(reports)
    hosts = {r.get("host") for r in pool}
    if len(hosts) == 1 and all(r.get("failed_at_boot") for r in pool):
        return min(pool, key=lambda r: r["failed_at_boot"])
    order = {id(r): i for i, r in enumerate(pool)}
    return min(pool, key=lambda r: (r.get("failed_at") or r.get("at") or float("inf"), order[id(r)]))


def gang_failure(gang_id: str, reports: list[dict]) -> GangFailed:
    """The error for an attempt with failure ``reports`` (in the order Redis received them; at least one)."""
    # The earliest failure that is not a rank losing its connection to the rank that really failed.
    first = first_failure(reports)
    rank = first["rank"]
    mine = [r for r in reports if r.get("rank") == rank]
    exc = next((r for r in mine if r["kind"] == "exception"), None)
    exit_code = next((r["exit_code"] for r in mine if r.get("exit_code") is not None), None)
    tail = max((r.get("stderr_tail") or "" for r in mine), key=len)
    where = f"{first.get('worker')} ({first.get('address') or first.get('host')})"
    if exc:
        what = f"{exc['type']}: {exc['message']}"
        type_name = exc["type"]
    elif first["kind"] == "worker_lost":
        what, type_name = first["message"], "WorkerLost"
    elif first["kind"] == "record_lost":  # gang/reconcile.py: its record went with the old primary of the broker
        what, type_name = first["message"], "BrokerFailedOver"
    else:
        what = first.get("message") or "the process died"
        type_name = "RankExited"
    code = f", exit code {exit_code}" if exit_code is not None else ""
    message = f"rank {rank} on {where} failed{code}: {what}"
    detail = (exc or {}).get("traceback") or ""
    if tail:
        detail += f"\n--- last lines of rank {rank}'s stderr ---\n{tail}"
    err = GangFailed(type_name, message, detail or None, job_id=gang_id, worker=first.get("worker"))
    err.rank, err.exit_code = rank, exit_code
    err.exc_report = exc  # the rank's exception (its class and pack): the client types the error as it (remote_errors)
    return err
