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
