"""docker-compose.yml: no Docker engine here, so check it against the real CLI instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpulayer.cli import build_parser

COMPOSE = Path(__file__).resolve().parent.parent / "docker-compose.yml"


@pytest.fixture(scope="module")
def all_services():
    return yaml.safe_load(COMPOSE.read_text())["services"]


@pytest.fixture(scope="module")
def services(all_services):
    """What `docker compose up` starts: the services of no profile."""
    return {n: s for n, s in all_services.items() if not s.get("profiles")}


@pytest.fixture(scope="module")
def sentinel_profile(all_services):
    """What `docker compose --profile sentinel up` adds."""
    return {n: s for n, s in all_services.items() if "sentinel" in s.get("profiles", ())}


def test_every_gpulayer_command_parses_with_the_real_cli(services):
    parser = build_parser()
    checked = 0
    for name, svc in services.items():
        cmd = svc.get("command")
        if not cmd or cmd[0] != "gpulayer":
            continue
        try:
            parser.parse_args(cmd[1:])
        except SystemExit as err:
            pytest.fail(f"service {name}: `{' '.join(cmd)}` is rejected by the gpulayer CLI ({err})")
        checked += 1
    assert checked == 4


def test_topology(services):
    parser = build_parser()
    workers = {n: parser.parse_args(s["command"][1:]) for n, s in services.items()
               if s.get("command", [""])[:2] == ["gpulayer", "worker"]}
    cpu = [a for a in workers.values() if a.cuda == "off"]
    gpu = [a for a in workers.values() if a.cuda == "on"]
    assert len(cpu) == 2 and len({a.zone for a in cpu}) == 2
    assert len(gpu) == 1
    gpu_service = next(s for s in services.values() if "--cuda" in s.get("command", []) and "on" in s["command"])
    devices = gpu_service["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]


def test_redis_has_a_password_and_append_only_persistence(services):
    redis = services["redis"]
    assert redis["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    script = " ".join(redis["command"])
    assert "requirepass" in script and "$$REDIS_PASSWORD" in script  # expanded by the container's shell
    assert "--appendonly yes" in script
    assert any(v.endswith(":/data") for v in redis["volumes"])


def test_redis_reads_its_password_from_a_file_not_its_command_line(services):
    """``$$`` reaches the container's shell as ``$``: the password lands in a 0600 file redis-server reads."""
    shell, flag, script = services["redis"]["command"]
    assert (shell, flag) == ("sh", "-c")
    assert "--requirepass" not in script and "${REDIS_PASSWORD" not in script  # compose would expand those
    assert "umask 077" in script
    conf = re.search(r"> (\S+) ", script).group(1)
    server = script[script.index("redis-server"):].split()
    assert server[1] == conf, "redis-server's command line names the file, never the password"
    assert "exec docker-entrypoint.sh redis-server" in script  # the image's entrypoint drops to the redis user


def test_workers_and_flower_get_secret_and_password_from_the_environment(services):
    for name, svc in services.items():
        if svc.get("command", [""])[0] != "gpulayer":
            continue
        env = svc["environment"]
        assert env["GPULAYER_SECRET"].startswith("${GPULAYER_SECRET"), name
        assert "${REDIS_PASSWORD" in env["GPULAYER_BROKER_URL"], name
    flower = parse_flower(services)
    assert flower.address == "0.0.0.0" and "FLOWER_BASIC_AUTH" in services["flower"]["environment"]


def parse_flower(services):
    return build_parser().parse_args(services["flower"]["command"][1:])


def _default(value: str) -> str:
    """What compose makes of ``${VAR:-default}`` with VAR unset (and of a plain value: itself)."""
    m = re.fullmatch(r"\$\{\w+:-(.*)\}", value)
    return m.group(1) if m else value


def test_the_gpu_worker_is_built_with_a_cuda_torch_and_the_cpu_ones_without(services):
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text()
    assert "ARG TORCH_INDEX_URL" in dockerfile and "--index-url ${TORCH_INDEX_URL}" in dockerfile
    assert "ARG TORCH_SPEC" in dockerfile and '"${TORCH_SPEC}"' in dockerfile
    images = {}
    for name, svc in services.items():
        if svc.get("command", [""])[0] != "gpulayer":
            continue
        args = svc["build"]["args"]
        index = _default(args["TORCH_INDEX_URL"])
        assert index.startswith("https://download.pytorch.org/whl/"), (name, index)
        assert args["TORCH_SPEC"].startswith("torch"), name
        cuda = "--cuda" in svc["command"] and svc["command"][svc["command"].index("--cuda") + 1] == "on"
        if cuda:
            assert re.search(r"/whl/cu\d{3}$", index), f"{name} runs --cuda on but installs torch from {index}"
        else:
            assert index.endswith("/whl/cpu"), f"{name} needs no CUDA but installs torch from {index}"
        images.setdefault(svc["image"], set()).add(index)
    # One image per torch build: a CUDA image never overwrites the CPU one under the same tag.
    assert all(len(indexes) == 1 for indexes in images.values()), images
    assert any(re.search(r"/whl/cu\d{3}$", i) for indexes in images.values() for i in indexes)


# -- the `sentinel` profile: a primary, one replica, three sentinels, and workers through a sentinel:// URL ---------
def test_the_sentinel_profile_is_a_primary_a_replica_and_three_sentinels(sentinel_profile):
    servers = {n: s for n, s in sentinel_profile.items() if "--sentinel" not in " ".join(s.get("command", []))
               and s.get("command", [""])[0] == "sh"}
    sentinels = {n: s for n, s in sentinel_profile.items() if "--sentinel" in " ".join(s.get("command", []))}
    assert set(servers) == {"redis-primary", "redis-replica"} and len(sentinels) == 3
    assert "FOLLOW" not in servers["redis-primary"]["environment"]
    assert servers["redis-replica"]["environment"]["FOLLOW"] == "redis-primary"
    for name, svc in servers.items():
        script = svc["command"][2]
        assert svc["environment"]["SERVER_NAME"] == name  # the name it announces: what the sentinels hand out
        assert "masterauth" in script and "replicaof" in script and "--appendonly yes" in script
        assert "${REDIS_PASSWORD" not in script and "$$REDIS_PASSWORD" in script
    for name, svc in sentinels.items():
        script = svc["command"][2]
        assert "sentinel monitor gpulayer redis-primary 6379 2" in script, name  # quorum: 2 of 3
        assert "sentinel auth-pass gpulayer $$REDIS_PASSWORD" in script and "${REDIS_PASSWORD" not in script
        assert script.rstrip().endswith("--sentinel")


def test_the_sentinel_profiles_workers_reach_the_group_through_a_sentinel_url(sentinel_profile):
    from gpulayer.config import load_settings
    from gpulayer.sentinel_url import parse_sentinel_url

    parser = build_parser()
    sentinels = sorted(n for n, s in sentinel_profile.items() if "--sentinel" in " ".join(s.get("command", [])))
    workers = {n: s for n, s in sentinel_profile.items() if s.get("command", [""])[:2] == ["gpulayer", "worker"]}
    assert len(workers) == 2
    for name, svc in workers.items():
        parser.parse_args(svc["command"][1:])  # the real CLI takes it
        env = svc["environment"]
        assert env["GPULAYER_SECRET"].startswith("${GPULAYER_SECRET")
        url = re.sub(r"\$\{REDIS_PASSWORD:\?[^}]*\}", "pw", env["GPULAYER_BROKER_URL"])
        target = parse_sentinel_url(url)
        assert target.service == "gpulayer" and target.password == "pw"
        assert [h for h, _ in target.sentinels] == sentinels and {p for _, p in target.sentinels} == {26379}
        settings = load_settings(broker_url=url, durability=env["GPULAYER_DURABILITY"])
        assert settings.durability_mode() == "replicated"
        assert set(svc["depends_on"]) == set(sentinels)
