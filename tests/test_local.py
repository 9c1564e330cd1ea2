"""The embedded cluster: `gpulayer up` / `down` and `gpulayer.init()` with nothing configured."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time

import psutil
import redis

from gpulayer.store.registry import Registry


def run_cli(*args, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "gpulayer", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def wait_gone(pids, timeout=30):
    deadline = time.monotonic() + timeout
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if psutil.pid_exists(p)]}"
        time.sleep(0.1)


def test_up_status_down(gpulayer_home):
    env = dict(os.environ)
    out = run_cli("up", "--workers", "2", "--slots", "1", env=env)
    try:
        assert out.returncode == 0, out.stderr
        state_file = gpulayer_home / "cluster.json"
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        state = json.loads(state_file.read_text())
        assert state["broker_url"].split("@")[1] in out.stdout  # masked: see test_secrets.py
        assert state["broker_url"].startswith("redis://:") and "@127.0.0.1:" in state["broker_url"]
        assert (gpulayer_home / "redis" / "appendonlydir").exists() or \
            any(p.name.startswith("appendonly") for p in (gpulayer_home / "redis").iterdir())

        client = redis.Redis.from_url(state["broker_url"])
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert client.config_get("appendonly")["appendonly"] == "yes"
        assert {w.id for w in Registry(client).snapshot()} == {"local-1", "local-2"}
        client.close()
        # Without a password Redis refuses us.
        anon = redis.Redis(host="127.0.0.1", port=int(state["broker_url"].rsplit(":", 1)[1].split("/")[0]))
        try:
            anon.get("x")
            raise AssertionError("the embedded Redis accepted a client without its password")
        except redis.AuthenticationError:
            pass
        except redis.ResponseError as err:
            assert "NOAUTH" in str(err)
        anon.close()

        again = run_cli("up", env=env)
        assert "already running" in again.stdout

        st = run_cli("status", "--json", env=env)
        assert st.returncode == 0, st.stderr
        report = json.loads(st.stdout)
        assert sorted(w["id"] for w in report["workers"]) == ["local-1", "local-2"]
        assert state["secret"] not in st.stdout and "***" in report["broker"]

        pids = [state["supervisor_pid"], state["redis_pid"], *state["worker_pids"].values()]
        put = subprocess.run([sys.executable, "-c", "import gpulayer; from gpulayer.app import app; gpulayer.init(); "
                              "print(gpulayer.put(b'x' * 2_000_000).store)"],
                             capture_output=True, text=True, timeout=120, env=env)
        assert put.returncode == 0, put.stderr
        store = put.stdout.split()[-1]
        root = state["machine_root"]
        assert store == f"file://{root}/objects"
    finally:
        down = run_cli("down", env=env)
    assert down.returncode == 0 and "stopped" in down.stdout
    wait_gone(pids)
    assert not (gpulayer_home / "cluster.json").exists()
    # The next `up` has a new secret, which reads none of this cluster's objects: they go with it.
    assert root and not os.path.exists(root), sorted(os.listdir(root))


def test_init_starts_a_cluster_that_lives_as_long_as_the_process(gpulayer_home, tmp_path):
    script = tmp_path / "use_init.py"
    script.write_text(textwrap.dedent("""
        import json, os, psutil
        import gpulayer
        from gpulayer import submit

        gpulayer.init(workers=2, slots=1)
        print(json.dumps({"sum": submit.delay(lambda a, b: a + b, 2, 3).get(timeout=60),
                          "tree": [p.pid for p in psutil.Process().children(recursive=True)]}))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["sum"] == 5
    assert len(result["tree"]) >= 4  # supervisor, redis, two workers (and their pool processes)
    wait_gone(result["tree"])
    assert not (gpulayer_home / "cluster.json").exists(), "a process-scoped cluster must not pose as `gpulayer up`"


def test_init_without_any_cluster_outlives_a_killed_parent_by_at_most_a_moment(gpulayer_home, tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent("""
        import json, os, psutil, sys
        import gpulayer
        gpulayer.init(workers=1, slots=1)
        print(json.dumps([p.pid for p in psutil.Process().children(recursive=True)]), flush=True)
        sys.stdin.read()
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    try:
        tree = json.loads(proc.stdout.readline())
        proc.kill()  # no atexit: the supervisor must notice by itself
        proc.wait()
        wait_gone(tree)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_local_workers_take_places_in_turn_with_the_readme_zones_by_default():
    from gpulayer.local import region_of, worker_places

    assert worker_places(2) == [("europe-west1-b", "europe-west1"), ("europe-west1-c", "europe-west1")]
    assert [z for z, _ in worker_places(4)] == ["europe-west1-b", "europe-west1-c", "europe-west1-d",
                                                "europe-west1-b"]
    assert worker_places(2, ["europe-west4-a"]) == [("europe-west4-a", "europe-west4")] * 2
    assert worker_places(3, ["a-1", "us-central1-f"], ["lab"]) == [("a-1", "lab"), ("us-central1-f", "lab"),
                                                                  ("a-1", "lab")]
    assert (region_of("europe-west4-a"), region_of("lab"), region_of("rack-12")) == ("europe-west4", "lab", "rack-12")


def test_up_puts_its_workers_where_zone_and_region_say(gpulayer_home):
    env = dict(os.environ)
    out = run_cli("up", "--workers", "2", "--slots", "1", "--zone", "europe-west4-a", "--zone", "us-central1-a",
                  "--region", "eu", "--region", "us", env=env)
    pids = []
    try:
        assert out.returncode == 0, out.stderr
        state = json.loads((gpulayer_home / "cluster.json").read_text())
        pids = [state["supervisor_pid"], state["redis_pid"], *state["worker_pids"].values()]
        client = redis.Redis.from_url(state["broker_url"])
        places = {w.id: (w.zone, w.region) for w in Registry(client).snapshot()}
        client.close()
        assert places == {"local-1": ("europe-west4-a", "eu"), "local-2": ("us-central1-a", "us")}
    finally:
        run_cli("down", env=env)
    wait_gone(pids)


def test_a_script_with_an_embedded_cluster_leaves_nothing_running_once_it_has_exited(gpulayer_home, tmp_path):
    """At exit the process-scoped cluster is stopped at once, and the script waits for it to be gone."""
    script = tmp_path / "short.py"
    script.write_text(textwrap.dedent("""
        import json, os, psutil
        import gpulayer
        from gpulayer import submit
        from gpulayer.app import app, registry
        from gpulayer.objects import store_url

        gpulayer.init()
        assert submit.delay(abs, -2).get(timeout=120) == 2
        kept = submit.delay(bytes, 2_000_000)  # a result kept in the object store, and a put ref never freed
        assert len(kept.get(timeout=120)) == 2_000_000 and gpulayer.put(b"x" * 2_000_000).size > 2_000_000
        tree = [p.pid for p in psutil.Process().children(recursive=True)]
        print(json.dumps({"tree": tree, "my_pgid": os.getpgid(0), "store": store_url(app.backend.client),
                          "pgids": sorted({os.getpgid(p) for p in tree}),
                          "places": {w.id: [w.zone, w.region] for w in registry().snapshot()}}))
    """))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                         env=dict(os.environ, TMPDIR=str(tmp)))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    alive = [p for p in result["tree"] if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"still running after the script exited: {alive}"
    # Its Redis is gone, and so its objects, their store and the unpacked code: nothing of it stays in TMPDIR.
    assert result["store"].startswith(f"file://{tmp}/gpulayer-")
    assert sorted(p.name for p in tmp.glob("gpulayer-*")) == []
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    # The script's Ctrl-C is its own: the cluster runs in another process group, so it is still there
    # for the script to cancel its jobs.
    assert result["my_pgid"] not in result["pgids"]
    assert result["places"] == {"local-1": ["europe-west1-b", "europe-west1"],
                                "local-2": ["europe-west1-c", "europe-west1"]}


def test_up_on_a_running_cluster_refuses_flags_it_does_not_have_and_says_how(gpulayer_home):
    env = dict(os.environ)
    refused = run_cli("up", "--slots", "0", env=env)  # before anything starts
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == ("gpulayer up: error: --slots 0: a worker needs at least 1 job slot (default: cores / "
                              "workers, at least 2)\n"), refused.stderr
    assert not (gpulayer_home / "cluster.json").exists()
    assert run_cli("up", "--workers", "-1", env=env).stderr.startswith("gpulayer up: error: --workers -1: ")
    assert run_cli("up", "--flower", "70000", env=env).stderr.startswith("gpulayer up: error: --flower 70000: ")
    out = run_cli("up", "--workers", "1", "--slots", "1", env=env)
    try:
        assert out.returncode == 0, out.stderr
        running = "1 worker x 1 slot (local-1 in europe-west1-b), without Flower"
        other = run_cli("up", "--workers", "2", "--slots", "3", env=env)
        assert other.returncode == 2 and other.stdout == "", other.stdout
        assert other.stderr == (
            f"gpulayer up: error: a local cluster is already running in {gpulayer_home}: {running}; it was left as "
            "it is, not changed to --workers 2 (it has 1); --slots 3 (its workers have 1 each). For that: "
            "`gpulayer down`, then `gpulayer up --workers 2 --slots 3`, or add a worker beside it: `gpulayer worker "
            "--slots 3` (`gpulayer down` does not stop that one)\n"), other.stderr
        flower = run_cli("up", "--flower", env=env)
        assert flower.returncode == 2 and "not running with this cluster" not in flower.stderr
        assert flower.stderr.endswith("not changed to --flower (it was started without Flower). For that: "
                                      "`gpulayer down`, then `gpulayer up --flower`, or run Flower beside it: "
                                      "`gpulayer flower`\n"), flower.stderr
        group = run_cli("up", "--replicas", "1", "--sentinels", "3", env=env)
        assert group.returncode == 2 and "not changed to --replicas 1 --sentinels 3 (it runs one Redis, no Sentinel " \
            "group). For that: `gpulayer down`, then `gpulayer up --replicas 1 --sentinels 3`" in group.stderr, group.stderr
        zone = run_cli("up", "--zone", "us-east1-b", env=env)
        assert zone.returncode == 2 and "--zone us-east1-b (its zones: europe-west1-b)" in zone.stderr
        same = run_cli("up", "--workers", "1", "--slots", "1", env=env)  # what runs: nothing to say but that
        assert same.returncode == 0 and same.stdout.startswith("already running: broker "), same.stderr
        read, write = os.pipe()
        os.close(read)  # `gpulayer up | head -1`, its reader gone
        try:
            gone = subprocess.run([sys.executable, "-m", "gpulayer", "up"], env=env, stdout=write,
                                  stderr=subprocess.PIPE, text=True, timeout=60)
        finally:
            os.close(write)
        assert gone.stderr == "", gone.stderr
    finally:
        assert run_cli("down", env=env).returncode == 0


def test_a_job_and_a_distributed_job_sent_the_moment_up_returns_both_run(gpulayer_home, tmp_path):
    # `up` returns once the workers answer, before they have imported torch: what is sent at once runs, the
    # job in a pool process without torch, the gang's ranks fresh or from the warm template once it has it.
    script = tmp_path / "at_once.py"
    script.write_text(textwrap.dedent("""
        import os
        import gpulayer
        from gpulayer import distributed, submit

        def rank():
            return int(os.environ["RANK"])

        gpulayer.init()
        job = submit.delay(abs, -3)
        gang = distributed(rank, nodes=2, procs_per_node=1)
        print(job.get(timeout=120), gang.get(timeout=120))
    """))
    env = dict(os.environ)
    up = run_cli("up", env=env)
    try:
        assert up.returncode == 0, up.stderr
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[-2] == "3 [0, 1]"
    finally:
        down = run_cli("down", env=env)
    assert down.returncode == 0 and "stopped" in down.stdout


# Reads a state file's path per line, connects to that cluster and prints which workers inspect().stats() lists:
# one client process for every round, as a user's `celery inspect stats` right after `up` (but without an
# interpreter start per round).
STATS_CLIENT = textwrap.dedent("""
    import json, sys
    import gpulayer
    from gpulayer.app import app

    for line in sys.stdin:
        state = json.loads(open(line.strip()).read())
        gpulayer.init(state["broker_url"], secret=state["secret"])
        print(json.dumps(sorted(app.control.inspect().stats() or {})), flush=True)
""")

UP_ROUNDS = 20  # of `up --workers 2`, inspect().stats(), `down`
FULL_ROUNDS = 1  # of them with workers that preload torch (the default); the rest without (a second each)


def test_right_after_up_returns_inspect_stats_lists_every_worker_every_time(gpulayer_home, tmp_path):
    # Celery's broadcast is a PUBLISH: a worker that registered but is not subscribed yet misses it, and a
    # Celery user's first `inspect` after `up` answered without it. `up` now returns once each worker heard
    # its own control cast (worker/starting.py).
    client = subprocess.Popen([sys.executable, "-c", STATS_CLIENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    heard = []
    try:
        for i in range(UP_ROUNDS):
            env = dict(os.environ, GPULAYER_HOME=str(tmp_path / f"home-{i}"))
            if i >= FULL_ROUNDS:
                env.update(GPULAYER_PRELOAD="", GPULAYER_WARM_RANKS="0")
            up = run_cli("up", "--workers", "2", "--slots", "1", env=env)
            try:
                assert up.returncode == 0, up.stderr
                client.stdin.write(f"{tmp_path / f'home-{i}' / 'cluster.json'}\n")
                client.stdin.flush()
                heard.append(json.loads(client.stdout.readline() or "null"))
            finally:
                assert run_cli("down", env=env).returncode == 0
    finally:
        client.stdin.close()
        client.wait(30)
    both = ["local-1@" + socket.gethostname(), "local-2@" + socket.gethostname()]
    assert heard == [both] * UP_ROUNDS, heard


def test_up_fails_naming_the_log_of_a_worker_that_cannot_start_and_leaves_nothing(gpulayer_home, tmp_path):
    # Only the workers fail: a sitecustomize that ends every `gpulayer worker` process as it starts.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""
        if b"worker" in open("/proc/self/cmdline", "rb").read().split(b"\\0"):
            raise SystemExit("this worker refuses to start")
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = run_cli("up", env=env)
    assert out.returncode == 2, out.stdout
    assert "did not answer" in out.stderr and str(gpulayer_home / "logs" / "local-1.log") in out.stderr
    assert not (gpulayer_home / "cluster.json").exists()
    left = []
    for p in psutil.process_iter(["cmdline"]):
        if any(str(gpulayer_home) in part for part in p.info["cmdline"] or []):
            left.append(p.pid)
    wait_gone(left)  # the supervisor and its Redis are stopping, or gone


def test_up_refuses_a_setting_the_workers_could_not_start_with_in_one_line(gpulayer_home):
    out = run_cli("up", env=dict(os.environ, GPULAYER_HEARTBEAT_INTERVAL="not-a-number"))
    assert out.returncode == 2, out.stdout
    assert out.stderr.startswith("gpulayer up: error: invalid gpulayer settings: heartbeat_interval")
    assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert not (gpulayer_home / "cluster.json").exists() and not (gpulayer_home / "logs").exists()


def test_a_job_running_at_down_finishes_first_and_the_next_up_does_not_run_it_again(gpulayer_home, tmp_path):
    """`gpulayer down` ends the workers' pools at once, but only once their jobs are done (engine/pool_stop.py):
    a job running then finishes, its result is kept and its message acknowledged, so the next `up` (on the same
    Redis files) has nothing to hand back and the job ran once."""
    from gpulayer.store import keys
    from gpulayer.store.jobs import JobRecords

    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent("""
        import time
        import gpulayer
        from gpulayer import submit
        from gpulayer.app import redis_client

        def slow(key):
            redis_client().incr(key)
            time.sleep(2)
            return "finished"

        gpulayer.init()
        print(submit.delay(slow, "down-test:runs").id)
    """))
    env = dict(os.environ)
    assert run_cli("up", "--workers", "1", "--slots", "1", env=env).returncode == 0
    try:
        sent = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                              env=env)
        assert sent.returncode == 0, sent.stderr
        job_id = sent.stdout.split()[-1]
        client = redis.Redis.from_url(json.loads((gpulayer_home / "cluster.json").read_text())["broker_url"])
        deadline = time.monotonic() + 120
        while client.get("down-test:runs") != b"1":  # the job runs
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.05)
        client.close()
    finally:
        down = run_cli("down", env=env)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stderr
    assert run_cli("up", "--workers", "1", "--slots", "1", env=env).returncode == 0
    try:
        # The restarted worker handed back what its previous life held before it registered (before `up` returned).
        state = json.loads((gpulayer_home / "cluster.json").read_text())
        client = redis.Redis.from_url(state["broker_url"])
        assert JobRecords(client).history(job_id) == []  # never lost, never handed back
        assert client.exists(keys.job_done(job_id))  # its result was stored (signed with the old cluster's secret)
        assert client.get("down-test:runs") == b"1"
        client.close()
    finally:
        assert run_cli("down", env=env).returncode == 0


def test_a_session_of_jobs_leaves_no_multiprocessing_directories_in_tmpdir(gpulayer_home, tmp_path):
    # Each worker life made one pymp-* directory (billiard's pool counters) and ended with os._exit, which skips
    # multiprocessing's clean-up; the warm template and a Trainer's ranks alike.
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    script = tmp_path / "session.py"
    script.write_text(textwrap.dedent("""
        import os
        import gpulayer
        from gpulayer import distributed, submit

        def rank():
            return int(os.environ["RANK"])

        def die():
            os._exit(3)  # the pool process goes; a new one takes its place

        gpulayer.init()
        print(sum(submit.delay(abs, -i).get(timeout=120) for i in range(20)))
        try:
            submit.delay(die).get(timeout=120)
        except gpulayer.JobFailed:
            print("died")
        print(distributed(rank, nodes=2, procs_per_node=1).get(timeout=120))
    """))
    up = run_cli("up", "--workers", "2", "--slots", "1", env=env)
    try:
        assert up.returncode == 0, up.stderr
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["190", "died", "[0,", "1]"], out.stdout
        assert any(p.name.startswith("pymp-") for p in tmp.iterdir())  # in use while the cluster runs
    finally:
        down = run_cli("down", env=env)
    assert down.returncode == 0, down.stderr
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("pymp-")]


def test_a_test_fleet_takes_its_objects_and_its_clusters_root_with_it_when_it_stops(tmp_path):
    """A fleet's Redis lives in the test's workdir: once it stops, the objects it recorded are no one's."""
    import gpulayer
    from gpulayer import local
    from tests.fleets import running_fleet

    with running_fleet(tmp_path / "fleet", connect=True) as fleet:
        ref = gpulayer.put(b"x" * 2_000_000)
        client = fleet.client()
        root = local.cluster_root(client)
        client.close()
        stored = root / "objects" / ref.oid
        assert stored.is_file() and ref.store == (root / "objects").as_uri()
    assert not root.exists(), sorted(p.name for p in root.rglob("*"))
