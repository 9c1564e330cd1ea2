"""Fixtures of the object store tests: a real S3-compatible server process (moto's server mode on a free loopback
port, ``gpulayer.lab.s3_server``), and its environment for a test.

Import the fixtures into a test module (``from tests.objects.servers import s3_server, s3_env``); the server is
one per module, stopped by pid at its end. Without ``moto_server`` or obstore the tests skip, and fail under CI.
"""

from __future__ import annotations

import importlib.util
import uuid

import pytest

from gpulayer.lab.s3_server import S3Server, moto_server_command
from tests.fleets import need

BUCKET = "gl-test"


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    need(moto_server_command() is not None, "moto_server is not installed: pip install 'moto[server]' (the test "
         "extra has it)")
    need(importlib.util.find_spec("obstore") is not None, "obstore is not installed: pip install 'gpulayer[s3]'")
    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The server's AWS_* environment in this process (and the processes it starts); the server."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    return s3_server


def s3_url(prefix: str | None = None) -> str:
    """A store URL of its own in the test bucket (each test sees only its own objects)."""
    return f"s3://{BUCKET}/{prefix or uuid.uuid4().hex[:12]}"
