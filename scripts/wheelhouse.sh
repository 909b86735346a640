#!/usr/bin/env bash
# Fill wheelhouse/ with wheels of the gateway's runtime dependencies (pyproject.toml's
# `dependencies`) and its build backend, for `docker build --build-arg PIP_NO_INDEX=1`: a build
# that reaches no package index (a TLS-intercepting proxy, an offline engine).
#
#   scripts/wheelhouse.sh [PYTHON]
#
# PYTHON (default python3) must be the image's CPython version down to the patch level when a
# dependency has markers such as `python_full_version < "3.11.3"` (redis does): the wheels are
# resolved in a throwaway venv of that interpreter, through whatever index and proxy pip uses
# on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-${PYTHON:-python3}}
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
"$python" -m venv "$venv"
rm -f wheelhouse/*.whl
"$venv/bin/pip" wheel --quiet --disable-pip-version-check --wheel-dir wheelhouse .
requires=$("$venv/bin/python" -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"])')
# shellcheck disable=SC2086
"$venv/bin/pip" download --quiet --disable-pip-version-check --only-binary :all: \
    --dest wheelhouse $requires
rm -f wheelhouse/paddleocr_vl_server-*.whl  # the image builds the project from its sources
