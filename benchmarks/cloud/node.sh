#!/usr/bin/env bash
# One machine of a gcp.sh cluster. GCE runs this file as the startup script of every VM it creates, at
# every boot, as root: it reads its role and settings from the instance's metadata and makes the machine
# that (idempotent: a reboot, e.g. the GPU driver installer's, runs it again and it carries on).
#
#   role redis:  Redis (password, append-only, reachable on the cluster's firewall rule only), a Python
#                environment with gpulayer and its benchmarks (the benchmark runs here), and the gpulayer
#                wheel served to the workers on port 8000.
#   role worker: a Python environment with torch (the CUDA build when the VM has GPUs) and gpulayer, and
#                `gpulayer worker --zone Z --region R` under systemd.
#
# It also installs itself as /usr/local/sbin/gpulayer-node, which gcp.sh calls over ssh:
#   gpulayer-node install WHEEL SRC_TARBALL   put the shipped wheel and source in place (redis VM)
#   gpulayer-node bench WORKERS TIMEOUT CMD   wait for WORKERS live workers, run CMD, pack its logs
set -euo pipefail

STATE=/var/lib/gpulayer
VENV=/opt/gpulayer/venv
SRC=/opt/gpulayer/src
DIST=$STATE/dist
ENV_FILE=/etc/gpulayer/cluster.env
RESULTS_TGZ=/tmp/gpulayer-results.tgz

log() { echo "gpulayer-node: $*" >&2; }

meta() {  # meta KEY [DEFAULT]: an instance attribute, or DEFAULT when it is not set
    local value
    if value=$(curl -fsS -H 'Metadata-Flavor: Google' \
        "http://metadata.google.internal/computeMetadata/v1/instance/attributes/$1" 2>/dev/null); then
        printf '%s' "$value"
    else
        printf '%s' "${2-}"
    fi
}

internal_ip() {
    curl -fsS -H 'Metadata-Flavor: Google' \
        http://metadata.google.internal/computeMetadata/v1/instance/network-interfaces/0/ip
}

apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}

secrets() {  # /etc/gpulayer/cluster.env: REDIS_PASSWORD and GPULAYER_SECRET, root only
    install -d -m 700 /etc/gpulayer
    (umask 077 && meta gpulayer-env >"$ENV_FILE.new" && mv "$ENV_FILE.new" "$ENV_FILE")
    # shellcheck disable=SC1090
    . "$ENV_FILE"
    : "${REDIS_PASSWORD:?gpulayer-env has no REDIS_PASSWORD}" "${GPULAYER_SECRET:?gpulayer-env has no GPULAYER_SECRET}"
}

python_env() {  # the venv with torch: the CUDA build on a VM with GPUs
    [[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
    local index
    if [[ $(meta gpulayer-gpus 0) != 0 ]]; then
        index=$(meta gpulayer-torch-cuda-index https://download.pytorch.org/whl/cu130)
    else
        index=https://download.pytorch.org/whl/cpu
    fi
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q --index-url "$index" "$(meta gpulayer-torch torch==2.13.0)"
}

gpu_driver() {  # Google's installer; it reboots the VM once, and this script then runs again
    command -v nvidia-smi >/dev/null && nvidia-smi >/dev/null && return 0
    log "installing the NVIDIA driver (the VM reboots once)"
    curl -fsSL -o /opt/gpulayer/cuda_installer.pyz \
        https://storage.googleapis.com/compute-gpu-installation-us/installer/latest/cuda_installer.pyz
    python3 /opt/gpulayer/cuda_installer.pyz install_driver
    nvidia-smi >/dev/null  # reached only when the installer did not reboot
}

install_gpulayer() {  # install_gpulayer WHEEL_OR_GIT_URL [EXTRAS]
    local what=$1 extras=${2-}
    if [[ $what == git+* ]]; then
        "$VENV/bin/pip" install -q "gpulayer${extras} @ $what"
    else
        "$VENV/bin/pip" install -q --force-reinstall --no-deps "$what"
        "$VENV/bin/pip" install -q "$what$extras"
    fi
}

fetch_wheel() {  # from the redis VM, checked against the sha256 gcp.sh put in the metadata
    local host=$1 name sha
    name=$(meta gpulayer-wheel)
    sha=$(meta gpulayer-wheel-sha256)
    install -d "$DIST"
    log "waiting for http://$host:8000/$name"
    until curl -fsS -o "$DIST/$name" "http://$host:8000/$name" \
        && echo "$sha  $DIST/$name" | sha256sum -c --status; do
        sleep 5
    done
    printf '%s' "$DIST/$name"
}

service_user() {  # the unprivileged user the worker and the benchmark run as
    id -u gpulayer >/dev/null 2>&1 || useradd --system --create-home --home-dir "$STATE/home" gpulayer
}

redis_server() {
    apt_install redis-server python3-venv curl
    # Later directives win: this file, included last, opens Redis to the cluster with a password.
    (umask 077 && printf 'bind 0.0.0.0\nprotected-mode yes\nrequirepass %s\nappendonly yes\nappendfsync everysec\n' \
        "$REDIS_PASSWORD" >/etc/redis/gpulayer.conf)
    chown redis:redis /etc/redis/gpulayer.conf
    grep -qx 'include /etc/redis/gpulayer.conf' /etc/redis/redis.conf \
        || echo 'include /etc/redis/gpulayer.conf' >>/etc/redis/redis.conf
    systemctl restart redis-server
    install -d "$DIST"
    cat >/etc/systemd/system/gpulayer-dist.service <<EOF
[Unit]
Description=gpulayer wheel for the cluster's workers
After=network-online.target
[Service]
ExecStart=/usr/bin/python3 -m http.server 8000 --bind 0.0.0.0 --directory $DIST
DynamicUser=yes
Restart=always
[Install]
WantedBy=multi-user.target
EOF
    systemctl daemon-reload
    systemctl enable --now gpulayer-dist.service
}

role_redis() {
    redis_server
    service_user
    python_env
    local source
    source=$(meta gpulayer-source)
    if [[ $source == git+* ]]; then  # else gcp.sh ships the wheel and the source (gpulayer-node install)
        apt_install git
        install_gpulayer "$source" "[bench]"
        local url=${source#git+} ref=
        if [[ $url == *@* && ${url##*@} != */* ]]; then ref=${url##*@}; url=${url%@*}; fi  # URL@REF
        [[ -d $SRC/.git ]] || git clone -q "$url" "$SRC"
        [[ -z $ref ]] || git -C "$SRC" checkout -q "$ref"
        chown -R gpulayer "$SRC"
    fi
    touch "$STATE/ready"
}

role_worker() {
    apt_install python3-venv curl
    local gpus zone region host cuda slots=()
    gpus=$(meta gpulayer-gpus 0)
    [[ $gpus == 0 ]] || gpu_driver
    python_env
    host=$(meta gpulayer-broker-host)
    local source
    source=$(meta gpulayer-source)
    [[ $source == git+* ]] || source=$(fetch_wheel "$host")
    install_gpulayer "$source"
    zone=$(meta gpulayer-zone)
    region=$(meta gpulayer-region)
    cuda=$([[ $gpus == 0 ]] && echo off || echo on)
    [[ -z $(meta gpulayer-slots) ]] || slots=(--slots "$(meta gpulayer-slots)")
    service_user
    (umask 077 && printf 'GPULAYER_BROKER_URL=redis://:%s@%s:6379/0\nGPULAYER_SECRET=%s\n' \
        "$REDIS_PASSWORD" "$host" "$GPULAYER_SECRET" >/etc/gpulayer/worker.env)
    cat >/etc/systemd/system/gpulayer-worker.service <<EOF
[Unit]
Description=gpulayer worker
After=network-online.target
Wants=network-online.target
[Service]
User=gpulayer
EnvironmentFile=/etc/gpulayer/worker.env
ExecStart=$VENV/bin/gpulayer worker --name $(hostname -s) --zone $zone --region $region --cuda $cuda --advertise-addr $(internal_ip) ${slots[*]}
Restart=on-failure
RestartSec=2
TimeoutStopSec=30
[Install]
WantedBy=multi-user.target
EOF
    systemctl daemon-reload
    systemctl enable gpulayer-worker.service
    systemctl restart gpulayer-worker.service
    touch "$STATE/ready"
}

# -- commands gcp.sh runs over ssh ------------------------------------------------------------------
cmd_install() {  # cmd_install WHEEL SRC_TARBALL: the shipped wheel, served to the workers, and the source
    local wheel=$1 tarball=$2
    install_gpulayer "$wheel" "[bench]"
    install -m 644 "$wheel" "$DIST/"
    rm -rf "$SRC" && install -d "$SRC" && tar -xzf "$tarball" -C "$SRC"
    chown -R gpulayer "$SRC"
}

cmd_bench() {  # cmd_bench WORKERS TIMEOUT CMD: as the gpulayer user, in the source tree, with the cluster's env
    local workers=$1 timeout=$2 cmd=$3 rc=0
    # shellcheck disable=SC1090
    . "$ENV_FILE"
    local url="redis://:$REDIS_PASSWORD@127.0.0.1:6379/0" out=$STATE/run
    rm -rf "$out" && install -d -o gpulayer "$out"
    touch "$out/.start" "$out/status-before.txt"
    local script
    # The URL and secret go by environment (never on a command line, where ps shows them).
    script=$(printf 'cd %q && %q -c %q && %q status --all >%q 2>&1; %s' "$SRC" "$VENV/bin/python" \
        "import gpulayer; gpulayer.init(); gpulayer.wait_for_workers($workers, timeout=1800)" "$VENV/bin/gpulayer" \
        "$out/status-before.txt" "$cmd")
    # shellcheck disable=SC2024  # the log is root's to write; the benchmark only writes to stdout
    sudo -u gpulayer env GPULAYER_BROKER_URL="$url" GPULAYER_SECRET="$GPULAYER_SECRET" PATH="$VENV/bin:$PATH" \
        PYTHONUNBUFFERED=1 timeout "$timeout" bash -c "$script" >"$out/bench.log" 2>&1 || rc=$?
    log "benchmark exited with $rc (log: $out/bench.log)"
    echo "$rc" >"$out/exit-status"
    # What the benchmark wrote under benchmarks/results/, and its output, go back to gcp.sh.
    (cd "$SRC" && find benchmarks/results -newer "$out/.start" -type f 2>/dev/null) >"$out/results.list" || true
    tar -czf "$RESULTS_TGZ" -C "$out" bench.log exit-status status-before.txt -C "$SRC" -T "$out/results.list"
    chmod 644 "$RESULTS_TGZ"
    return "$rc"
}

main() {
    if [[ ${1-} == install || ${1-} == bench ]]; then
        local cmd=$1
        shift
        "cmd_$cmd" "$@"
        return
    fi
    install -d "$STATE" /opt/gpulayer
    install -m 755 "$0" /usr/local/sbin/gpulayer-node
    secrets
    case $(meta gpulayer-role) in
        redis) role_redis ;;
        worker) role_worker ;;
        *) log "no gpulayer-role in the metadata"; exit 1 ;;
    esac
    log "ready"
}

main "$@"
