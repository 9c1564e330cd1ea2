"""`gpulayer status` shows every queue holding messages, including ones no live worker reads (issue 13, item 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

from gpulayer import status


def test_status_lists_queues_nobody_reads(fleet):
    client = fleet.client()
    stray = f"orphans.{uuid.uuid4().hex[:8]}"  # e.g. the queue an old client sent to
    zone_q = f"gl.q.cpu.z.gone-{uuid.uuid4().hex[:6]}"  # a zone whose workers all left, a priority-6 message
    client.lpush(stray, "m1", "m2")
    client.lpush(zone_q + "\x06\x166", "m3")
    try:
        report = status.collect()
        assert report["queues"][stray] == 2 and report["queues"][zone_q] == 1
        assert {stray, zone_q} <= set(report["unread_queues"])
        assert "gl.q.cpu" in report["queues"] and "gl.q.cpu" not in report["unread_queues"]
        assert not [q for q in report["queues"] if q.startswith(("gl:", "celery-task", "_kombu"))]
        env = {**os.environ, "GPULAYER_BROKER_URL": fleet.url, "GPULAYER_SECRET": fleet.secret, "COLUMNS": "200"}
        shown = subprocess.run([sys.executable, "-m", "gpulayer", "status"], env=env, capture_output=True, text=True,
                               timeout=60)
        assert shown.returncode == 0, shown.stderr
        line = next(ln for ln in shown.stdout.splitlines() if stray in ln)
        assert "2" in line and "nobody reads this queue" in line, shown.stdout
        gpu_line = next(ln for ln in shown.stdout.splitlines() if " gl.q.cpu " in f" {ln} ")
        assert "nobody reads" not in gpu_line
        as_json = subprocess.run([sys.executable, "-m", "gpulayer", "status", "--json"], env=env, capture_output=True,
                                 text=True, timeout=60)
        assert zone_q in json.loads(as_json.stdout)["unread_queues"]
    finally:
        client.delete(stray, zone_q + "\x06\x166")
        client.close()


# --- a big fleet: a summary by zone and region (issue 14, item 6) ---------------------------------

def _env(f) -> dict:
    return {**os.environ, "GPULAYER_BROKER_URL": f.url, "GPULAYER_SECRET": f.secret, "COLUMNS": "200"}


def test_status_of_a_big_fleet_is_a_summary_and_all_lists_every_worker(fresh_fleet, tmp_path):
    from gpulayer.lab.emulator import EmulatedFleet
    from gpulayer.models import WorkerInfo
    from gpulayer.store import keys
    from gpulayer.store.registry import Registry

    n = status.SUMMARY_ABOVE + 10
    client = fresh_fleet.client()
    emu = EmulatedFleet(fresh_fleet.url, fresh_fleet.secret, workers=n, processes=1, zones=3, regions=3,
                        log_dir=tmp_path / "emu")
    try:
        with emu:
            emu.wait_registered(timeout=120)
            # A worker that went silent and nobody buried yet (this fleet runs no janitor).
            Registry(client).heartbeat(WorkerInfo(id="gone-1", hostname="h", address="127.0.0.1", zone="emu-zone-00"))
            secs, _ = client.time()
            client.zadd(keys.WORKERS, {"gone-1": secs - 60})
            client.lpush("gl.q.w.left-long-ago", "m1")  # a job pinned to a worker that is gone

            shown = subprocess.run([sys.executable, "-m", "gpulayer", "status"], env=_env(fresh_fleet),
                                   capture_output=True, text=True, timeout=120)
            assert shown.returncode == 0, shown.stderr
            out = shown.stdout
            assert f"{n} live workers by region" in out and f"{n} live workers by zone" in out, out
            zone_line = next(ln for ln in out.splitlines() if "emu-zone-01" in ln and "emu-region-1" in ln)
            assert " 20 " in zone_line and "/160" in zone_line, zone_line  # 20 workers x 8 slots
            assert f"{status.TOP} busiest workers" in out
            assert "1 dead workers" in out and "gone-1" in out
            line = next(ln for ln in out.splitlines() if "gl.q.w.left-long-ago" in ln)
            assert "nobody reads this queue" in line and "empty queues" in out
            assert "emu-00042" not in out  # not every worker

            every = subprocess.run([sys.executable, "-m", "gpulayer", "status", "--all"], env=_env(fresh_fleet),
                                   capture_output=True, text=True, timeout=120)
            assert every.returncode == 0, every.stderr
            assert f"{n} live workers" in every.stdout and "by zone" not in every.stdout
            assert all(f"emu-{i:05d}" in every.stdout for i in range(n))

            as_json = subprocess.run([sys.executable, "-m", "gpulayer", "status", "--json"], env=_env(fresh_fleet),
                                     capture_output=True, text=True, timeout=120)
            report = json.loads(as_json.stdout)
            assert len(report["workers"]) == n  # machine readers get every worker, and the summary
            summary = report["summary"]
            assert summary["workers"] == n and summary["slots"] == 8 * n
            assert sum(z["workers"] for z in summary["zones"]) == n == sum(r["workers"] for r in summary["regions"])
            assert [d["id"] for d in summary["dead"]] == ["gone-1"] and summary["dead"][0]["heartbeat_age"] >= 59
            assert len(summary["busiest"]) == status.TOP
    finally:
        client.close()


def test_summary_counts_busy_and_gang_held_slots_by_zone_and_region():
    from gpulayer.models import WorkerInfo

    ws = [WorkerInfo(id=f"w{i}", hostname="h", address="a", zone=f"z{i % 2}", region="r", slots=4, busy=i % 3,
                     gpus=2 if i == 0 else 0) for i in range(6)]
    held = {"w1": 3}
    busiest = [ws[1], ws[2]]
    s = status.summarize(ws, held, {"gone": 12.5}, busiest)
    assert (s["workers"], s["slots"], s["busy"], s["held"], s["gpus"]) == (6, 24, 6, 3, 2)
    assert s["regions"] == [{"region": "r", "workers": 6, "slots": 24, "busy": 6, "held": 3, "gpus": 2}]
    z1 = next(z for z in s["zones"] if z["zone"] == "z1")
    assert (z1["workers"], z1["busy"], z1["held"]) == (3, 1 + 0 + 2, 3)
    assert s["busiest"] == ["w1", "w2"] and s["dead"] == [{"id": "gone", "heartbeat_age": 12.5}]


# --- 80 columns, and a reader that leaves (issue 31) ---------------------------------------------------

def test_status_fits_80_columns_without_cutting_a_name(fleet):
    env = {**os.environ, "GPULAYER_BROKER_URL": fleet.url, "GPULAYER_SECRET": fleet.secret, "COLUMNS": "80"}
    shown = subprocess.run([sys.executable, "-m", "gpulayer", "status"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("worker "))
    assert lines[head].split() == ["worker", "address", "zone", "region", "cuda", "used/slots", "heartbeat"]
    workers = lines[head + 1:]
    for name, zone in (("w-a", "europe-west1-b"), ("w-b", "europe-west1-c")):
        row = next(line for line in workers if line.startswith(name + " "))
        assert f"  {zone}  europe-west1  " in row, row
    assert "…" not in shown.stdout
    worker_rows = workers[:workers.index("")]
    assert all(len(line) <= 80 for line in worker_rows), worker_rows
    queues = lines[lines.index("queues") + 1]
    start = lines.index("queues") + 2
    rows = lines[start:lines.index("", start)] if "" in lines[start:] else lines[start:]
    noted = any(len(row.split()) > 2 for row in rows)  # a queue's note (the shared fleet may have one)
    # no empty column: a note column only for a note
    assert queues.split() == ["queue", "waiting"] + (["note"] if noted else []), queues


def test_every_command_stops_quietly_when_its_reader_leaves(fleet):
    """`gpulayer status --json | head -1`: the reader is gone before the output is written."""
    env = {**os.environ, "GPULAYER_BROKER_URL": fleet.url, "GPULAYER_SECRET": fleet.secret}
    for args in (["status", "--json"], ["status"], ["--help"]):
        read, write = os.pipe()
        os.close(read)  # as `| head -1` once it has its line
        try:
            proc = subprocess.run([sys.executable, "-m", "gpulayer", *args], env=env, stdout=write,
                                  stderr=subprocess.PIPE, text=True, timeout=60)
        finally:
            os.close(write)
        assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, (args, proc.stderr)
        assert proc.stderr == "", (args, proc.stderr)
