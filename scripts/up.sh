#!/usr/bin/env bash
# `docker compose up -d`, detecting GPU_PROFILE first when it is unset, empty or "auto".
#
#   scripts/up.sh                                  # the profile's layout (compose/engines/)
#   scripts/up.sh -f docker-compose.yml -f compose/monitoring.yml   # any -f / compose options
#   ENGINES_PER_GPU=1 scripts/up.sh                # one engine per GPU whatever the profile says
#
# Detection runs `ocrvl profile detect` (on PATH, or the repo's .venv) and uses the profile file
# it prints; without ocrvl, set GPU_PROFILE in .env to a name from vllm_configs/ yourself.
# Engines per GPU need nothing here: docker-compose.yml includes compose/engines/$GPU_PROFILE.yml,
# whose default is the profile header's "Engines per GPU" (2 under MPS on an H200, where it was
# measured fastest; 1 elsewhere), and ENGINES_PER_GPU (environment, else .env) overrides it.
# This script checks ENGINES_PER_GPU and GPUS and says which layout starts.
set -euo pipefail

cd "$(dirname "$0")/.."

from_env_file() {
    [ -f .env ] && sed -n "s/^$1=//p" .env | tail -n 1
    return 0
}

profile="${GPU_PROFILE:-}"
if [ -z "$profile" ]; then
    profile="$(from_env_file GPU_PROFILE)"
fi
if [ -z "$profile" ] || [ "$profile" = auto ]; then
    if command -v ocrvl >/dev/null; then
        ocrvl=ocrvl
    elif [ -x .venv/bin/ocrvl ]; then
        ocrvl=.venv/bin/ocrvl
    else
        echo "GPU_PROFILE is not set and ocrvl is not installed to detect it: set GPU_PROFILE in .env" \
            "to one of: $(cd vllm_configs && ls -- *.yaml | sed 's/\.yaml$//' | tr '\n' ' ')" >&2
        exit 2
    fi
    path="$("$ocrvl" profile detect | tail -n 1)"
    profile="$(basename "$path" .yaml)"
    echo "GPU_PROFILE=$profile (detected by ocrvl profile detect: $path)" >&2
fi
[ -f "vllm_configs/$profile.yaml" ] || {
    echo "GPU_PROFILE=$profile: no vllm_configs/$profile.yaml" >&2
    exit 2
}

engines="${ENGINES_PER_GPU-$(from_env_file ENGINES_PER_GPU)}"
gpus="${GPUS-$(from_env_file GPUS)}"
gpus="${gpus:-1}"
header="$(sed -n 's/^# Engines per GPU: \([0-9][0-9]*\), *\([a-z]*\).*/\1 \2/p' \
    "vllm_configs/$profile.yaml" | head -n 1)"
default="${header%% *}"
case "$engines" in
    "") engines="${default:-1}" why="the profile's default${header:+, ${header#* }}" ;;
    1 | 2) why="ENGINES_PER_GPU" ;;
    *)
        echo "ENGINES_PER_GPU must be 1 or 2 (two engines per GPU under MPS); got $engines" >&2
        exit 2
        ;;
esac
[[ "$gpus" =~ ^[1-9][0-9]*$ ]] || { echo "GPUS must be 1 or more; got $gpus" >&2; exit 2; }
if [ "$profile" = cpu ]; then
    echo "GPU_PROFILE=cpu: one engine and the layout service on the CPU" >&2
else
    layout="compose/layouts/gpus-$gpus-engines-$engines.yml"
    if [ ! -f "$layout" ]; then
        echo "no $layout: write it with" \
            "\`python3 scripts/compose_gpus.py $gpus --engines-per-gpu $engines > $layout\`" >&2
        exit 2
    fi
    what="1 engine per GPU"
    [ "$engines" = 1 ] || what="$engines engines under MPS per GPU"
    plural=""
    [ "$gpus" = 1 ] || plural=s
    echo "GPU_PROFILE=$profile: $what on $gpus GPU$plural ($why; $layout)" >&2
fi
GPU_PROFILE="$profile" exec docker compose "$@" up -d
