#!/usr/bin/env bash
# tests/test_route_labels.py under the newest FastAPI and Starlette the resolver finds: the
# locked runtime set (locks/gateway.txt), pytest and hypothesis (tests/conftest.py loads its
# profile) in a throwaway venv, then those two upgraded. `make test` runs it (`make test-latest`)
# beside the in-process tier, so a release that would change a route label is a known diff before
# the lock moves to it (docs/development.md).
#
#   scripts/latest.sh [GATEWAY_VENV]     (default .venv-gateway: its Python and its uv)
set -euo pipefail
cd "$(dirname "$0")/.."
gateway=${1:-.venv-gateway}
uv=$gateway/bin/uv
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
"$uv" venv --quiet --python "$gateway/bin/python" "$venv"
export VIRTUAL_ENV=$venv
"$uv" pip install --quiet -r locks/gateway.txt pytest pytest-timeout hypothesis -c locks/dev.txt
"$uv" pip install --quiet --upgrade fastapi starlette
"$venv/bin/python" -c 'import fastapi, starlette
print(f"scripts/latest.sh: FastAPI {fastapi.__version__}, Starlette {starlette.__version__}")'
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_route_labels.py
