"""The cloud and GPU benchmark scripts: what they would run, checked without a cloud or a GPU.

``benchmarks/cloud/gcp.sh --dry-run`` runs with an empty PATH (no gcloud, no tools at all) and its printed
commands are parsed and checked in order; ``benchmarks/gpu/run_all.sh`` prints its plan with ``--check``
and refuses to measure on a machine without a CUDA GPU. Every shell script is shellcheck-clean.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fleets import need

REPO = Path(__file__).resolve().parent.parent
GCP = REPO / "benchmarks" / "cloud" / "gcp.sh"
BASH = shutil.which("bash") or "/bin/bash"
SCRIPTS = sorted([*(REPO / "benchmarks" / "cloud").glob("*.sh"), *(REPO / "benchmarks" / "gpu").glob("*.sh")])


def dry_run(*args: str, tmp_path: Path) -> list[list[str]]:
    """The commands ``gcp.sh --dry-run ARGS`` prints, each split as a shell would; PATH holds nothing."""
    env = {"PATH": str(tmp_path / "empty"), "TMPDIR": str(tmp_path), "HOME": str(tmp_path)}
    proc = subprocess.run([BASH, str(GCP), "--dry-run", *args], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "command not found" not in proc.stderr
    return [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ ")]


def flags(cmd: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in cmd if a.startswith("--") and "=" in a)


def metadata(cmd: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in flags(cmd)["metadata"].split(","))


WORKERS = "us-central1-a:2,us-central1-b:1,europe-west4-a:2"
BENCH = "python benchmarks/scale_test.py --jobs 50 --note 'two words'"


@pytest.fixture
def commands(tmp_path):
    return dry_run("--project", "my-proj-1", "--redis-zone", "us-central1-a", "--workers", WORKERS,
                   "--machine-type", "e2-standard-8", "--bench", BENCH, "--tag", "gl-t1",
                   "--out", str(tmp_path / "out"), tmp_path=tmp_path)


def gcloud(commands, *verb: str) -> list[list[str]]:
    return [c for c in commands if c[:len(verb) + 1] == ["gcloud", *verb]]


def test_dry_run_creates_the_rule_the_redis_vm_and_one_call_per_zone(commands):
    (rule,) = gcloud(commands, "compute", "firewall-rules", "create")
    assert rule[4] == "gl-t1-internal"
    f = flags(rule)
    assert f["source-tags"] == f["target-tags"] == "gl-t1"  # open between the cluster's VMs only
    assert "source-ranges" not in f and f["project"] == "my-proj-1"

    creates = gcloud(commands, "compute", "instances", "create")
    redis, *workers = creates
    assert redis[4] == "gl-t1-redis" and flags(redis)["zone"] == "us-central1-a"
    assert flags(redis)["labels"] == "gpulayer-tag=gl-t1,gpulayer-role=redis"
    assert metadata(redis)["gpulayer-role"] == "redis"
    names = {flags(c)["zone"]: [a for a in c[4:] if not a.startswith("--")] for c in workers}
    assert names == {"us-central1-a": ["gl-t1-us-central1-a-1", "gl-t1-us-central1-a-2"],
                     "us-central1-b": ["gl-t1-us-central1-b-1"],
                     "europe-west4-a": ["gl-t1-europe-west4-a-1", "gl-t1-europe-west4-a-2"]}
    for c in workers:
        f, m = flags(c), metadata(c)
        assert f["machine-type"] == "e2-standard-8" and f["tags"] == "gl-t1"
        assert f["labels"] == "gpulayer-tag=gl-t1,gpulayer-role=worker"
        assert m["gpulayer-role"] == "worker" and m["gpulayer-zone"] == f["zone"]
        assert m["gpulayer-region"] == f["zone"].rsplit("-", 1)[0]  # europe-west4-a -> europe-west4
        assert m["gpulayer-broker-host"] == "gl-t1-redis.us-central1-a.c.my-proj-1.internal"
        assert m["gpulayer-gpus"] == "0" and "accelerator" not in f
        assert m["gpulayer-source"] == "wheel" and m["gpulayer-wheel"].endswith("-py3-none-any.whl")
        startup = dict(kv.split("=", 1) for kv in f["metadata-from-file"].split(","))
        assert Path(startup["startup-script"]) == REPO / "benchmarks" / "cloud" / "node.sh"
        assert "gpulayer-env" in startup  # the secrets go in a file, never on the command line


def test_dry_run_runs_the_benchmark_copies_its_logs_and_deletes_everything_in_order(commands, tmp_path):
    verbs = [" ".join(c[:3] if c[2] in ("ssh", "scp") else c[:4]) for c in commands if c[0] == "gcloud"]
    first = {v: verbs.index(v) for v in reversed(verbs)}
    order = ["gcloud compute firewall-rules create", "gcloud compute instances create", "gcloud compute ssh",
             "gcloud compute scp", "gcloud compute instances delete", "gcloud compute firewall-rules delete"]
    assert [first[v] for v in order] == sorted(first[v] for v in order)

    ssh = gcloud(commands, "compute", "ssh")
    assert all(c[3] == "gl-t1-redis" and flags(c)["zone"] == "us-central1-a" for c in ssh)
    bench = shlex.split(flags(ssh[-1])["command"])  # as the remote shell reads it
    assert bench == ["sudo", "gpulayer-node", "bench", "5", "3600", BENCH]
    copy_back = gcloud(commands, "compute", "scp")[-1]
    assert copy_back[3] == "gl-t1-redis:/tmp/gpulayer-results.tgz" and copy_back[4] == f"{tmp_path / 'out'}/"
    assert verbs.index("gcloud compute scp") > verbs.index("gcloud compute instances create")

    deletes = gcloud(commands, "compute", "instances", "delete")
    deleted = {flags(c)["zone"]: sorted(a for a in c[4:] if not a.startswith("--")) for c in deletes}
    created = {}
    for c in gcloud(commands, "compute", "instances", "create"):
        created.setdefault(flags(c)["zone"], []).extend(a for a in c[4:] if not a.startswith("--"))
    assert deleted == {z: sorted(n) for z, n in created.items()}
    assert all("--quiet" in c for c in deletes)
    (rule_delete,) = gcloud(commands, "compute", "firewall-rules", "delete")
    assert rule_delete[4] == "gl-t1-internal"
    assert commands[-1][:2] == ["rm", "-rf"]  # the local secrets go last


def test_dry_run_with_gpus_attaches_them_to_the_workers_only(tmp_path):
    commands = dry_run("--project", "my-proj-1", "--workers", "us-central1-a:2", "--gpu-type", "nvidia-l4",
                       "--gpus-per-worker", "2", "--machine-type", "g2-standard-24", "--bench", "true",
                       "--tag", "gl-gpu", tmp_path=tmp_path)
    redis, worker = gcloud(commands, "compute", "instances", "create")
    assert "accelerator" not in flags(redis) and metadata(redis)["gpulayer-gpus"] == "0"
    assert flags(worker)["accelerator"] == "type=nvidia-l4,count=2"
    assert flags(worker)["maintenance-policy"] == "TERMINATE"  # GPU VMs cannot live-migrate
    assert metadata(worker)["gpulayer-gpus"] == "2"


def test_dry_run_from_git_ships_nothing(tmp_path):
    commands = dry_run("--project", "my-proj-1", "--git", "https://example.com/gpulayer.git@v1", "--bench", "true",
                       "--tag", "gl-git", tmp_path=tmp_path)
    assert not gcloud(commands, "compute", "scp")[:-1]  # only the logs come back
    assert not [c for c in commands if c[:2] == ["python3", "-m"]]
    for c in gcloud(commands, "compute", "instances", "create"):
        assert metadata(c)["gpulayer-source"] == "git+https://example.com/gpulayer.git@v1"


def test_keep_leaves_everything_running_and_cleanup_finds_it_by_label(tmp_path):
    kept = dry_run("--project", "my-proj-1", "--bench", "true", "--tag", "gl-keep", "--keep", tmp_path=tmp_path)
    assert not gcloud(kept, "compute", "instances", "delete")
    assert not gcloud(kept, "compute", "firewall-rules", "delete")
    swept = dry_run("--project", "my-proj-1", "--cleanup", "gl-keep", tmp_path=tmp_path)
    (listing,) = gcloud(swept, "compute", "instances", "list")
    assert flags(listing)["filter"] == "labels.gpulayer-tag=gl-keep"
    (rules,) = gcloud(swept, "compute", "firewall-rules", "list")
    assert flags(rules)["filter"] == "name=gl-keep-internal"
    assert not gcloud(swept, "compute", "instances", "create")


@pytest.mark.parametrize("args, message", [
    (["--bench", "true"], "--project is required"),
    (["--project", "my-proj-1"], "--bench is required"),
    (["--project", "my-proj-1", "--bench", "true", "--workers", "us-central1:3"], "is not ZONE:COUNT"),
    (["--project", "my-proj-1", "--bench", "true", "--tag", "Bad_Tag"], "--tag Bad_Tag"),
    (["--project", "my-proj-1", "--bench", "true", "--gpus-per-worker", "2"], "needs --gpu-type"),
    (["--project", "my-proj-1", "--bench", "true", "--torch", "torch>=2.3,<3"], "a comma would split it"),
    (["--project", "my-proj-1", "--bench", "true", "--wheel", "missing.whl"], "is not a wheel file"),
])
def test_bad_arguments_are_refused_before_anything_runs(tmp_path, args, message):
    env = {"PATH": str(tmp_path / "empty"), "TMPDIR": str(tmp_path)}
    proc = subprocess.run([BASH, str(GCP), "--dry-run", *args], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr
    assert "gcloud" not in proc.stdout


# -- benchmarks/gpu ---------------------------------------------------------------------------------------
RUN_ALL = REPO / "benchmarks" / "gpu" / "run_all.sh"
CASES = REPO / "benchmarks" / "gpu" / "cases.py"


def run_all(*args: str, tmp_path: Path, gpus: list[str] = ()) -> subprocess.CompletedProcess:
    """run_all.sh ARGS with this interpreter, on a PATH whose nvidia-smi (if any) lists ``gpus``."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    if gpus:
        (fake / "nvidia-smi").write_text("#!/bin/sh\nprintf '%s\\n' " + " ".join(shlex.quote(g) for g in gpus) + "\n")
        (fake / "nvidia-smi").chmod(0o755)
    system = ":".join(p for p in os.environ["PATH"].split(":") if not (Path(p) / "nvidia-smi").exists())
    env = dict(os.environ, PATH=f"{fake}:{system}", PYTHON=sys.executable)
    return subprocess.run([BASH, str(RUN_ALL), *args], capture_output=True, text=True, env=env, timeout=120)


def test_check_prints_the_plan_within_eight_minutes_and_exits_0(tmp_path):
    proc = run_all("--check", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for step in ("env", "cuda-tests", "routing", "nccl", "trainer"):
        assert f"  {step} " in proc.stdout
    total = int(proc.stdout.split("total limit ")[1].split()[0])
    assert total < 8 * 60  # the steps' limits: the whole run stays under 8 minutes
    assert "fp32" in proc.stdout and "16-mixed" in proc.stdout and "bf16-mixed" in proc.stdout
    assert "backend='nccl'" in proc.stdout and "--cuda on" in proc.stdout
    assert "no CUDA GPU here" in proc.stdout and "-no-gpu/" in proc.stdout
    assert not (tmp_path / "out").exists()


def test_the_rehearsal_plan_runs_the_cases_on_cpu_without_the_cuda_tests(tmp_path):
    proc = run_all("--check", "--rehearse", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "  cuda-tests " not in proc.stdout and "--rehearse (on CPU)" in proc.stdout
    assert "-cpu-rehearsal/" in proc.stdout


def test_without_a_gpu_it_refuses_to_measure(tmp_path):
    proc = run_all("--out", str(tmp_path / "out"), tmp_path=tmp_path)
    assert proc.returncode == 1 and "no CUDA GPU" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_logs_are_named_after_the_gpu_and_a_cpu_torch_is_refused(tmp_path):
    one = run_all("--check", tmp_path=tmp_path, gpus=["NVIDIA H200"])
    assert one.returncode == 0 and "GPUs here: 1 (NVIDIA H200)" in one.stdout
    assert "-nvidia-h200/" in one.stdout
    eight = run_all("--check", tmp_path=tmp_path, gpus=["NVIDIA A100-SXM4-80GB"] * 8)
    assert "-nvidia-a100-sxm4-80gbx8/" in eight.stdout
    import torch

    if not torch.cuda.is_available():  # nvidia-smi lists a GPU, torch sees none: said, and nothing measured
        proc = run_all("--out", str(tmp_path / "out"), tmp_path=tmp_path, gpus=["NVIDIA H200"])
        assert proc.returncode == 1 and "torch sees no CUDA GPU" in proc.stderr
        assert not (tmp_path / "out").exists()


def test_cases_plan_is_pure_and_names_every_case():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_cases", CASES)
    cases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cases)
    cuda = cases.trainer_cases()
    assert [(c["model"], c["precision"]) for c in cuda] == [
        ("mlp", "32-true"), ("mlp", "16-mixed"), ("mlp", "bf16-mixed"), ("cnn", "32-true"), ("cnn", "32-true")]
    assert [(c.get("cudnn_benchmark"), c.get("prefetch")) for c in cuda[3:]] == [(True, True), (False, False)]
    assert all(cases.FILTER in c["name"] and c["device"] == "cuda" for c in cuda)
    assert all(c["device"] == "cpu" and cases.FILTER in c["name"] for c in cases.trainer_cases("cpu"))
    text = "\n".join(cases.plan(gpus=2))
    assert "procs_per_node=2" in text and f"{len(cuda) * 3 * 2 * cases.TRAINER_REPEATS} processes" in text


@pytest.mark.parametrize("case", ["routing", "nccl"])
def test_the_gpu_cases_run_rehearsed_on_cpu(tmp_path, case):
    """The code run_all.sh runs on a GPU, run here on CPU (gloo, --cuda off): its fleet, jobs and log."""
    from tests.fleets import need_redis

    need_redis()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(CASES), case, "--rehearse", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (tmp_path / f"gpu_{case}-rehearsal.txt").read_text()
    if case == "routing":
        assert "cuda jobs off the GPU worker or with a non-finite product: 0" in log
        assert "refused: no live worker has CUDA" in log
    else:
        for variant in ("direct warm", "direct fresh", "torchrun"):
            assert f"| {variant} | wall" in log and f"{variant:<13} median wall" in log
        assert "wrong ranks none" in log and "wrong ranks [" not in log


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shell_scripts_are_shellcheck_clean(script):
    need(shutil.which("shellcheck") is not None, "no shellcheck on PATH (apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", "--severity=info", str(script)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout


def test_every_script_is_checked():
    assert {p.name for p in SCRIPTS} >= {"gcp.sh", "node.sh", "run_all.sh"}
