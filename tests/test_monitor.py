"""Monitoring: Flower (seen in a real browser), `gpulayer status --watch`, progress bars, Prometheus metrics."""

from __future__ import annotations

import base64
import fcntl
import importlib
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

import gpulayer
from gpulayer import queues, submit
from gpulayer.errors import ConfigError
from gpulayer.procs.env import free_port
from gpulayer.local import stop_process, wait_for_port
from gpulayer.monitor import mask_text, run_flower
from gpulayer.lab.fleet import wait_until
from tests.fleets import need

from .browser import Chromium, chromium_executable, done_task_row

REPO = Path(__file__).resolve().parents[1]
AUTH = "ops:flower-login-pw"


def square(x):
    return x * x


def client_env(fleet, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR", "COLUMNS")}
    env.update(GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret, **extra)
    return env


def get(url: str, auth: str | None = None, timeout: float = 30) -> str:
    headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
        return r.read().decode()


def run_in_pty(args, env, *, timeout=120, until=None, interrupt=False) -> tuple[int, str]:
    """Run ``args`` with stdin/stdout/stderr on a pseudo-terminal; SIGINT it once ``until(output)`` holds."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    # Ctrl-C as in a terminal: a shell's background job (`cmd &` without job control) starts with SIGINT
    # ignored, every child inherits that, and Python then never raises KeyboardInterrupt.
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=dict(env, TERM="xterm-256color"),
                            cwd=REPO, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(slave)
    buf, sent = b"", False
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    data = b""
                if not data and proc.poll() is not None:
                    break
                buf += data
            elif proc.poll() is not None:
                break
            if until is not None and not sent and until(buf.decode(errors="replace")):
                if interrupt:
                    proc.send_signal(signal.SIGINT)
                sent = True
            assert time.monotonic() < deadline, f"{args} still running after {timeout}s:\n{buf.decode()[-2000:]}"
        return proc.wait(30), buf.decode(errors="replace")
    finally:
        stop_process(proc, grace=5)
        os.close(master)


# --- Flower ----------------------------------------------------------------------------------------

def wait_gone(pids, timeout=30):
    deadline = time.monotonic() + timeout
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, f"still running: {pids}"
        time.sleep(0.1)


def output_dir() -> Path:
    out = REPO / "test-output"
    out.mkdir(exist_ok=True)
    return out


JOB_SCRIPT = textwrap.dedent("""
    import json
    import gpulayer
    from gpulayer import submit

    def square(x):
        return x * x

    gpulayer.init()
    h = submit.delay(square, 7)
    print(json.dumps({"id": h.id, "value": h.get(timeout=60)}))
""")



def test_up_flower_works_in_a_browser(gpulayer_home, tmp_path):
    """Dashboard, Tasks page and a task's page in headless Chromium: every script loads and runs (no
    console error), the dashboard refreshes itself, and the Tasks table, filled by JavaScript from
    Flower's API, lists the job's summary."""
    need(chromium_executable() is not None, "no chromium on PATH (apt-get install -y chromium)")
    env = dict(os.environ)
    up = subprocess.run([sys.executable, "-m", "gpulayer", "up", "--workers", "2", "--slots", "1", "--flower"],
                        capture_output=True, text=True, timeout=120, env=env)
    state = json.loads((gpulayer_home / "cluster.json").read_text()) if (gpulayer_home / "cluster.json").exists() else {}
    pids = []
    try:
        assert up.returncode == 0, up.stderr
        url = state["flower_url"]
        login = state["flower_auth"]  # Flower's login, printed masked by `gpulayer up`
        assert url and url.startswith("http://127.0.0.1:")
        assert f"Flower: {url.replace('://', '://' + login.split(':')[0] + ':***@')}" in up.stdout
        assert psutil.pid_exists(state["flower_pid"])
        pids = [state["supervisor_pid"], state["redis_pid"], state["flower_pid"], *state["worker_pids"].values()]

        script = tmp_path / "job.py"
        script.write_text(JOB_SCRIPT)
        job_env = dict(env, GPULAYER_BROKER_URL=state["broker_url"], GPULAYER_SECRET=state["secret"])
        out = output_dir()
        with Chromium(tmp_path / "chrome") as browser:
            browser.authorize(login)
            # The dashboard: its script fills the workers table from Flower and says when it last did.
            # Flower lists a worker there once its event receiver heard the worker's events, so it
            # will also hear the job's.
            browser.load(url)
            browser.wait_for("(document.getElementById('workers-refresh-status') || {}).textContent"
                             "?.startsWith('Updated') && ['local-1@', 'local-2@'].every(w => "
                             "document.querySelector('#workers-table tbody').innerText.includes(w))",
                             timeout=60, what="the dashboard listing local-1 and local-2, refreshed by its script")
            assert browser.evaluate("jQuery.fn.dataTable.isDataTable('#workers-table')")
            browser.screenshot(out / "flower-workers.png")
            assert not browser.errors, browser.errors

            run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                                 env=job_env)
            assert run.returncode == 0, run.stderr
            job = json.loads(run.stdout.strip().splitlines()[-1])
            assert job["value"] == 49

            # The Tasks page: an empty table in its HTML, filled by DataTables from /tasks/datatable
            # (task events reach Flower asynchronously: reload until the job's row says SUCCESS).
            row = wait_until(lambda: done_task_row(browser, url, job["id"]), 30, f"the Tasks table never listed {job['id']} as done")
            assert "square(7)" in row and "local-" in row and "cpu" in row, row  # summary, worker, resources
            assert "PickledFunction" not in row and "\\x80" not in row
            browser.screenshot(out / "flower-tasks.png")
            assert not browser.errors, browser.errors

            # The job's own page.
            browser.load(url + f"task/{job['id']}")
            text = browser.wait_for(f"document.body.innerText.includes({json.dumps(job['id'])}) && "
                                    "document.body.innerText", what="the task's page")
            assert "square(7)" in text and "SUCCESS" in text and "49" in text
            assert not browser.errors, browser.errors
        for shot in ("flower-workers.png", "flower-tasks.png"):
            assert (out / shot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / shot).stat().st_size > 10_000

        password = state["broker_url"].split(":")[2].split("@")[0]
        for page in ("", "workers", "broker", "tasks", f"task/{job['id']}"):
            body = get(url + page, login)
            assert password not in body and state["secret"] not in body, page
    finally:
        down = subprocess.run([sys.executable, "-m", "gpulayer", "down"], capture_output=True, text=True,
                              timeout=60, env=env)
    assert down.returncode == 0, down.stderr
    wait_gone(pids)


@pytest.fixture
def flower(fleet, tmp_path):
    """``gpulayer flower`` on the shared fleet, on a free port, behind basic auth."""
    port = free_port()
    log = open(tmp_path / "flower.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gpulayer", "flower", "--port", str(port)],
                            env=client_env(fleet, FLOWER_BASIC_AUTH=AUTH), stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        assert wait_for_port(port, proc), (tmp_path / "flower.log").read_text()
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop_process(proc, grace=5)


def wait_until_flower_listens(flower: str, fleet) -> None:
    """Flower's event receiver connects after its web server answers: wait until it has heard every worker's
    heartbeat events (each worker sends events once Flower has asked, enable_events), or it would miss the
    jobs' "received" events of a worker it has not heard from yet."""
    # ?status=1: the workers of Flower's event state (alive: a heartbeat event within the last few seconds),
    # not the workers inspect answered.
    def heard_all() -> bool:
        alive = {w.split("@")[0] for w, up in json.loads(get(flower + "api/workers?status=1", AUTH)).items() if up}
        return set(fleet.workers) <= alive

    wait_until(heard_all, timeout=30, what="Flower hearing from every worker")


def test_flower_serves_its_static_files_whole(fleet, flower):
    """Each file Flower ships comes back byte for byte, under a Content-Length that counts it (Tornado
    sends a file in 64 KiB chunks; a transform that rewrote the length from the first chunk cut
    jquery to 65,536 of its 89,795 bytes, and every script on every page failed)."""
    static = Path(importlib.import_module("flower").__file__).parent / "static"
    files = sorted(p for p in static.rglob("*") if p.is_file())
    assert sum(p.stat().st_size > 65536 for p in files) >= 3  # several span more than one chunk
    headers = {"Authorization": "Basic " + base64.b64encode(AUTH.encode()).decode()}
    for path in files:
        rel = path.relative_to(static).as_posix()
        with urllib.request.urlopen(urllib.request.Request(flower + "static/" + rel, headers=headers),
                                    timeout=30) as r:
            length, body = r.headers.get("Content-Length"), r.read()
        expected = path.read_bytes()
        assert (len(body), length) == (len(expected), str(len(expected))), rel
        assert body == expected, rel


def test_masking_holds_a_chunked_answer_whole_and_leaves_static_and_binary_alone():
    from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

    from gpulayer.monitor import MASK, _masking_transform

    transform = _masking_transform(["s3cr3t-value"], "/static/")

    def answer(uri: str, ctype: str, chunks: list[bytes]) -> tuple[HTTPHeaders, bytes]:
        t = transform(HTTPServerRequest(start_line=RequestStartLine("GET", uri, "HTTP/1.1"),
                                         headers=HTTPHeaders({"Host": "127.0.0.1"})))
        headers = HTTPHeaders({"Content-Type": ctype, "Content-Length": str(sum(map(len, chunks)))})
        _, headers, out = t.transform_first_chunk(200, headers, chunks[0], len(chunks) == 1)
        for i, chunk in enumerate(chunks[1:], 2):
            out += t.transform_chunk(chunk, i == len(chunks))
        return headers, out

    # One chunk (how Flower writes a page or an API answer): masked, Content-Length counts the result.
    headers, body = answer("/api/tasks", "application/json", [b'{"s": "s3cr3t-value", "u": "redis://:pw@h/0"}'])
    assert body == b'{"s": "***", "u": "redis://:***@h/0"}' and headers["Content-Length"] == str(len(body))
    # Several chunks, a secret and a URL split across them: held to the end, masked whole, sent chunked.
    headers, body = answer("/tasks", "text/html; charset=UTF-8", [b"<p>s3cr", b"3t-value redis://:p", b"w@h/0</p>"])
    assert body == f"<p>{MASK} redis://:{MASK}@h/0</p>".encode() and "Content-Length" not in headers
    # A static file keeps its bytes and its length, chunk by chunk; so does a binary answer.
    js = [b"x" * 65536, b"var s3cr3t-value;"]
    headers, body = answer("/static/js/jquery-3.6.4.min.js", "text/javascript", js)
    assert body == b"".join(js) and headers["Content-Length"] == str(len(body))
    png = [b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 300, b"s3cr3t-value"]
    headers, body = answer("/favicon.png", "image/png", png)
    assert body == b"".join(png) and headers["Content-Length"] == str(len(body))


def test_flower_shows_job_summaries_and_never_the_secrets(fleet, flower):
    wait_until_flower_listens(flower, fleet)
    hs = [submit.delay(square, i) for i in (11, 12)]
    assert [h.get(timeout=60) for h in hs] == [121, 144]
    with pytest.raises(urllib.error.HTTPError) as denied:
        get(flower + "api/workers")
    assert denied.value.code == 401

    deadline = time.monotonic() + 30
    while True:  # task events reach Flower asynchronously
        tasks = json.loads(get(flower + "api/tasks", AUTH))
        mine = {t["args"]: t for t in tasks.values() if t.get("args") in ("square(11)", "square(12)")}
        if len(mine) == 2 and all(t["state"] == "SUCCESS" for t in mine.values()):
            break
        assert time.monotonic() < deadline, tasks
        time.sleep(0.3)
    assert {t["kwargs"] for t in mine.values()} == {"cpu"}  # the resources, as kwargsrepr
    assert {t["worker"].split("@")[0] for t in mine.values()} <= {"w-a", "w-b", "w-c"}

    workers = get(flower + "api/workers?refresh=1", AUTH)
    assert {"w-a", "w-b", "w-c"} <= {name.split("@")[0] for name in json.loads(workers)}
    pages = [workers, get(flower + "workers", AUTH), get(flower + "broker", AUTH), get(flower + "tasks", AUTH)]
    for body in pages:
        assert fleet.password not in body and fleet.secret not in body
    assert "redis://:***@127.0.0.1" in pages[2]


def die_on_first_delivery(key):
    import os as _os

    if gpulayer.app.redis_client().incr(key) == 1:
        _os._exit(9)  # the job's process dies: the worker delivers the job again
    return "second delivery"


def test_flower_shows_a_rerun_jobs_lost_deliveries_as_retries(fleet, flower):
    wait_until_flower_listens(flower, fleet)
    h = submit.delay(die_on_first_delivery, f"test:die-once:{time.time()}")
    assert h.get(timeout=60) == "second delivery"
    assert h.attempts == 2
    deadline = time.monotonic() + 30
    while True:  # Flower keeps the latest task-received event's fields
        try:
            task = json.loads(get(flower + f"api/task/info/{h.id}", AUTH))
        except urllib.error.HTTPError as err:  # 404 until Flower has read the job's first event
            assert err.code == 404 and time.monotonic() < deadline, err
            time.sleep(0.3)
            continue
        if task.get("state") == "SUCCESS" and task.get("retries"):
            break
        assert time.monotonic() < deadline, task
        time.sleep(0.3)
    assert task["retries"] == 1


def test_flower_beyond_loopback_needs_a_password(monkeypatch):
    monkeypatch.delenv("FLOWER_BASIC_AUTH", raising=False)
    with pytest.raises(ConfigError, match="basic-auth"):
        run_flower(address="0.0.0.0")


def test_mask_text_hides_secrets_and_url_passwords():
    text = "Settings(broker_url='redis://:pw123@10.0.0.1:6379/0', secret='s3cr3t-value') redis://u:x@h/0"
    masked = mask_text(text, ["s3cr3t-value"])
    assert "pw123" not in masked and "s3cr3t-value" not in masked and ":x@" not in masked
    assert "redis://:***@10.0.0.1:6379/0" in masked and "redis://u:***@h/0" in masked


# --- gpulayer status --watch -------------------------------------------------------------------------

def test_status_watch_refreshes_until_ctrl_c(fleet):
    code, out = run_in_pty([sys.executable, "-m", "gpulayer", "status", "--watch", "0.3"], client_env(fleet),
                           until=lambda o: o.count("live workers") >= 2, interrupt=True, timeout=90)
    assert code == 0, out
    assert out.count("live workers") >= 2 and "w-a" in out and "europe-west1-b" in out and "Ctrl-C" in out
    assert fleet.password not in out and fleet.secret not in out


# --- progress bars ---------------------------------------------------------------------------------

BATCH_SCRIPT = textwrap.dedent("""
    import gpulayer
    from gpulayer import submit, submit_batch

    def nap(i):
        import time
        time.sleep(0.02)
        return i

    gpulayer.init()
    print("results", sum(submit_batch([submit.s(nap, i) for i in range(30)]).get(timeout=120)))
""")


def test_batch_progress_bar_on_a_terminal_and_nothing_in_a_pipe(fleet, tmp_path):
    script = tmp_path / "batch.py"
    script.write_text(BATCH_SCRIPT)
    code, tty_out = run_in_pty([sys.executable, str(script)], client_env(fleet))
    assert code == 0, tty_out
    assert "30/30 jobs" in tty_out and "━" in tty_out and "0 failed" in tty_out and "results 435" in tty_out

    piped = subprocess.run([sys.executable, str(script)], env=client_env(fleet), capture_output=True, text=True,
                           timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == "results 435\n"
    assert "jobs" not in piped.stderr and "━" not in piped.stderr


def test_train_shows_the_gangs_progress_on_a_terminal(fleet, tmp_path):
    (tmp_path / "job.py").write_text("import os\nprint('hello from rank', os.environ['RANK'])\n")
    code, out = run_in_pty([sys.executable, "-m", "gpulayer", "train", "--nodes", "2", "--procs-per-node", "1",
                            "--workdir", str(tmp_path), "job.py"], client_env(fleet), timeout=180)
    assert code == 0, out
    assert "2/2 ranks done" in out and "[rank 0] hello from rank 0" in out and "[rank 1] hello from rank 1" in out
    # The last frame: every rank returned and the gang is done (an earlier frame may show 2/2 while
    # the workers are still freeing their slots).
    assert "done" in out.rsplit("2/2 ranks done", 1)[0].rsplit("gang", 1)[-1]


# --- Prometheus metrics ----------------------------------------------------------------------------

def test_metrics_endpoint_reports_workers_slots_and_queues(fleet, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpulayer", "metrics", "--port", str(port)], env=client_env(fleet),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert wait_for_port(port, proc), proc.stdout.read().decode() if proc.poll() is not None else "no port"
        text = get(f"http://127.0.0.1:{port}/metrics")
    finally:
        stop_process(proc, grace=5)
        proc.stdout.close()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    live = {w.id: w for w in gpulayer.app.registry().snapshot()}
    assert samples["gpulayer_workers_live"][0].value == len(live)
    slots = {s.labels["worker"]: s for s in samples["gpulayer_worker_slots"]}
    assert {"w-a", "w-b", "w-c"} <= set(slots)
    assert slots["w-a"].value == 2 and slots["w-a"].labels["zone"] == "europe-west1-b"
    assert slots["w-c"].value == 1 and slots["w-c"].labels["region"] == "us-central1"
    assert {s.labels["worker"] for s in samples["gpulayer_worker_busy_slots"]} >= {"w-a", "w-b", "w-c"}
    assert {s.labels["worker"] for s in samples["gpulayer_worker_held_slots"]} >= {"w-a", "w-b", "w-c"}
    assert queues.capability() in {s.labels["queue"] for s in samples["gpulayer_queue_length"]}
    assert {s.labels["state"] for s in samples["gpulayer_gangs"]} >= {"waiting", "running"}
    assert fleet.password not in text and fleet.secret not in text
