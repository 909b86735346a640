#!/usr/bin/env bash
# Fill wheelhouse/ with the wheels of locks/gateway.txt (the gateway's runtime pins) and
# locks/build.txt (its build backend), hashes checked, for `docker build --build-arg
# PIP_NO_INDEX=1`: a build that reaches no package index (a TLS-intercepting proxy, an offline
# engine). The image installs exactly these pins, so the wheels are exactly these.
#
#   scripts/wheelhouse.sh [PYTHON]
#
# PYTHON (default python3) must be the image's CPython version down to the patch level: the
# lock's markers choose per interpreter (redis needs async-timeout below 3.11.3), and pip
# evaluates them for the throwaway venv of that interpreter the wheels are fetched in, through
# whatever index and proxy pip uses on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-${PYTHON:-python3}}
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
"$python" -m venv "$venv"
rm -f wheelhouse/*.whl
"$venv/bin/pip" download --quiet --disable-pip-version-check --only-binary :all: \
    --require-hashes --dest wheelhouse -r locks/gateway.txt -r locks/build.txt
