#!/usr/bin/env bash
# A gpulayer cluster on Google Compute Engine for one benchmark run: a Redis VM and worker VMs in the
# zones you name, the benchmark run on the Redis VM against them, its logs copied back, everything deleted.
#
#   benchmarks/cloud/gcp.sh --project my-proj --redis-zone us-central1-a \
#       --workers "us-central1-a:4,us-central1-b:4,europe-west4-a:2" --machine-type e2-standard-4 \
#       --bench "python benchmarks/scale_test.py" --out results-gcp --tag gl-scale
#   benchmarks/cloud/gcp.sh --dry-run ...     # print every command, run none (needs no gcloud)
#   benchmarks/cloud/gcp.sh --cleanup TAG --project my-proj   # delete what a run left behind
#
# Every VM runs benchmarks/cloud/node.sh as its startup script (role, zone, region and settings come in
# its metadata). The Redis port is open only between the cluster's VMs (a firewall rule from the tag to
# the tag); workers reach Redis by its internal DNS name. Passwords are generated per run and travel in
# the VMs' metadata (readable by the VMs and by the project's viewers), never on a command line.
# Everything created carries the label gpulayer-tag=TAG; a trap deletes it on exit, error or Ctrl-C
# unless --keep. See benchmarks/cloud/README.md.
set -euo pipefail

# Builtins only up to the first gcloud call, so that --dry-run runs with no tools at all.
here=${BASH_SOURCE[0]%/*}
[[ $here != "${BASH_SOURCE[0]}" ]] || here=.
HERE=$(cd "$here" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

usage() {
    cat <<'EOF'
usage: gcp.sh --project P --bench CMD [options]
       gcp.sh --cleanup TAG --project P [--dry-run]

  --project P              Google Cloud project (required)
  --bench CMD              command run on the Redis VM, in the gpulayer source tree, against the cluster
                           (GPULAYER_BROKER_URL and GPULAYER_SECRET are set; gpulayer.init() connects)
  --workers SPEC           worker VMs per zone: "ZONE:N,ZONE:N" (default us-central1-a:2); region = zone
                           minus its last "-x"
  --redis-zone Z           zone of the Redis VM, where the benchmark runs (default us-central1-a)
  --machine-type T         workers' machine type (default e2-standard-4)
  --redis-machine-type T   the Redis VM's machine type (default e2-standard-4)
  --gpu-type T             attach GPUs of this type to every worker (e.g. nvidia-l4; pick a machine type
                           that takes it, e.g. g2-standard-8); installs the driver and torch's CUDA build
  --gpus-per-worker N      GPUs per worker (default 1 with --gpu-type, else 0)
  --slots N                job slots per worker (default: gpulayer's, GPUs else cores)
  --image-family F         boot image family (default debian-12; gpulayer needs Python >= 3.11)
  --image-project P        its project (default debian-cloud)
  --boot-disk-size S       (default 50GB)
  --network NET            VPC network (default "default")
  --torch SPEC             torch requirement (default torch==2.13.0)
  --torch-cuda-index URL   where the CUDA build comes from (default https://download.pytorch.org/whl/cu130)
  --git URL[@REF]          install gpulayer from this git URL (https) on every VM and clone it on the
                           Redis VM; default: a wheel built from this checkout, and its source, copied up
  --wheel PATH             copy up this gpulayer wheel instead of building one
  --bench-timeout S        seconds the benchmark may run (default 3600)
  --out DIR                where its logs go (default benchmarks/results/<date>-gcp-<tag>)
  --tag NAME               names and labels everything this run creates (default gl-MMDD-HHMM)
  --keep                   leave the VMs and the firewall rule running (then: --cleanup TAG)
  --dry-run                print every command instead of running it
  --cleanup TAG            delete the instances labelled gpulayer-tag=TAG and the rule TAG-internal
EOF
}

project="" bench="" workers_spec="us-central1-a:2" redis_zone="us-central1-a"
machine_type="e2-standard-4" redis_machine_type="e2-standard-4" gpu_type="" gpus_per_worker=""
slots="" image_family="debian-12" image_project="debian-cloud" disk_size="50GB" network="default"
torch_spec="torch==2.13.0" torch_cuda_index="https://download.pytorch.org/whl/cu130" git_url="" wheel=""
bench_timeout=3600 out="" tag="" keep=0 dry_run=0 cleanup=""

die() { echo "gcp.sh: $*" >&2; exit 2; }

while (($#)); do
    opt=$1
    case $opt in
        --keep) keep=1; shift; continue ;;
        --dry-run) dry_run=1; shift; continue ;;
        -h | --help) usage; exit 0 ;;
    esac
    (($# >= 2)) || die "$opt needs a value (see --help)"
    value=$2
    shift 2
    case $opt in
        --project) project=$value ;;
        --bench) bench=$value ;;
        --workers) workers_spec=$value ;;
        --redis-zone) redis_zone=$value ;;
        --machine-type) machine_type=$value ;;
        --redis-machine-type) redis_machine_type=$value ;;
        --gpu-type) gpu_type=$value ;;
        --gpus-per-worker) gpus_per_worker=$value ;;
        --slots) slots=$value ;;
        --image-family) image_family=$value ;;
        --image-project) image_project=$value ;;
        --boot-disk-size) disk_size=$value ;;
        --network) network=$value ;;
        --torch) torch_spec=$value ;;
        --torch-cuda-index) torch_cuda_index=$value ;;
        --git) git_url=$value ;;
        --wheel) wheel=$value ;;
        --bench-timeout) bench_timeout=$value ;;
        --out) out=$value ;;
        --tag) tag=$value ;;
        --cleanup) cleanup=$value ;;
        *) die "unknown option $opt (see --help)" ;;
    esac
done

# -- printing and running ----------------------------------------------------------------------------
quote() {  # an argument as a shell reads it back: bare when safe, else in single quotes
    if [[ $1 =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
        printf '%s' "$1"
    else
        printf "'%s'" "${1//\'/\'\\\'\'}"
    fi
}

show() {  # show CMD ARGS...: print the command as the log of this run has it
    local line="+" arg
    for arg in "$@"; do line+=" $(quote "$arg")"; done
    printf '%s\n' "$line"
}

run() {  # run CMD ARGS...: print it, and run it unless --dry-run
    show "$@"
    ((dry_run)) || "$@"
}

gc() {  # gc ARGS...: a gcloud call on this project, never prompting
    run gcloud "$@" --project="$project" --quiet
}

# -- checking what we were given ----------------------------------------------------------------------
[[ -n $project ]] || die "--project is required"
[[ $project =~ ^[a-z][a-z0-9-]{4,28}[a-z0-9]$ ]] || die "--project $project is not a project id"

zone_ok() { [[ $1 =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]]; }
region_of() { printf '%s' "${1%-*}"; }

cleanup_by_label() {  # cleanup_by_label TAG: delete whatever carries the tag (instances, then the rule)
    local t=$1 name zone listed
    show gcloud compute instances list --filter="labels.gpulayer-tag=$t" --format='value(name,zone.basename())' \
        --project="$project" --quiet
    if ((dry_run)); then
        echo "# (dry run: each instance listed is deleted with gcloud compute instances delete NAME --zone=ZONE)"
    else
        listed=$(gcloud compute instances list --filter="labels.gpulayer-tag=$t" \
            --format='value(name,zone.basename())' --project="$project" --quiet)
        while read -r name zone; do
            if [[ -n $name ]]; then gc compute instances delete "$name" --zone="$zone" || true; fi
        done <<<"$listed"
    fi
    show gcloud compute firewall-rules list --filter="name=$t-internal" --format='value(name)' \
        --project="$project" --quiet
    if ((dry_run)); then
        echo "# (dry run: the rule listed is deleted with gcloud compute firewall-rules delete $t-internal)"
    elif [[ -n $(gcloud compute firewall-rules list --filter="name=$t-internal" --format='value(name)' \
        --project="$project" --quiet) ]]; then
        gc compute firewall-rules delete "$t-internal" || true
    fi
}

if [[ -n $cleanup ]]; then
    cleanup_by_label "$cleanup"
    exit 0
fi

[[ -n $bench ]] || die "--bench is required: the command to run on the cluster (see --help)"
if [[ -z $tag ]]; then printf -v tag 'gl-%(%m%d-%H%M)T' -1; fi
[[ $tag =~ ^[a-z][a-z0-9-]{0,19}$ ]] \
    || die "--tag $tag: lowercase letters, digits and '-', starting with a letter, at most 20 characters"
zone_ok "$redis_zone" || die "--redis-zone $redis_zone is not a zone (e.g. us-central1-a)"
[[ -z $git_url || -z $wheel ]] || die "--git and --wheel exclude each other"
[[ -z $wheel || $wheel == *.whl && -f $wheel ]] || die "--wheel $wheel is not a wheel file"
[[ -z $git_url || $git_url == https://* ]] || die "--git takes an https:// URL (optionally URL@REF)"
for value in "$torch_spec" "$torch_cuda_index" "$git_url"; do  # they go in --metadata, which splits at commas
    [[ $value != *,* ]] || die "'$value' goes in the VMs' metadata, where a comma would split it; give it without one"
done
[[ $bench_timeout =~ ^[1-9][0-9]*$ ]] || die "--bench-timeout takes seconds"
[[ -z $slots || $slots =~ ^[1-9][0-9]*$ ]] || die "--slots takes a positive count"
if [[ -n $gpu_type ]]; then
    gpus_per_worker=${gpus_per_worker:-1}
    [[ $gpus_per_worker =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-worker takes a positive count"
else
    [[ ${gpus_per_worker:-0} == 0 ]] || die "--gpus-per-worker needs --gpu-type"
    gpus_per_worker=0
fi

# Worker VMs: TAG-ZONE-I, numbered per zone; one create call per zone.
zones=() total=0
declare -A count names
IFS=, read -r -a parts <<<"$workers_spec"
for part in "${parts[@]}"; do
    zone=${part%%:*} n=${part#*:}
    if ! [[ $part == *:* && $n =~ ^[1-9][0-9]*$ ]] || ! zone_ok "$zone"; then
        die "--workers: '$part' is not ZONE:COUNT (e.g. us-central1-a:4)"
    fi
    [[ -n ${count[$zone]-} ]] || { zones+=("$zone"); count[$zone]=0; }
    for ((i = count[$zone] + 1; i <= count[$zone] + n; i++)); do
        names[$zone]+="${names[$zone]:+ }$tag-$zone-$i"
    done
    count[$zone]=$((count[$zone] + n))
    total=$((total + n))
done
redis_vm=$tag-redis
# Workers reach Redis by the VM's internal DNS name (zonal DNS: NAME.ZONE.c.PROJECT.internal).
redis_host=$redis_vm.$redis_zone.c.$project.internal
out=${out:-$REPO/benchmarks/results/$(printf '%(%F)T' -1)-gcp-$tag}
work=${TMPDIR:-/tmp}/gpulayer-cloud-$tag  # secrets and the shipped wheel, 0700, removed at exit

# -- teardown: whatever this run created goes, on every exit, unless --keep ----------------------------
created_rule=0
created=()  # "zone name..." per create call, recorded before the call (a call cut short may leave VMs)
# shellcheck disable=SC2317  # called by the EXIT trap
teardown() {
    local rc=$? entry zone failed=0 order=()
    local -A by_zone=()
    trap '' INT TERM
    if ((keep)); then
        echo "# --keep: left running; delete with: $0 --cleanup $tag --project $project" >&2
    else
        for entry in "${created[@]}"; do  # one delete call per zone
            zone=${entry%% *}
            [[ -n ${by_zone[$zone]-} ]] || order+=("$zone")
            by_zone[$zone]+=" ${entry#* }"
        done
        for zone in "${order[@]}"; do
            read -r -a vm <<<"${by_zone[$zone]}"
            gc compute instances delete "${vm[@]}" --zone="$zone" || failed=1
        done
        if ((created_rule)); then gc compute firewall-rules delete "$tag-internal" || failed=1; fi
        if ((failed)); then cleanup_by_label "$tag"; fi  # a VM that never came, or one more that did
    fi
    run rm -rf "$work"
    exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# -- the secrets and what gets shipped ----------------------------------------------------------------
project_version() {  # pyproject.toml's version, read with builtins
    local line
    while IFS= read -r line; do
        if [[ $line =~ ^version\ =\ \"([^\"]+)\" ]]; then printf '%s' "${BASH_REMATCH[1]}"; return; fi
    done <"$REPO/pyproject.toml"
    die "no version in $REPO/pyproject.toml"
}

run mkdir -m 700 "$work"
if ((dry_run)); then
    echo "# writes $work/cluster.env (REDIS_PASSWORD, GPULAYER_SECRET: fresh random values; mode 0600)"
else
    (umask 077 && printf 'REDIS_PASSWORD=%s\nGPULAYER_SECRET=%s\n' "$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')" \
        "$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')" >"$work/cluster.env")
fi
if [[ -n $git_url ]]; then
    source_meta="git+$git_url"
    wheel_meta=()
else
    source_meta=wheel
    if [[ -z $wheel ]]; then
        run python3 -m pip wheel -q --no-deps -w "$work/dist" "$REPO"
        wheel=$work/dist/gpulayer-$(project_version)-py3-none-any.whl
    fi
    run git -C "$REPO" archive --format=tar.gz -o "$work/src.tar.gz" HEAD
    show sha256sum "$wheel"
    if ((dry_run)); then sha="<sha256 of ${wheel##*/}>"; else read -r sha _ < <(sha256sum "$wheel"); fi
    wheel_meta=("gpulayer-wheel=${wheel##*/}" "gpulayer-wheel-sha256=$sha")
fi

metadata() {  # metadata ROLE ZONE GPUS: the --metadata value of a VM
    local m=(
        "gpulayer-role=$1" "gpulayer-zone=$2" "gpulayer-region=$(region_of "$2")" "gpulayer-gpus=$3"
        "gpulayer-broker-host=$redis_host" "gpulayer-source=$source_meta" "gpulayer-torch=$torch_spec"
        "gpulayer-torch-cuda-index=$torch_cuda_index" "${wheel_meta[@]}"
    )
    [[ -z $slots ]] || m+=("gpulayer-slots=$slots")
    local IFS=,
    printf '%s' "${m[*]}"
}

# -- the cluster ----------------------------------------------------------------------------------------
created_rule=1
gc compute firewall-rules create "$tag-internal" --network="$network" --direction=INGRESS \
    --allow=tcp,udp,icmp --source-tags="$tag" --target-tags="$tag" \
    --description="gpulayer-tag=$tag: Redis, the wheel and rank traffic between the VMs of this cluster only"

vm_flags=(--image-family="$image_family" --image-project="$image_project" --boot-disk-size="$disk_size"
    --network="$network" --tags="$tag"
    --metadata-from-file="startup-script=$HERE/node.sh,gpulayer-env=$work/cluster.env")
created+=("$redis_zone $redis_vm")
gc compute instances create "$redis_vm" --zone="$redis_zone" --machine-type="$redis_machine_type" "${vm_flags[@]}" \
    --labels="gpulayer-tag=$tag,gpulayer-role=redis" --metadata="$(metadata redis "$redis_zone" 0)"

gpu_flags=()
if ((gpus_per_worker)); then
    gpu_flags=(--accelerator="type=$gpu_type,count=$gpus_per_worker" --maintenance-policy=TERMINATE)
fi
for zone in "${zones[@]}"; do
    read -r -a vms <<<"${names[$zone]}"
    created+=("$zone ${vms[*]}")
    gc compute instances create "${vms[@]}" --zone="$zone" --machine-type="$machine_type" "${vm_flags[@]}" \
        "${gpu_flags[@]}" --labels="gpulayer-tag=$tag,gpulayer-role=worker" \
        --metadata="$(metadata worker "$zone" "$gpus_per_worker")"
done

ssh_redis() {  # ssh_redis COMMAND: on the Redis VM
    gc compute ssh "$redis_vm" --zone="$redis_zone" --strict-host-key-checking=no \
        --ssh-flag=-oServerAliveInterval=30 --command="$1"
}

echo "# waiting for $redis_vm to finish its startup script"
for ((try = 1; ; try++)); do
    if ssh_redis "test -e /var/lib/gpulayer/ready"; then break; fi
    ((try < 60)) || die "$redis_vm did not get ready in 30 minutes (see its serial port: gcloud compute \
instances get-serial-port-output $redis_vm --zone=$redis_zone)"
    sleep 30
done

if [[ -z $git_url ]]; then
    gc compute scp "$wheel" "$work/src.tar.gz" "$redis_vm:/tmp/" --zone="$redis_zone" --strict-host-key-checking=no
    ssh_redis "sudo gpulayer-node install /tmp/${wheel##*/} /tmp/src.tar.gz"
fi

bench_rc=0
ssh_redis "sudo gpulayer-node bench $total $bench_timeout $(quote "$bench")" || bench_rc=$?

run mkdir -p "$out"
gc compute scp "$redis_vm:/tmp/gpulayer-results.tgz" "$out/" --zone="$redis_zone" --strict-host-key-checking=no
run tar -xzf "$out/gpulayer-results.tgz" -C "$out"
run rm -f "$out/gpulayer-results.tgz"
echo "# benchmark exit status $bench_rc; logs in $out"
exit "$bench_rc"
