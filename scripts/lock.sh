#!/usr/bin/env bash
# `make lock`: the pinned, hashed locks in locks/ from pyproject.toml's ranges, by uv.
#
#   scripts/lock.sh                            refresh: keep each pin that still fits pyproject.toml
#   scripts/lock.sh --upgrade-package fastapi  bump fastapi (and whatever it then needs) only
#   scripts/lock.sh --upgrade                  every pin to the newest release the ranges allow
#
#   locks/gateway.txt  [project] dependencies: what the image, the wheelhouse and the gateway
#                      venv install (pip --require-hashes)
#   locks/build.txt    [build-system] requires: setuptools, to build the project with no network
#   locks/dev.txt      the gateway venv's test and lint tools (dev group) and the bench extra,
#                      constrained by locks/gateway.txt: installing them never moves a runtime pin
#
# Universal (`--universal`): one file for every Python >= 3.11 and platform, with markers (redis
# needs async-timeout below 3.11.3, the stand-in image's Debian Python is 3.11.2). uv prefers the
# pins already in each output file, so a refresh moves nothing that still fits. UV names the uv
# binary; by default the gateway venv's, else one on PATH, else one installed into a temporary
# venv.
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-}
if [ -z "$uv" ] && [ -x .venv-gateway/bin/uv ]; then uv=.venv-gateway/bin/uv; fi
if [ -z "$uv" ]; then uv=$(command -v uv || true); fi
if [ -z "$uv" ]; then
    tools=$(mktemp -d)
    trap 'rm -rf "$tools"' EXIT
    python3 -m venv "$tools"
    "$tools/bin/pip" install --quiet --disable-pip-version-check uv
    uv=$tools/bin/uv
fi
mkdir -p locks
common=(--universal --python-version 3.11 --generate-hashes --quiet
        --custom-compile-command "make lock")
"$uv" pip compile "${common[@]}" "$@" pyproject.toml -o locks/gateway.txt
python3 -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' \
    | "$uv" pip compile "${common[@]}" "$@" - -o locks/build.txt
"$uv" pip compile "${common[@]}" "$@" pyproject.toml --extra bench --group dev \
    -c locks/gateway.txt -o locks/dev.txt
