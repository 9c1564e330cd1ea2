#!/usr/bin/env bash
# Smoke run of every benchmark: each script with its smallest settings (--quick where it has one, else the
# smallest counts, rounds, workers and sizes its flags allow), one after another, each under `timeout`.
# It checks that they run; it measures nothing (the figures of such short runs mean nothing).
#
#   bash benchmarks/smoke.sh                 # all of them
#   bash benchmarks/smoke.sh startup lab     # only those whose name (as in the summary) is given
#   bash benchmarks/smoke.sh --list          # the names and commands; runs nothing
#
# PYTHON: the interpreter (default .venv/bin/python at the repository root); the run goes from the root,
# with the root first on PYTHONPATH, so the checkout's gpulayer is the one run. Results files go to a
# temporary folder (BENCH_RESULTS_DIR, removed at the end), not to benchmarks/results/. Each benchmark's
# output goes to SMOKE_LOGS/<name>.log (default: a new folder under /tmp, kept; its path is printed); a
# failure prints the log's last lines. A benchmark that needs what this machine lacks (root and `ip netns`,
# a CUDA GPU, Lightning, Ray's venv .venv-bench) is reported SKIPPED with the reason. Exit status 1 if any
# benchmark failed, 2 for a bad argument or a missing interpreter.
set -euo pipefail

here=${BASH_SOURCE[0]%/*}
[[ $here != "${BASH_SOURCE[0]}" ]] || here=.
REPO=$(cd "$here/.." && pwd)
cd "$REPO"

PY=${PYTHON:-.venv/bin/python}
[[ $PY == */* && $PY != /* ]] && PY=$REPO/$PY
if ! command -v "$PY" >/dev/null; then
    echo "smoke.sh: no interpreter at $PY (set PYTHON)" >&2
    exit 2
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

list=0
selected=()
for arg in "$@"; do
    case $arg in
        --list) list=1 ;;
        -h | --help) sed -n '2,16p' "${BASH_SOURCE[0]}"; exit 0 ;;
        -*) echo "smoke.sh: unknown option $arg (see --help)" >&2; exit 2 ;;
        *) selected+=("$arg") ;;
    esac
done

tmp=$(mktemp -d -t bench-smoke-results.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export BENCH_RESULTS_DIR=$tmp/results
logs=${SMOKE_LOGS:-}
if ((!list)); then
    [[ -n $logs ]] || logs=$(mktemp -d -t bench-smoke-logs.XXXXXX)
    mkdir -p "$logs"
fi

# -- what this machine can provide ------------------------------------------------------------------------
py_ok() { "$PY" -c "$1" >/dev/null 2>&1; }

netns_missing=""
if ((EUID != 0)); then
    netns_missing="needs root for network namespaces (running as uid $EUID)"
elif ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    netns_missing="needs the ip and tc commands (iproute2)"
elif ! ip netns list >/dev/null 2>&1; then
    netns_missing="\`ip netns list\` fails here"
fi
lightning_missing=""
py_ok "import lightning" || lightning_missing="needs Lightning (pip install -e '.[bench]')"
has_cuda=0
py_ok "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" && has_cuda=1
has_ray=0
py_ok "import ray" && has_ray=1

# -- the runs -----------------------------------------------------------------------------------------------
names=() states=() codes=() walls=() notes=()

wanted() {
    ((${#selected[@]} == 0)) && return 0
    local s
    for s in "${selected[@]}"; do [[ $1 == "$s" ]] && return 0; done
    return 1
}

record() {  # name state code seconds note
    names+=("$1"); states+=("$2"); codes+=("$3"); walls+=("$4"); notes+=("$5")
    printf -- '-- %s: %s (exit %s, %s s)%s\n' "$1" "$2" "$3" "$4" "${5:+  $5}"
}

skip() {  # name reason
    wanted "$1" || return 0
    if ((list)); then printf '%-38s SKIPPED: %s\n' "$1" "$2"; return 0; fi
    record "$1" SKIPPED - - "$2"
}

elapsed() {  # seconds since $1 (an EPOCHREALTIME), one decimal
    awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'
}

# The log says the run failed although the script exited 0: the lab sweeps log a failed or stopped run
# and go on (scaling.py, locality_run.py), scale_test.py logs a failed distributed job.
FAILED_LINES='^# STOPPED by |failed \(attempt 2 of 2\)|^  [0-9]+ x 2 [a-z]+ +FAILED:'

# bench name limit-seconds [expect=TEXT] -- command...: run it, PASS on exit 0 (and, with expect, TEXT in its
# output), FAIL otherwise or when the log has one of FAILED_LINES.
bench() {
    local name=$1 limit=$2 expect=""
    shift 2
    if [[ $1 == expect=* ]]; then expect=${1#expect=}; shift; fi
    [[ $1 == -- ]] && shift
    wanted "$name" || return 0
    if ((list)); then printf '%-38s %s\n' "$name" "$*"; return 0; fi
    local log=$logs/${name//\//_}.log start code=0 state=PASS note=""
    printf '== %s: %s (limit %s s)\n' "$name" "$*" "$limit"
    start=$EPOCHREALTIME
    timeout -s INT -k 30 "$limit" "$@" >"$log" 2>&1 </dev/null || code=$?
    if ((code == 124 || code == 137)); then
        state=FAIL note="timed out after $limit s"
    elif ((code != 0)); then
        state=FAIL
    elif grep -Eq "$FAILED_LINES" "$log"; then
        state=FAIL note="exit 0, but the log reports a failed run: $(grep -Em1 "$FAILED_LINES" "$log" | cut -c1-120)"
    elif [[ -n $expect ]] && ! grep -qF -- "$expect" "$log"; then
        state=FAIL note="exit 0, but the output lacks \"$expect\""
    fi
    record "$name" "$state" "$code" "$(elapsed "$start")" "$note"
    if [[ $state == FAIL ]]; then
        echo "   last lines of $log:"
        tail -n 40 "$log" | sed 's/^/   | /'
    fi
}

# refuses name limit text -- command...: the command must exit non-zero and print TEXT (a script that says it
# needs what this machine lacks).
refuses() {
    local name=$1 limit=$2 text=$3
    shift 4
    wanted "$name" || return 0
    if ((list)); then printf '%-38s %s (must refuse: %s)\n' "$name" "$*" "$text"; return 0; fi
    local log=$logs/${name//\//_}.log start code=0 state=PASS note="refused as it should: $text"
    printf '== %s: %s (must refuse)\n' "$name" "$*"
    start=$EPOCHREALTIME
    timeout -s INT -k 30 "$limit" "$@" >"$log" 2>&1 </dev/null || code=$?
    if ((code == 0)) || ! grep -qF -- "$text" "$log"; then
        state=FAIL note="expected a non-zero exit and \"$text\""
    fi
    record "$name" "$state" "$code" "$(elapsed "$start")" "$note"
    if [[ $state == FAIL ]]; then tail -n 40 "$log" | sed 's/^/   | /'; fi
}

# until_ready name limit ready-text -- command...: a command that runs until Ctrl-C (lab.py): once its output
# shows ready-text it gets SIGINT and must exit 0 (having stopped its workers and deleted its lab).
until_ready() {
    local name=$1 limit=$2 ready=$3
    shift 4
    wanted "$name" || return 0
    if ((list)); then printf '%-38s %s (until "%s", then Ctrl-C)\n' "$name" "$*" "$ready"; return 0; fi
    local log=$logs/${name//\//_}.log start pid code=0 state=PASS note=""
    printf '== %s: %s (until ready, then SIGINT; limit %s s)\n' "$name" "$*" "$limit"
    start=$EPOCHREALTIME
    "$@" >"$log" 2>&1 </dev/null &
    pid=$!
    while kill -0 "$pid" 2>/dev/null && ! grep -qF -- "$ready" "$log"; do
        if (($(elapsed "$start" | cut -d. -f1) >= limit)); then
            note="not ready within $limit s"
            break
        fi
        sleep 1
    done
    kill -INT "$pid" 2>/dev/null || true
    local waited=0
    while kill -0 "$pid" 2>/dev/null && ((waited < 60)); do sleep 1; waited=$((waited + 1)); done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
        note="still running 60 s after SIGINT${note:+; $note}"
    fi
    wait "$pid" || code=$?
    if [[ -n $note ]] || ((code != 0)) || ! grep -qF -- "$ready" "$log"; then
        state=FAIL
    fi
    record "$name" "$state" "$code" "$(elapsed "$start")" "$note"
    if [[ $state == FAIL ]]; then tail -n 40 "$log" | sed 's/^/   | /'; fi
}

if ((!list)); then
    echo "# benchmarks/smoke.sh  $(date -u '+%Y-%m-%d %H:%M:%S UTC')  python $PY  $(nproc) cpus  load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# logs in $logs; results files in $BENCH_RESULTS_DIR (removed at the end)"
fi

B=benchmarks
LC=$B/lightning_comparison

# Loopback fleets (a Redis and real workers on this machine).
bench placement_scale 300 -- "$PY" $B/placement_scale.py --sizes 10,1000 --repeat 3
bench full_read_ab 300 -- "$PY" $B/full_read_ab.py --workers 100 --rounds 1
bench commands_per_job 300 -- "$PY" $B/commands_per_job.py --jobs 20
bench cpu_per_job 300 -- "$PY" $B/cpu_per_job.py --jobs 20 --rounds 1
if ((has_ray)); then
    bench throughput 400 expect="ray tasks" -- "$PY" $B/throughput.py --jobs 20 --rounds 1 --warmup-jobs 5 --shapes 1x1
else
    bench throughput 400 expect="# Ray side skipped" -- \
        "$PY" $B/throughput.py --jobs 20 --rounds 1 --warmup-jobs 5 --shapes 1x1
    skip "throughput (Ray side)" "no Ray in $PY: it lives in .venv-bench (make bench-ray); the gpulayer and plain Celery sides ran"
fi
bench objects 400 -- "$PY" $B/objects.py --size 16MB --jobs 2 --shards 4 --shard-size 4MB --rounds 1
bench startup 400 -- "$PY" $B/startup.py --runs 1
bench gang_placement 300 -- "$PY" $B/gang_placement.py --runs 1
bench failstop 300 -- "$PY" $B/failstop.py --runs 1
bench exit_time 300 -- "$PY" $B/exit_time.py --runs 1
bench cli_time 300 -- "$PY" $B/cli_time.py --runs 1
bench fsdp 300 -- "$PY" $B/fsdp.py --quick
bench slot_back 300 -- "$PY" $B/slot_back.py --kills 5
bench slow_among_tiny 300 -- "$PY" $B/slow_among_tiny.py --jobs 100 --rate 50 --every 50 --sleep 0.5 --shapes 1x2
bench output_flood 300 -- "$PY" $B/output_flood.py --jobs 100 --lines 2000 --rounds 1 --not-home
bench two_clusters 300 -- "$PY" $B/two_clusters.py --seconds 5
bench soak 400 -- "$PY" $B/soak.py --jobs 300 --workers 2 --slots 1 --kill-every 4 --stall 60
bench fleet_scale 400 -- "$PY" $B/fleet_scale.py --sizes 10 --processes 1 --steady 1 --submits 10 --jobs 20

# The Trainer against Lightning (fresh processes, no fleet).
if [[ -n $lightning_missing ]]; then
    skip lightning_comparison/bench "$lightning_missing"
    skip lightning_comparison/ab_revisions "$lightning_missing"
else
    bench lightning_comparison/bench 600 -- "$PY" $LC/bench.py --quick --out "$BENCH_RESULTS_DIR"
    bench lightning_comparison/ab_revisions 400 -- "$PY" $LC/ab_revisions.py --old . --new . --cases mlp --repeats 1
fi

# The GPU cases: rehearsed on CPU (gloo, --cuda off, tiny sizes) everywhere; on CUDA only with a GPU.
bench gpu/cases-plan 60 -- "$PY" $B/gpu/cases.py plan
bench gpu/cases-routing-rehearse 300 -- "$PY" $B/gpu/cases.py routing --rehearse --jobs 1 --out "$BENCH_RESULTS_DIR"
bench gpu/cases-nccl-rehearse 300 -- "$PY" $B/gpu/cases.py nccl --rehearse --runs 1 --out "$BENCH_RESULTS_DIR"
if [[ -n $lightning_missing ]]; then
    skip gpu/cases-trainer-rehearse "$lightning_missing"
else
    bench gpu/cases-trainer-rehearse 400 -- "$PY" $B/gpu/cases.py trainer --rehearse --out "$BENCH_RESULTS_DIR"
fi
if ((has_cuda)); then
    bench gpu/cases-routing 300 -- "$PY" $B/gpu/cases.py routing --jobs 1 --out "$BENCH_RESULTS_DIR"
    bench gpu/cases-nccl 300 -- "$PY" $B/gpu/cases.py nccl --runs 1 --out "$BENCH_RESULTS_DIR"
    bench gpu/cases-trainer 600 -- "$PY" $B/gpu/cases.py trainer --repeats 1 --out "$BENCH_RESULTS_DIR"
else
    refuses gpu/cases-nccl-no-gpu 120 "no CUDA GPU" -- "$PY" $B/gpu/cases.py nccl --runs 1 --out "$BENCH_RESULTS_DIR"
    for c in routing nccl trainer; do
        skip "gpu/cases-$c" "needs a CUDA GPU (torch.cuda.is_available() is False here); rehearsed on CPU above"
    done
fi

# Simulated machines: network namespaces (root, ip, tc).
netns_benches=(lab_network lab across_machines scale_test lightning_comparison/scaling
    lightning_comparison/locality_run lightning_comparison/allreduce_probe)
if [[ -n $netns_missing ]]; then
    for n in "${netns_benches[@]}"; do skip "$n" "$netns_missing"; done
else
    bench lab_network 300 -- "$PY" $B/lab_network.py --seconds 0.2 --runs 1
    until_ready lab 300 "Ctrl-C to stop" -- "$PY" $B/lab.py --topology "1r x 1z x 2m" --no-torch
    bench across_machines 600 -- "$PY" $B/across_machines.py --runs 1
    bench scale_test 600 -- "$PY" $B/scale_test.py --topology "1r x 2z x 2m" --tiny 20 --shards 4 --compare 10 \
        --rounds 1 --kill-jobs 6 --sweep 1 --dist-runs 1 --torch-machines 2
    if [[ -n $lightning_missing ]]; then
        skip lightning_comparison/scaling "$lightning_missing"
    else
        bench lightning_comparison/scaling 600 -- \
            "$PY" $LC/scaling.py --machines 2 --repeats 1 --warmup 0 --images 256
    fi
    bench lightning_comparison/locality_run 600 -- "$PY" $LC/locality_run.py --repeats 1 --warmup 0 --images 256
    bench lightning_comparison/allreduce_probe 600 -- \
        "$PY" $LC/allreduce_probe.py --sizes-mb 0.01 --iters 1 --rounds 1
fi
skip lightning_comparison/scaling_run \
    "not a benchmark of its own: the per-process job that scaling.py and locality_run.py run (both trainers)"

((list)) && exit 0

# -- summary ---------------------------------------------------------------------------------------------
failed=0 passed=0 skipped=0
echo
echo "summary ($(date -u '+%H:%M:%S UTC'); logs in $logs)"
printf '%-38s %-8s %5s %8s  %s\n' benchmark status exit seconds note
for i in "${!names[@]}"; do
    printf '%-38s %-8s %5s %8s  %s\n' "${names[i]}" "${states[i]}" "${codes[i]}" "${walls[i]}" "${notes[i]}"
    case ${states[i]} in
        PASS) passed=$((passed + 1)) ;;
        FAIL) failed=$((failed + 1)) ;;
        *) skipped=$((skipped + 1)) ;;
    esac
done
echo "$passed passed, $failed failed, $skipped skipped"
((failed == 0))
