"""``gpulayer``: the command line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from ..errors import GpulayerError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpulayer", description="Run PyTorch work on a fleet of machines.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="start the embedded local cluster in the background")
    up.add_argument("--workers", type=int, default=None, help="local workers (default 2)")
    up.add_argument("--slots", type=int, default=None, help="job slots per worker (default: cores / workers, >= 2)")
    up.add_argument("--flower", type=int, nargs="?", const=0, default=None, metavar="PORT",
                    help="also run Flower on 127.0.0.1 (on PORT, default a free port)")
    up.add_argument("--zone", action="append", default=None, metavar="ZONE",
                    help="zone of the next local worker; repeat per worker, taken in turn "
                         "(default: europe-west1-b, europe-west1-c, europe-west1-d)")
    up.add_argument("--region", action="append", default=None, metavar="REGION",
                    help="region of the next local worker, likewise (default: the zone's, europe-west1-b -> "
                         "europe-west1)")
    up.add_argument("--replicas", type=int, default=0, metavar="N",
                    help="run Redis as a Sentinel group: a primary and N replicas (with --sentinels)")
    up.add_argument("--sentinels", type=int, default=0, metavar="N",
                    help="N sentinels watching the group, failing over 2 s after the primary stops answering "
                         "(with --replicas; e.g. --replicas 1 --sentinels 3)")
    up.add_argument("--show-secrets", action="store_true",
                    help="print the broker URL and Flower's login with their passwords (default: masked; the state "
                         "file has them)")

    sub.add_parser("down", help="stop what `gpulayer up` started")

    w = sub.add_parser("worker", help="run a worker on this machine")
    w.add_argument("--broker", default=None, help="redis://[:password@]host:port/db, or a Sentinel group: "
                        "sentinel://[:password@]host:port[,host:port...]/<master name> (default: GPULAYER_BROKER_URL)")
    w.add_argument("--slots", type=int, default=None, help="concurrent jobs (default: GPUs, else cores)")
    w.add_argument("--zone", default=None, help="the zone this machine is in, e.g. europe-west1-b (jobs and "
                                                "distributed jobs may ask for it)")
    w.add_argument("--region", default=None, help="its region, e.g. europe-west1 (default: none)")
    w.add_argument("--name", default=None, help="worker id (default: <cuda|cpu>-<zone>-<host>)")
    w.add_argument("--cuda", choices=("auto", "on", "off"), default="auto",
                   help="auto: serve the GPUs this machine shows (default); on: refuse to start without one; off: CPU only")
    w.add_argument("--advertise-addr", default=None, help="address other machines reach this one at")
    w.add_argument("--loglevel", default="INFO", help="DEBUG, INFO (default), WARNING or ERROR")
    w.add_argument("--log-jobs", action="store_true", default=None,
                   help="log every job received and every success (default: GPULAYER_LOG_JOBS, off: only "
                        "failures, retries and lost jobs; --loglevel DEBUG logs them too)")
    w.add_argument("--insecure", action="store_true", help="allow a broker beyond loopback without a password")

    st = sub.add_parser("status", help="live workers, slots and queues")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--watch", type=float, nargs="?", const=2.0, default=None, metavar="SECONDS",
                    help="refresh every SECONDS (default 2) until Ctrl-C")
    st.add_argument("--all", action="store_true",
                    help="a row for every worker (default: a summary by zone and region above 50 workers)")

    tr = sub.add_parser("train", help="run a training script on N workers x M processes",
                        description="Run a training script as one distributed job: N workers x M processes, each "
                                    "rank with torchrun's environment, the working directory shipped to every "
                                    "worker, every rank's output streamed back.")
    tr.add_argument("--nodes", type=int, default=1, metavar="N",
                    help="workers (machines) the job runs on, each one node of the job (1 to 4096; default 1)")
    tr.add_argument("--procs-per-node", type=int, default=1, metavar="M",
                    help="processes (ranks) on each node, one job slot each (1 to 512; default 1, as torchrun's "
                         "--nproc-per-node); with --cuda, one GPU each")
    tr.add_argument("--launcher", choices=("direct", "torchrun"), default="direct",
                    help="direct: each worker starts its ranks itself, with the environment torchrun would set "
                         "(default, fast); torchrun: each worker runs torchrun with a static rendezvous")
    tr.add_argument("--cuda", action="store_true", help="run on GPU workers (NCCL)")
    tr.add_argument("--zone", default=None, help="run only on workers in this zone (e.g. europe-west1-b)")
    tr.add_argument("--workdir", default=None, help="directory to package and send (default: current)")
    tr.add_argument("--max-restarts", type=int, default=0, metavar="K",
                    help="start the whole job again up to K times after a rank fails or a worker dies (default 0)")
    tr.add_argument("--priority", type=int, default=0, metavar="P",
                    help="0 (the lowest, default) to 9; higher wins: placed before jobs of lower priority, and may "
                         "preempt running ones (SIGTERM, then SIGKILL after preempt_grace; they are requeued)")
    tr.add_argument("--restart-from", choices=("node0", "own", "fresh"), default="node0",
                    help="where each node of a restarted attempt starts: node 0's files at the end of the failed "
                         "attempt, as on a shared file system (default); its own directory; the shipped copy")
    tr.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                    help="give up when the job has waited this long for free slots (default: wait)")
    tr.add_argument("--keep-workdir", action="store_true",
                    help="leave each node's working directory on its worker at the end (its path is printed)")
    tr.add_argument("--no-pull", action="store_true",
                    help="do not copy the files node 0's ranks created or changed back into --workdir")
    tr.add_argument("--detach", action="store_true",
                    help="Ctrl-C stops watching and leaves the job running (default: Ctrl-C cancels it)")
    tr.add_argument("script", help="the training script, a path inside --workdir; every rank runs it as __main__")
    tr.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")

    ca = sub.add_parser("cancel", help="stop jobs, distributed jobs or batches by id, or all this client sent")
    ca.add_argument("ids", nargs="*", metavar="ID", help="a job's, distributed job's, batch's or group's id, "
                    "or a unique prefix of it (at least 6 characters)")
    ca.add_argument("--all-mine", action="store_true",
                    help="everything this client identity sent in the last day that has not finished "
                         "(config client_id, default user@host)")

    us = sub.add_parser("users", help="the users the cluster knows: add (prints a token), list, set, revoke")
    usub = us.add_subparsers(dest="users_command", required=True, metavar="ACTION")
    for action, text in (("add", "a new user; prints its token once"), ("set", "change a user's quotas")):
        a = usub.add_parser(action, help=text)
        a.add_argument("name", metavar="NAME")
        a.add_argument("--share", type=float, default=None, help="fair-share weight (default 1)")
        a.add_argument("--max-slots", type=int, default=None, metavar="N", help="slots it may hold at once")
        a.add_argument("--max-gpus", type=int, default=None, metavar="G", help="GPUs it may hold at once")
        a.add_argument("--max-gangs", type=int, default=None, metavar="K", help="distributed jobs at once")
        a.add_argument("--priority", type=int, default=None, metavar="P", help="higher goes first (default 0)")
        a.add_argument("--admin", action=argparse.BooleanOptionalAction, default=None,
                       help="may cancel anyone's jobs")
    usub.add_parser("list", help="every user and its quotas (no secret shown)")
    rv = usub.add_parser("revoke", help="end a user's token (running workers refuse it within seconds)")
    rv.add_argument("name", metavar="NAME")

    lo = sub.add_parser("logs", help="what a job or a distributed job's ranks printed",
                        description="Print what a job (or each rank of a distributed job) printed: its stdout, "
                                    "stderr and logging lines, the newest up to 1 MiB, kept as long as its result.")
    lo.add_argument("id", metavar="ID", help="the job's or distributed job's id")
    lo.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the job ends")
    lo.add_argument("--rank", type=int, default=None, metavar="R", help="a distributed job's rank R only")

    fl = sub.add_parser("flower", help="run Flower, the monitoring UI, on this cluster")
    fl.add_argument("--broker", default=None, help="redis://... (default: GPULAYER_BROKER_URL, else `gpulayer up`)")
    fl.add_argument("--port", type=int, default=5555)
    fl.add_argument("--address", default="127.0.0.1", help="bind address (beyond loopback needs --basic-auth)")
    fl.add_argument("--basic-auth", default=None,
                    help="its login, user:password (default: FLOWER_BASIC_AUTH, else one made up and printed; "
                         "required when bound beyond loopback)")
    fl.add_argument("--show-secrets", action="store_true",
                    help="print Flower's URL with its login's password (default: masked)")

    me = sub.add_parser("metrics", help="serve queue lengths and slot use as Prometheus metrics")
    me.add_argument("--broker", default=None, help="redis://... (default: GPULAYER_BROKER_URL, else `gpulayer up`)")
    me.add_argument("--port", type=int, default=9808)
    me.add_argument("--address", default="127.0.0.1", help="bind address")

    sub.add_parser("demo", help="start the embedded cluster and run the README's demo")
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        try:
            code = _COMMANDS[args.command](args) or 0
            if sys.stdout is not None:  # (None: started with its stdout closed)
                sys.stdout.flush()  # a reader gone shows here, not in a traceback at the interpreter's exit
            return code
        except GpulayerError as err:
            print(f"gpulayer {args.command}: error: {err}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader of our output left (`gpulayer status --json | head`): stop quietly, as Unix tools do, with
    the status a shell reports for them (128 + SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # what is still buffered goes nowhere at exit, not into a traceback
        os.dup2(devnull, sys.stderr.fileno())
    except (OSError, ValueError):
        pass
    return 128 + signal.SIGPIPE


def _up(args) -> int:
    from ..local import up
    from ..state_file import home_dir  # not config.py: no pydantic for a command run dozens of times a day
    from ..local.supervisor import stopped_note
    from ..masking import mask_url
    from .up_flags import check_settings, check_up_flags, refuse_changes

    check_up_flags(args)  # before anything starts
    check_settings()
    previous = stopped_note(home_dir(), fix=False)  # the last cluster's account of why it stopped on its own
    cluster, started = up(args.workers, args.slots, flower=args.flower, zones=args.zone, regions=args.region,
                          replicas=args.replicas, sentinels=args.sentinels)
    if not started:
        refuse_changes(args, cluster.home)  # flags it does not have: what runs, and how to get them
    url = cluster.broker_url if args.show_secrets else mask_url(cluster.broker_url)
    print(("started" if started else "already running") + f": broker {url}")
    if started and previous:
        print(f"(the previous one: {previous})")
    from ..state_file import STATE_FILE_NAME, read_state

    state = read_state(cluster.home / STATE_FILE_NAME) or {}
    places = state.get("places") or {}
    if places:
        print("workers: " + ", ".join(f"{n} ({p['zone']}, {p['region']})" for n, p in places.items()))
    if state.get("sentinel_group"):
        group = state["sentinel_group"]
        print("Sentinel group: " + ", ".join(f"{name} (pid {pid})" for name, pid in group["pids"].items())
              + f"; failover {group['down_after_ms'] / 1000:g} s after the primary stops answering "
              "(`gpulayer status` names it: kill -9 its pid to watch one)")
        if args.replicas == 1:
            from ..local.supervisor import restart_after

            print("one replica: while it (or, after a failover, the old primary) is lost, writes go on acknowledged "
                  "by the primary alone (`gpulayer status` says \"durability degraded\") until it is back (started "
                  "again after " f"{restart_after(group['down_after_ms']):g} s); GPULAYER_MIN_REPLICAS=1 refuses them "
                  "instead, --replicas 2 keeps a copy")
    if cluster.flower_url:
        from ..local.workers import flower_line

        print(flower_line(cluster.flower_url, cluster.flower_auth, args.show_secrets, ", the state file has it"))
    elif args.flower is not None:
        print("Flower: not running with this cluster (see its logs, or run `gpulayer flower`)")
    print(f"state file: {cluster.home / 'cluster.json'} (broker URL and cluster secret; mode 0600)")
    print("connect with gpulayer.init() from Python, stop with `gpulayer down`")
    return 0


def _down(args) -> int:
    from ..local import down

    print("stopped the local cluster" if down() else "no local cluster was running")
    return 0


def _worker(args) -> int:
    from ..worker.main import run_worker

    return run_worker(broker=args.broker, slots=args.slots, zone=args.zone, region=args.region, name=args.name,
                      cuda=args.cuda, advertise_addr=args.advertise_addr, loglevel=args.loglevel,
                      log_jobs=args.log_jobs, insecure=args.insecure)


def _status(args) -> int:
    from ..status import collect, render, watch

    full = True if args.all else None  # None: every worker of a small fleet, a summary of a big one
    if args.watch is not None:
        return watch(args.watch, as_json=args.json, full=full)
    if args.json:  # machine readers get every worker, and the summary beside them
        print(json.dumps(collect(), indent=2))
    else:
        render(collect(full), full)
    return 0


def _train(args) -> int:
    from .train import train

    return train(args.script, args.args, nodes=args.nodes, procs_per_node=args.procs_per_node,
                 launcher=args.launcher, cuda=args.cuda, zone=args.zone, workdir=args.workdir,
                 max_restarts=args.max_restarts, priority=args.priority, timeout=args.timeout,
                 keep_workdir=args.keep_workdir,
                 pull=not args.no_pull, detach=args.detach, restart_from=args.restart_from)


def _cancel(args) -> int:
    from .cancel import cancel

    if not args.ids and not args.all_mine:
        print("gpulayer cancel: error: name the ids to cancel, or give --all-mine", file=sys.stderr)
        return 2
    return cancel(args.ids, all_mine=args.all_mine)


def _users(args) -> int:
    from . import users

    if args.users_command == "list":
        return users.list_users()
    if args.users_command == "revoke":
        return users.revoke(args.name)
    fields = {k: getattr(args, k) for k in ("share", "max_slots", "max_gpus", "max_gangs", "priority", "admin")}
    return (users.add if args.users_command == "add" else users.update)(args.name, **fields)


def _logs(args) -> int:
    from .logs import logs

    return logs(args.id, follow=args.follow, rank=args.rank)


def _flower(args) -> int:
    from ..monitor import run_flower

    return run_flower(broker=args.broker, port=args.port, address=args.address, basic_auth=args.basic_auth,
                      show_secrets=args.show_secrets)


def _metrics(args) -> int:
    from ..monitor import serve_metrics

    return serve_metrics(broker=args.broker, port=args.port, address=args.address)


def _demo(args) -> int:
    from ..demo import run_demo

    return run_demo()


_COMMANDS = {"up": _up, "down": _down, "worker": _worker, "status": _status, "train": _train, "cancel": _cancel,
             "users": _users, "logs": _logs, "flower": _flower, "metrics": _metrics, "demo": _demo}
