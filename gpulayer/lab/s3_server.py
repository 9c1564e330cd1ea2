"""A real S3-compatible server process on a free loopback port, for tests and benchmarks: moto's server mode.

``moto[server]`` installs the ``moto_server`` command (a Flask app speaking S3's HTTP API); it runs as our child
process, is reached only over 127.0.0.1, and is stopped by pid. Nothing is mocked inside the process under test:
every request goes through obstore's HTTP client to the server, as it would to MinIO or AWS.

    with S3Server(workdir) as s3:
        s3.create_bucket("gl-test")
        os.environ.update(s3.env())          # AWS_ENDPOINT_URL, keys, region
        GPULAYER_OBJECT_STORE = s3.url("gl-test", "objects")

``env()`` also points the AWS instance metadata endpoint at a closed loopback port, so a client left without
keys (the missing-credentials test) asks 127.0.0.1 instead of 169.254.169.254.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from ..deadline import wait_until
from ..local.redis_server import TERM_WITH_PARENT
from ..procs.env import free_port
from ..procs.stop import stop_process

START_TIMEOUT = 60.0
ACCESS_KEY = "gl-test-key"  # moto accepts any keys; these only have to be set
SECRET_KEY = "gl-test-secret"
REGION = "us-east-1"


def moto_server_command() -> str | None:
    """The ``moto_server`` beside this Python (its venv's bin), else on PATH; None when moto[server] is missing."""
    beside = Path(sys.executable).with_name("moto_server")
    return str(beside) if beside.exists() else shutil.which("moto_server")


def closed_port_url() -> str:
    """``http://127.0.0.1:<port>`` of a port nothing listens on (a request there fails at once)."""
    return f"http://127.0.0.1:{free_port()}"


class S3Server:
    """``moto_server`` on ``127.0.0.1:<free port>``, its output in ``workdir/moto.log``."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        command = moto_server_command()
        if command is None:
            raise FileNotFoundError("moto_server not found beside this Python nor on PATH: "
                                    "pip install 'moto[server]' (in the test extra: pip install -e '.[test]')")
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / "moto.log", "ab") as log:
            self.proc = subprocess.Popen([command, "-H", "127.0.0.1", "-p", str(self.port)], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=TERM_WITH_PARENT)
        wait_until(self._answers, START_TIMEOUT, f"moto_server on port {self.port} to answer", every=0.1)

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {self.proc.returncode}: "
                               f"{(self.workdir / 'moto.log').read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(self.endpoint + "/", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # it answered
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=5)
            self.proc = None

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def create_bucket(self, name: str) -> None:
        """``PUT /<name>`` (moto takes an unsigned request; a real server would need a signed one)."""
        req = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def url(self, bucket: str, prefix: str = "") -> str:
        return f"s3://{bucket}/{prefix}".rstrip("/")

    def env(self) -> dict[str, str]:
        """The AWS_* variables a client of this server needs (and no way out of loopback)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION,
                "AWS_METADATA_ENDPOINT": closed_port_url()}
