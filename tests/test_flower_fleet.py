"""Flower as `gpulayer up --flower` starts it: the fleet and the distributed jobs in its pages (seen in
headless Chromium), jobs named by their function (Name column, API, `/metrics`), every job from the first
one, its login, and bad input to its API answered with a 4xx that says why."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpulayer.lab.fleet import wait_until
from gpulayer.local import stop_process
from tests.fleets import need

from .browser import Chromium, chromium_executable, done_task_row
from .test_monitor import wait_gone

SHOTS = Path(os.environ.get("GPULAYER_SHOTS") or Path(__file__).resolve().parents[1] / "test-output")

# Started before `gpulayer up`, imports done, it sends its job the moment `up` has returned (the go file).
FIRST_JOB = textwrap.dedent("""
    import json, os, sys, time
    import gpulayer
    from gpulayer import submit
    from gpulayer.deadline import wait_until

    def square(x):
        return x * x

    wait_until(lambda: os.path.exists(sys.argv[1]), 300, "gpulayer up", every=0.005)
    gpulayer.init()  # the cluster `gpulayer up` started (its state file)
    h = submit.delay(square, 7)
    sent = time.time()
    print(json.dumps({"id": h.id, "sent": sent, "value": h.get(timeout=60)}))
""")

TWO_FUNCTIONS = textwrap.dedent("""
    import gpulayer
    from gpulayer import submit

    def cube(x):
        return x ** 3

    gpulayer.init()
    print(submit.delay(cube, 3).get(timeout=60), submit.delay("math:factorial", 5).get(timeout=60))
""")

# Two 2 x 2 distributed jobs on 2 workers of 2 slots: the first runs (every slot), the second waits in line.
# Both end once the release file exists.
GANGS = textwrap.dedent("""
    import json, sys
    import gpulayer
    from gpulayer import distributed

    def hold(path):
        import os, time
        while not os.path.exists(path):
            time.sleep(0.1)
        return int(os.environ["RANK"])

    gpulayer.init()
    running = distributed(hold, sys.argv[1], nodes=2, procs_per_node=2)
    running.placement  # placed before the second one asks
    waiting = distributed(hold, sys.argv[1], nodes=2, procs_per_node=2)
    print(json.dumps({"running": running.id, "waiting": waiting.id}), flush=True)
    print(json.dumps([running.get(timeout=300), waiting.get(timeout=300)]), flush=True)
""")


def request(url: str, auth: str | None = None, data: bytes | None = None) -> tuple[int, str]:
    headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture(scope="module")
def up_flower(tmp_path_factory):
    """`gpulayer up --workers 2 --slots 2 --flower`, and a job sent the moment it returned."""
    tmp = tmp_path_factory.mktemp("up-flower")
    home = tmp / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULAYER_", "FLOWER_"))}
    env["GPULAYER_HOME"] = str(home)
    (tmp / "first.py").write_text(FIRST_JOB)
    go = tmp / "up-returned"
    first = subprocess.Popen([sys.executable, str(tmp / "first.py"), str(go)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    state, pids = {}, []
    try:
        up = subprocess.run([sys.executable, "-m", "gpulayer", "up", "--workers", "2", "--slots", "2", "--flower"],
                            capture_output=True, text=True, timeout=180, env=env)
        returned = time.time()
        go.touch()
        state = json.loads((home / "cluster.json").read_text()) if (home / "cluster.json").exists() else {}
        pids = [state.get("supervisor_pid"), state.get("redis_pid"), state.get("flower_pid"),
                *(state.get("worker_pids") or {}).values()]
        assert up.returncode == 0, up.stderr
        out, err = first.communicate(timeout=120)
        assert first.returncode == 0, err
        job = json.loads(out.strip().splitlines()[-1])
        print(f"the first job was sent {job['sent'] - returned:.2f} s after `gpulayer up --flower` returned")
        yield {"state": state, "up": up.stdout, "env": env, "tmp": tmp, "url": state["flower_url"],
               "auth": state["flower_auth"], "first": job,
               "job_env": dict(env, GPULAYER_BROKER_URL=state["broker_url"], GPULAYER_SECRET=state["secret"])}
    finally:
        go.touch()
        stop_process(first, grace=5)
        first.stdout.close()
        first.stderr.close()
        down = subprocess.run([sys.executable, "-m", "gpulayer", "down"], capture_output=True, text=True,
                              timeout=120, env=env)
        assert down.returncode == 0, down.stderr
        wait_gone([p for p in pids if p])


def test_up_prints_flowers_login_masked_unless_asked(up_flower):
    user, _, password = up_flower["auth"].partition(":")
    port = up_flower["url"].rsplit(":", 1)[1]
    assert f"Flower: http://{user}:***@127.0.0.1:{port}" in up_flower["up"] and password not in up_flower["up"]
    shown = subprocess.run([sys.executable, "-m", "gpulayer", "up", "--show-secrets"], capture_output=True, text=True,
                           timeout=60, env=up_flower["env"])
    assert shown.returncode == 0, shown.stderr
    login = f"http://{user}:{password}@127.0.0.1:{port}"
    assert f"Flower: {login}" in shown.stdout
    # What it prints is what a user pastes: curl takes the login from the URL.
    if shutil.which("curl"):
        out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"{login}api/workers"],
                             capture_output=True, text=True, timeout=60)
        assert out.stdout == "200", out


def test_flowers_api_answers_the_login_and_refuses_everyone_else(up_flower):
    url, auth = up_flower["url"], up_flower["auth"]
    code, body = request(url + "api/workers?status=1", auth)
    assert code == 200 and {"local-1", "local-2"} <= {n.split("@")[0] for n in json.loads(body)}
    assert request(url + "api/workers")[0] == 401
    assert request(url + "api/workers", auth.split(":")[0] + ":not-the-password")[0] == 401
    assert request(url + "gpulayer/fleet.json")[0] == 401
    assert request(url + "gangs")[0] == 401


def test_bad_input_to_flowers_api_is_a_4xx_that_says_why(up_flower):
    url, auth = up_flower["url"] + "api/task/async-apply/gpulayer.submit", up_flower["auth"]
    code, body = request(url, auth, json.dumps({"args": ["no_colon_here"]}).encode())
    assert code == 400, (code, body)
    assert "PayloadError" in body and "'package.module:function'" in body
    code, body = request(url, auth, json.dumps({"args": ["math:factorial", 5],
                                                "kwargs": {"resources": {"zone": "mars-1"}}}).encode())
    assert code == 400 and "JobRejected" in body and "mars-1" in body, (code, body)
    code, body = request(url, auth, json.dumps({"args": ["math:factorial", 5]}).encode())
    assert code == 200 and json.loads(body)["task-id"], (code, body)


PRINTS = textwrap.dedent("""
    import gpulayer
    from gpulayer import submit

    def say(x):
        print("said", x)
        return x

    gpulayer.init(log_to_client=False)
    h = submit.delay(say, 5)
    h.get(timeout=60)
    print(h.id)
""")


def test_flower_serves_a_jobs_kept_output_for_its_task_page(up_flower):
    script = up_flower["tmp"] / "prints.py"
    script.write_text(PRINTS)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env=up_flower["job_env"])
    assert run.returncode == 0, run.stderr
    job_id = run.stdout.split()[-1]
    url = up_flower["url"] + f"gpulayer/output/{job_id}.json"
    assert request(url)[0] == 401
    code, body = request(url, up_flower["auth"])
    assert code == 200 and json.loads(body) == {"job": job_id, "lines": [{"stream": "out", "text": "said 5"}]}


def test_flowers_metrics_tell_two_functions_apart(up_flower):
    from prometheus_client.parser import text_string_to_metric_families

    script = up_flower["tmp"] / "two.py"
    script.write_text(TWO_FUNCTIONS)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env=up_flower["job_env"])
    assert run.returncode == 0 and run.stdout.split() == ["27", "120"], run.stderr

    def succeeded():
        code, text = request(up_flower["url"] + "metrics")  # as curl: no login for Prometheus's scrape
        assert code == 200
        done = {s.labels["task"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "flower_events_total" and s.labels["type"] == "task-succeeded"}
        return done if {"cube", "math.factorial"} <= set(done) else None

    done = wait_until(succeeded, 30, "Flower's /metrics never counted cube and math.factorial")
    assert "gpulayer.submit" not in done  # every job goes by its function's name, none by Celery's task


def test_flower_shows_the_fleet_the_gangs_and_every_job_by_name(up_flower):
    """In headless Chromium: the job sent the moment `up` returned is listed by its function's name with
    readable args; the Gangs tab lists a running 2 x 2 gang with its placement reason and where its ranks
    run, and a waiting one with its place in line and reason; the Workers page and a worker's page show
    zone, region, CUDA and slots (free, running, held by gangs)."""
    need(chromium_executable() is not None, "no chromium on PATH (apt-get install -y chromium)")
    url, first = up_flower["url"], up_flower["first"]
    assert first["value"] == 49
    release = up_flower["tmp"] / "release"
    (up_flower["tmp"] / "gangs.py").write_text(GANGS)
    gangs = subprocess.Popen([sys.executable, str(up_flower["tmp"] / "gangs.py"), str(release)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=up_flower["job_env"])
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        ids = json.loads(gangs.stdout.readline() or "{}")
        assert ids, gangs.stderr.read() if gangs.poll() is not None else "no ids"
        with Chromium(up_flower["tmp"] / "chrome") as browser:
            browser.authorize(up_flower["auth"])

            # The Tasks page: the first job, by its function's name, with its call as args.
            wait_until(lambda: done_task_row(browser, url, first["id"]), 30, f"the Tasks table never listed the first job {first['id']}")
            name = browser.evaluate(f"Array.from(document.querySelectorAll('#tasks-table tbody tr')).find(r => "
                                    f"r.textContent.includes({json.dumps(first['id'])})).cells[0].innerText")
            assert name.strip() == "square"
            row = browser.evaluate(f"Array.from(document.querySelectorAll('#tasks-table tbody tr')).find(r => "
                                   f"r.textContent.includes({json.dumps(first['id'])})).innerText")
            assert "square(7)" in row and "gpulayer.submit" not in row, row
            browser.screenshot(SHOTS / "flower31-tasks.png")
            assert not browser.errors, browser.errors

            # The Gangs tab: the running gang with its placement, the waiting one with its place in line.
            browser.load(url)
            browser.wait_for("!!document.getElementById('gpulayer-gangs-tab')", what="the Gangs tab")
            browser.evaluate("document.getElementById('gpulayer-gangs-tab').click()")
            running = waiting = None

            def both_gangs():
                nonlocal running, waiting
                browser.load(url + "gangs")
                running = browser.evaluate(f"(document.querySelector('tr[data-gang=\"{ids['running']}\"]"
                                           "[data-state=\"running\"]') || {}).innerText")
                waiting = browser.evaluate(f"(document.querySelector('tr[data-gang=\"{ids['waiting']}\"]"
                                           "[data-state=\"waiting\"]') || {}).innerText")
                return running and waiting and "node 1 on" in running
            wait_until(both_gangs, 90, "the Gangs page never listed one running and one waiting gang")
            status = json.loads(subprocess.run([sys.executable, "-m", "gpulayer", "status", "--json"],
                                               capture_output=True, text=True, timeout=60,
                                               env=up_flower["env"]).stdout)
            by_id = {g["id"]: g for g in status["gangs"]}
            placed = by_id[ids["running"]]
            assert "hold" in running and "2 x 2" in running and placed["reason"] and placed["reason"] in running
            for node, worker in enumerate(placed["workers"]):
                ranks = ", ".join(str(node * 2 + r) for r in range(2))
                assert f"node {node} on {worker}: ranks {ranks}" in running, running
            assert "(#1 in line)" in waiting and by_id[ids["waiting"]]["reason"] in waiting, waiting
            assert browser.evaluate("document.getElementById('gpulayer-gangs-tab').classList.contains('active')")
            browser.screenshot(SHOTS / "flower31-gangs.png")
            assert not browser.errors, browser.errors

            # The Workers page: Flower's table, and the fleet's beside it.
            browser.load(url + "workers")
            fleet = browser.wait_for("(document.getElementById('gpulayer-fleet-table') || {}).innerText",
                                     what="the fleet table")
            assert "europe-west1-b" in fleet and "europe-west1-c" in fleet and "Held by gangs" in fleet
            browser.screenshot(SHOTS / "flower31-workers.png")

            # One worker's page: its place, CUDA, slots, and the gang holding them.
            host = next(n for n in json.loads(request(url + "api/workers?status=1", up_flower["auth"])[1])
                        if n.startswith("local-1@"))
            browser.load(url + f"worker/{host}")
            card = browser.wait_for("(document.getElementById('gpulayer-worker') || {}).innerText",
                                    what="the worker's place and slots")
            assert "europe-west1-b" in card and "europe-west1" in card and "CUDA / GPUs" in card, card
            assert "Slots\n2 (free 0, running 0, held by gangs 2)" in card, card
            assert ids["running"][:12] in card, card
            browser.screenshot(SHOTS / "flower31-worker.png")
            assert not browser.errors, browser.errors
        release.touch()
        out, err = gangs.communicate(timeout=300)
        assert gangs.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == [[0, 1, 2, 3], [0, 1, 2, 3]]
    finally:
        release.touch()
        stop_process(gangs, grace=5)
        gangs.stdout.close()
        gangs.stderr.close()


def test_the_fleet_script_goes_into_html_pages_only():
    from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

    from gpulayer.flower_pages import script_transform

    transform = script_transform("", "/static/")

    def answer(uri: str, ctype: str, body: bytes, finishing: bool = True) -> tuple[HTTPHeaders, bytes]:
        t = transform(HTTPServerRequest(start_line=RequestStartLine("GET", uri, "HTTP/1.1"),
                                         headers=HTTPHeaders({"Host": "127.0.0.1"})))
        headers = HTTPHeaders({"Content-Type": ctype, "Content-Length": str(len(body))})
        _, headers, out = t.transform_first_chunk(200, headers, body, finishing)
        return headers, out

    page = b"<html><body><p>workers</p></body></html>"
    headers, body = answer("/workers", "text/html; charset=UTF-8", page)
    assert body == b'<html><body><p>workers</p><script src="/gpulayer/static/fleet.js"></script></body></html>'
    assert headers["Content-Length"] == str(len(body))
    for uri, ctype in (("/api/workers", "text/html"), ("/static/x.html", "text/html"),
                       ("/gpulayer/fleet.json", "application/json"), ("/tasks", "application/json")):
        assert answer(uri, ctype, page)[1] == page, uri
    assert answer("/workers", "text/html", page, finishing=False)[1] == page  # a page in chunks passes as is
    under = script_transform("/flower", "/flower/static/")
    t = under(HTTPServerRequest(start_line=RequestStartLine("GET", "/flower/workers", "HTTP/1.1"),
                                headers=HTTPHeaders({"Host": "127.0.0.1"})))
    assert b'src="/flower/gpulayer/static/fleet.js"' in t.transform_first_chunk(
        200, HTTPHeaders({"Content-Type": "text/html"}), page, True)[2]


def test_input_errors_map_to_4xx_and_others_stay_flowers():
    from gpulayer.engine.flower import input_status
    from gpulayer.errors import ClusterUnavailable, ConfigError, JobFailed, JobRejected, PayloadError

    assert input_status(PayloadError("bad ref")) == 400
    assert input_status(JobRejected("no zone")) == 400
    assert input_status(ConfigError("bad option")) == 400
    assert input_status(ClusterUnavailable("gone")) == 503
    assert input_status(ValueError("a bug of ours")) is None  # not the caller's input: Flower's 500 stands
    assert input_status(JobFailed("X", "y")) is None
    assert input_status(None) is None


FLEET_TABLE = "(document.getElementById('gpulayer-fleet-table') || {}).innerText"


def test_flower_opened_at_the_url_with_its_login_in_it_shows_the_fleet(up_flower):
    # The URL `gpulayer up --flower --show-secrets` prints: http://user:password@127.0.0.1:PORT/
    need(chromium_executable() is not None, "no chromium on PATH (apt-get install -y chromium)")
    from gpulayer.local.workers import login_url

    url = login_url(up_flower["url"], up_flower["auth"])
    assert f"Flower: {url}" in subprocess.run([sys.executable, "-m", "gpulayer", "up", "--show-secrets"],
                                             capture_output=True, text=True, timeout=60, env=up_flower["env"]).stdout
    with Chromium(up_flower["tmp"] / "chrome-login-url") as browser:
        for page in ("", "workers"):  # Flower's front page is its Workers page
            browser.load(url + page)
            fleet = browser.wait_for(FLEET_TABLE, what=f"the fleet table at /{page}")
            assert "local-1" in fleet and "local-2" in fleet and "europe-west1-b" in fleet, fleet
        host = next(n for n in json.loads(request(up_flower["url"] + "api/workers?status=1", up_flower["auth"])[1])
                    if n.startswith("local-1@"))
        browser.load(url + f"worker/{host}")
        card = browser.wait_for("(document.getElementById('gpulayer-worker') || {}).innerText", what="the worker card")
        assert "Slots" in card, card
        assert not browser.errors, browser.errors


def test_flower_opened_through_its_login_prompt_shows_the_fleet(up_flower):
    need(chromium_executable() is not None, "no chromium on PATH (apt-get install -y chromium)")
    with Chromium(up_flower["tmp"] / "chrome-login-prompt") as browser:
        browser.answer_login_prompts(up_flower["auth"])
        browser.load(up_flower["url"])  # no login in it: Flower asks, the user types it
        fleet = browser.wait_for(FLEET_TABLE, what="the fleet table")
        assert "local-1" in fleet and "local-2" in fleet, fleet
        assert browser.prompts >= 1
        assert not browser.errors, browser.errors
