"""`gpulayer flower` as a user runs it: behind a login of its own, printed by the command (as `gpulayer up --flower`
prints its own), which its API answers; anyone without it is refused."""

from __future__ import annotations

import base64
import json
import os
import re
import select
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from gpulayer.local import stop_process, wait_for_port
from gpulayer.local.workers import flower_line
from gpulayer.procs.env import free_port


def api(url: str, login: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": "Basic " + base64.b64encode(login.encode()).decode()} if login else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def read_line(proc: subprocess.Popen, prefix: str, timeout: float = 120) -> str:
    """The first line of ``proc``'s output that starts with ``prefix``."""
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            seen += line
            if line.startswith(prefix):
                return line.rstrip("\n")
        elif proc.poll() is not None:
            break
    raise AssertionError(f"no line starting with {prefix!r} within {timeout} s; the command said:\n{seen}")


def test_gpulayer_flower_prints_a_login_its_api_answers_and_refuses_anyone_else(fleet, tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "FLOWER_BASIC_AUTH"}  # nothing chosen: the command makes one
    env.update(GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret)
    log = open(tmp_path / "flower.err", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gpulayer", "flower", "--port", str(port), "--show-secrets"],
                            env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    log.close()
    try:
        line = read_line(proc, "Flower: ")
        m = re.fullmatch(rf"Flower: http://([^:@/]+):([^@/]+)@127\.0\.0\.1:{port}/", line)
        assert m, line
        login = f"{m.group(1)}:{m.group(2)}"
        assert len(m.group(2)) >= 20  # made up, not guessable
        assert wait_for_port(port, proc), (tmp_path / "flower.err").read_text()
        url = f"http://127.0.0.1:{port}/"

        status, body = api(url + "api/workers", login)
        assert status == 200, body
        assert isinstance(json.loads(body), dict)
        for page in ("api/workers", "api/tasks", "workers", "gangs"):
            assert api(url + page)[0] == 401, page  # no login
            assert api(url + page, f"{m.group(1)}:not-the-password")[0] == 401, page
        # The refusal is the login's, not the API's own lock (FLOWER_UNAUTHENTICATED_API), which refused everyone.
        assert "FLOWER_UNAUTHENTICATED_API" not in api(url + "api/workers")[1]
        assert m.group(2) not in api(url + "workers", login)[1]  # its pages never show the password
    finally:
        stop_process(proc, grace=5)
        proc.stdout.close()


@pytest.mark.parametrize("show", [False, True])
def test_the_flower_line_masks_the_password_unless_asked(show):
    line = flower_line("http://127.0.0.1:5555/", "alice:s3cr3t-pw", show)
    if show:
        assert line == "Flower: http://alice:s3cr3t-pw@127.0.0.1:5555/"
    else:
        assert line == ("Flower: http://alice:***@127.0.0.1:5555/ (its login; --show-secrets prints the password)")
