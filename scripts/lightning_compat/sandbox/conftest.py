"""The gpulayer side's conftest: the fixtures Lightning's tests request, written for gpulayer.

Placed as tests_pytorch/conftest.py in the temporary tree instead of Lightning's, which imports Lightning's
internals. What it keeps of Lightning's test environment: each test starts with the environment variables,
signal handlers, torch determinism flag and rank-zero rank it found, and no process group left over. What it
drops: the artifact, zombie-thread and leaked-variable checks (test hygiene, not Trainer behaviour).
Fixtures that simulate accelerators by patching Lightning's device probes skip: the private rule counts
their tests apart anyway.
"""

import os
import signal
import socket
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
import torch.distributed

from tests_pytorch import _PATH_DATASETS

_SIGNALS = [s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)]


@pytest.fixture(scope="session")
def datadir():
    return Path(_PATH_DATASETS)


@pytest.fixture(autouse=True)
def _lsr_restore_process_state():
    environ = dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    ranks = _rank_holders()
    saved_ranks = [getattr(fn, "rank", None) for fn in ranks]
    yield
    os.environ.clear()
    os.environ.update(environ)
    for s, handler in handlers.items():
        if handler is not None:
            signal.signal(s, handler)
    for fn, rank in zip(ranks, saved_ranks):
        if rank is not None:
            fn.rank = rank
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    torch.use_deterministic_algorithms(False)


def _rank_holders():
    holders = []
    try:
        from gpulayer.trainer.utilities.rank_zero import rank_zero_only
        holders.append(rank_zero_only)
    except ImportError:
        pass
    return holders


def _simulated_devices(*_args, **_kwargs):
    pytest.skip("simulated accelerator: Lightning's fixture patches Lightning's private device probes")


mock_cuda_count = mock_mps_count = mock_xla_available = mock_tpu_available = _simulated_devices


@pytest.fixture
def cuda_count_0():
    _simulated_devices()


cuda_count_1 = cuda_count_2 = cuda_count_4 = mps_count_0 = mps_count_1 = xla_available = tpu_available = cuda_count_0


@pytest.fixture
def caplog(caplog):
    """Log records of gpulayer's loggers reach caplog even where a logger does not propagate."""
    import logging

    loggers = [logging.getLogger()] + [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)
                                       if n.startswith("gpulayer")]
    saved = [(lg, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.propagate = True
    yield caplog
    for lg, propagate in saved:
        lg.propagate = propagate


@pytest.fixture
def tmpdir_server(tmp_path):
    server = ThreadingHTTPServer(("localhost", 0), partial(SimpleHTTPRequestHandler, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address
    finally:
        server.shutdown()
        server.server_close()


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture
def single_process_pg():
    """A one-process gloo group for the test's duration."""
    if torch.distributed.is_initialized():
        raise RuntimeError("single_process_pg needs no process group to be initialized already")
    environ = dict(os.environ)
    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1")
    torch.distributed.init_process_group("gloo")
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(environ)
