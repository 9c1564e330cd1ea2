"""Starting ``gpulayer worker`` and ``gpulayer flower`` as child processes, and waiting for a port.

The broker URL and the cluster secret go by environment, never on the command line, where any local
user would read the password in ``ps``.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

from ..deadline import Deadline
from ..procs.ready import READY_FD_ENV
from .redis_server import TERM_WITH_PARENT


def start_worker(broker_url: str, secret: str, *, name: str, slots: int = 1, zone: str | None = None,
                 region: str | None = None, cuda: str = "off", advertise_addr: str | None = None,
                 log_file: Path | None = None, env: dict[str, str] | None = None,
                 tie_to_parent: bool = False, extra_args: list[str] | None = None,
                 prefix: list[str] | None = None, ready: int | None = None) -> subprocess.Popen:
    """Start ``gpulayer worker`` as our child process (``prefix``: e.g. ``ip netns exec ns1``).

    ``ready``: the write end of a pipe the worker tells how far it got (``procs/ready.py``; read it with
    :func:`wait_ready`); the caller closes its own copy after this call.

    The broker URL and the secret go by environment, never on the command line,
    where any local user would read the password in ``ps``.
    """
    args = [*(prefix or []), sys.executable, "-m", "gpulayer", "worker", "--name", name,
            "--slots", str(slots), "--cuda", cuda, "--loglevel", "INFO"]
    for flag, value in (("--zone", zone), ("--region", region), ("--advertise-addr", advertise_addr)):
        if value:
            args += [flag, value]
    args += extra_args or []
    child_env = dict(os.environ if env is None else env)
    child_env["GPULAYER_BROKER_URL"] = broker_url
    child_env["GPULAYER_SECRET"] = secret
    child_env["PYTHONUNBUFFERED"] = "1"  # logs reach the file as they happen
    if ready is not None:
        child_env[READY_FD_ENV] = str(ready)
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    try:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=child_env, preexec_fn=TERM_WITH_PARENT if tie_to_parent else None,
                                pass_fds=() if ready is None else (ready,))
    finally:
        if log_file:
            out.close()


def start_flower(broker_url: str, secret: str, *, port: int, log_file: Path | None = None,
                 tie_to_parent: bool = False, basic_auth: str | None = None) -> subprocess.Popen:
    """Start ``gpulayer flower`` on 127.0.0.1:``port`` as our child (the URL, the secret and the login
    ``basic_auth``, ``user:password``, go by environment)."""
    args = [sys.executable, "-m", "gpulayer", "flower", "--port", str(port), "--address", "127.0.0.1"]
    env = dict(os.environ, GPULAYER_BROKER_URL=broker_url, GPULAYER_SECRET=secret, PYTHONUNBUFFERED="1")
    if basic_auth:
        env["FLOWER_BASIC_AUTH"] = basic_auth
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL
    try:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                preexec_fn=TERM_WITH_PARENT if tie_to_parent else None)
    finally:
        if log_file:
            out.close()


def new_flower_login() -> str:
    """A login for Flower, ``user:password``: the local user's name (one Flower's ``user:password`` list can
    hold) and a random password. ``gpulayer up --flower`` and ``gpulayer flower`` make theirs here."""
    import getpass
    import secrets

    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        name = ""
    name = name if name and ":" not in name and "," not in name else "gpulayer"
    return f"{name}:{secrets.token_urlsafe(18)}"


def login_url(url: str, login: str | None) -> str:
    """Flower's ``url`` with ``login`` (``user:password``) in it, ``http://user:password@127.0.0.1:5555/``: what
    curl and a browser take as is."""
    from urllib.parse import quote

    if not login:
        return url
    user, _, password = login.partition(":")
    return url.replace("://", f"://{quote(user, safe='')}:{quote(password, safe='')}@", 1)


def flower_line(url: str, login: str | None, show_secrets: bool, kept: str = "") -> str:
    """What ``gpulayer up --flower`` and ``gpulayer flower`` print: ``Flower: http://alice:***@127.0.0.1:PORT/``,
    the password masked unless ``show_secrets``; ``kept``: where else the login is to be found."""
    from ..masking import mask_url

    shown = login_url(url, login)
    if show_secrets or not login:
        return f"Flower: {shown}"
    return f"Flower: {mask_url(shown)} (its login; --show-secrets prints the password{kept})"


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 30.0, host: str = "127.0.0.1") -> bool:
    """True once ``host:port`` accepts connections; False if ``proc`` exits or time runs out."""
    import socket

    deadline = Deadline(timeout)
    while not deadline.expired() and proc.poll() is None:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def wait_ready(pipes: dict[str, int], stage: str, timeout: float | None) -> list[str]:
    """Read the workers' pipes (name -> read end, see ``start_worker``) until each said ``stage``, and close them.

    Returns the names of those that did not: their pipe ended first (the worker exited) or time ran out.
    No polling: the wait blocks on the pipes themselves.
    """
    deadline = Deadline(timeout)
    pending = {fd: name for name, fd in pipes.items()}
    heard = {fd: b"" for fd in pending}
    failed = []
    try:
        while pending:
            readable, _, _ = select.select(list(pending), [], [], deadline.remaining())
            if not readable:
                break  # time is up
            for fd in readable:
                chunk = os.read(fd, 512)
                heard[fd] += chunk
                if stage.encode() in heard[fd].split(b"\n"):
                    del pending[fd]
                elif not chunk:  # the worker exited before it got there
                    failed.append(pending.pop(fd))
    finally:
        for fd in pipes.values():
            os.close(fd)
    return failed + list(pending.values())


def flower_hears(url: str, basic_auth: str, workers: list[str], proc: subprocess.Popen,
                 timeout: float = 30.0) -> bool:
    """True once the Flower at ``url`` has heard an event from each of ``workers`` (gpulayer worker ids): its
    event receiver listens, so it sees every job sent from now on. False if ``proc`` exits or time runs out."""
    import base64
    import json
    import urllib.request

    request = urllib.request.Request(url.rstrip("/") + "/api/workers?status=1",
                                     headers={"Authorization": "Basic " + base64.b64encode(basic_auth.encode()).decode()})
    deadline = Deadline(timeout)
    while not deadline.expired() and proc.poll() is None:
        try:
            with urllib.request.urlopen(request, timeout=deadline.left(5.0)) as answer:
                alive = {name.split("@")[0] for name, up in json.load(answer).items() if up}
            if alive >= set(workers):
                return True
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    return False
