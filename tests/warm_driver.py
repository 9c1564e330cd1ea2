"""Driver for tests/test_warm_start.py: start two ranks one way, record what each rank sees.

    python tests/warm_driver.py drive warm|fresh|naive OUTDIR    # in a process the test starts (stdin: a pipe)
    python tests/warm_driver.py probe OUTFILE ARG                 # what each rank runs (a script, as torchrun's)

``drive`` first makes this process as unlike a fresh one as a worker is: a
variable only it has, torch set to 3 threads, every generator seeded with 0,
handlers for SIGUSR1 and SIGTERM, SIGUSR2 blocked, its own working directory.
Then it starts the ranks:

- ``warm``: forked from a warm template by the rank runner;
- ``fresh``: fresh interpreters by the same runner (the reference);
- ``naive``: ``os.fork()`` of this process, which then calls the probe: what a
  runner that "simply forks" would give. Every hygiene test checks that its
  fact is right for ``warm`` and ``fresh`` and wrong for ``naive``.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import signal
import stat
import sys

HERE = os.path.abspath(__file__)


def probe(outfile: str) -> None:
    import numpy as np
    import torch

    pdeathsig = ctypes.c_int(0)
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(2, ctypes.byref(pdeathsig))  # PR_GET_PDEATHSIG
    st = os.fstat(0)
    null = os.stat(os.devnull)
    main = sys.modules["__main__"]
    facts = {
        "env": dict(os.environ),
        "threads": torch.get_num_threads(),
        "random": [random.random(), float(np.random.random()), float(torch.rand(1).item())],
        "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "ppid": os.getppid(),
        "stdin_is_devnull": stat.S_ISCHR(st.st_mode) and st.st_rdev == null.st_rdev,
        "argv": sys.argv, "main_file": getattr(main, "__file__", None), "main_name": main.__name__,
        "path0": sys.path[0], "cwd": os.getcwd(),
        "signals": {name: _handler_name(signal.getsignal(getattr(signal, name)))
                    for name in ("SIGUSR1", "SIGTERM", "SIGINT", "SIGPIPE")},
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "pdeathsig": pdeathsig.value,
        "cmdline": [a.decode() for a in open("/proc/self/cmdline", "rb").read().rstrip(b"\0").split(b"\0")],
        "executable": sys.executable,
    }
    with open(outfile + ".tmp", "w") as f:
        json.dump(facts, f)
    os.replace(outfile + ".tmp", outfile)


def _handler_name(handler) -> str:
    if handler is signal.SIG_DFL:
        return "SIG_DFL"
    if handler is signal.SIG_IGN:
        return "SIG_IGN"
    if handler is signal.default_int_handler:
        return "default_int_handler"
    return getattr(handler, "__name__", repr(handler))


def _parent_handler(signum, frame):  # pragma: no cover - never called
    pass


def unlike_fresh(outdir: str) -> None:
    import numpy as np
    import torch

    os.environ["WARM_TEST_PARENT_ONLY"] = "1"
    torch.set_num_threads(3)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    signal.signal(signal.SIGUSR1, _parent_handler)
    signal.signal(signal.SIGTERM, _parent_handler)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
    os.makedirs(os.path.join(outdir, "driver"), exist_ok=True)
    os.chdir(os.path.join(outdir, "driver"))


def rank_env(rank: int, outdir: str) -> dict[str, str]:
    from gpulayer.procs.env import RankLayout, rank_env as torchrun_env

    base = {k: v for k, v in os.environ.items() if k != "WARM_TEST_PARENT_ONLY"}
    env = torchrun_env(RankLayout(0, rank, 1, 2), master_addr="127.0.0.1", master_port=29999, run_id="warm-test",
                       base_env=base)
    env["OMP_NUM_THREADS"] = str(rank + 1)
    env["WARM_TEST_RANK_ONLY"] = str(rank)
    return env


def drive(mode: str, outdir: str) -> None:
    unlike_fresh(outdir)
    rank_dir = os.path.join(outdir, "rank")
    os.makedirs(rank_dir, exist_ok=True)
    outs = [os.path.join(outdir, f"{mode}-{r}.json") for r in range(2)]
    summary = {"driver": {"pid": os.getpid(), "pgid": os.getpgid(0), "argv": sys.argv}}
    if mode == "naive":
        pids = []
        for r in range(2):
            pid = os.fork()
            if pid == 0:
                try:
                    probe(outs[r])
                finally:
                    os._exit(0)
            pids.append(pid)
        summary["codes"] = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
        summary["warm"] = [True, True]
    else:
        from gpulayer.procs.runner import RankCommand, RankRunner
        from gpulayer.procs.warm import WarmTemplate

        template = WarmTemplate(restart=False).start() if mode == "warm" else None
        try:
            commands = [RankCommand((r,), (HERE, "probe", outs[r], f"arg{r}"), rank_env(r, outdir), cwd=rank_dir)
                        for r in range(2)]
            runner = RankRunner(commands, template=template, on_output=lambda r, s, l: print(f"[{r}] {l}",
                                                                                            file=sys.stderr))
            outcome = runner.run(timeout=120)
            summary["codes"] = outcome.exit_codes
            summary["warm"] = runner.warm
            summary["template_pid"] = template.pid if template else None
        finally:
            if template is not None:
                template.close()
    with open(os.path.join(outdir, f"{mode}-summary.json"), "w") as f:
        json.dump(summary, f)


if __name__ == "__main__":
    if sys.argv[1] == "probe":
        probe(sys.argv[2])
    else:
        drive(sys.argv[2], sys.argv[3])
