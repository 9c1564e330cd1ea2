"""docker-compose.yml: no Docker engine here, so check it against the real CLI instead."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpulayer.cli import build_parser

COMPOSE = Path(__file__).resolve().parent.parent / "docker-compose.yml"


@pytest.fixture(scope="module")
def services():
    return yaml.safe_load(COMPOSE.read_text())["services"]


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
    cmd = services["redis"]["command"]
    assert "--requirepass" in cmd and "${REDIS_PASSWORD" in cmd[cmd.index("--requirepass") + 1]
    assert cmd[cmd.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])


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
