#!/usr/bin/env bash
# `docker compose up -d`, detecting GPU_PROFILE first when it is unset, empty or "auto".
#
#   scripts/up.sh                                            # base file, one GPU
#   scripts/up.sh -f docker-compose.yml -f compose/gpus-2.yml  # any -f / compose options
#
# Detection runs `ocrvl profile detect` (on PATH, or the repo's .venv) and uses the profile file
# it prints; without ocrvl, set GPU_PROFILE in .env to a name from vllm_configs/ yourself.
set -euo pipefail

cd "$(dirname "$0")/.."
profile="${GPU_PROFILE:-}"
if [ -z "$profile" ] && [ -f .env ]; then
    profile="$(sed -n 's/^GPU_PROFILE=//p' .env | tail -n 1)"
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
GPU_PROFILE="$profile" exec docker compose "$@" up -d
