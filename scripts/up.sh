#!/usr/bin/env bash
# `docker compose up -d`, detecting GPU_PROFILE first when it is unset, empty or "auto".
#
#   scripts/up.sh                                            # base file, one GPU
#   scripts/up.sh -f docker-compose.yml -f compose/gpus-2.yml  # any -f / compose options
#   ENGINES_PER_GPU=2 scripts/up.sh                          # two engines under MPS (compose/mps.yml)
#
# Detection runs `ocrvl profile detect` (on PATH, or the repo's .venv) and uses the profile file
# it prints; without ocrvl, set GPU_PROFILE in .env to a name from vllm_configs/ yourself.
# ENGINES_PER_GPU (environment, else .env; default 1) is never switched on by detection: when
# the profile's class should run two engines (its header says so) and ENGINES_PER_GPU is 1, a
# note says how to switch. docs/deploy.md says why it is not automatic.
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

engines="${ENGINES_PER_GPU:-}"
if [ -z "$engines" ]; then
    engines="$(from_env_file ENGINES_PER_GPU)"
fi
engines="${engines:-1}"
recommended="$(sed -n 's/^# Engines per GPU: \([0-9][0-9]*\),.*/\1/p' "vllm_configs/$profile.yaml" \
    2>/dev/null | head -n 1)"
own_files=no
for argument in "$@"; do
    case "$argument" in
        -f | -f* | --file | --file=*) own_files=yes ;;
    esac
done
case "$engines" in
    1)
        if [ "${recommended:-1}" -gt 1 ]; then
            echo "note: vllm_configs/$profile.yaml says its class should run $recommended engines" \
                "per GPU under NVIDIA MPS; set ENGINES_PER_GPU=2 in .env to run them (docs/deploy.md)" >&2
        fi
        ;;
    2)
        if [ "$own_files" = no ] && [ -z "${COMPOSE_FILE:-$(from_env_file COMPOSE_FILE)}" ]; then
            set -- -f docker-compose.yml -f compose/mps.yml "$@"
            echo "ENGINES_PER_GPU=2: two engines on the GPU under MPS (compose/mps.yml)" >&2
        else
            echo "ENGINES_PER_GPU=2 with your own compose files: they are used as given (add" \
                "compose/mps.yml, or scripts/compose_gpus.py N --engines-per-gpu 2's output)" >&2
        fi
        ;;
    *)
        echo "ENGINES_PER_GPU must be 1 or 2 (two engines per GPU under MPS); got $engines" >&2
        exit 2
        ;;
esac
GPU_PROFILE="$profile" exec docker compose "$@" up -d
