#!/usr/bin/env bash
# Load-test nginx -> gateway -> vLLM with hey, sending the body PaddleOCR's client sends for a page.
#
#   KEY=sk-... scripts/hey.sh                      # or: make hey KEY=sk-...
#   URL=http://127.0.0.1:28118 KEY=sk-... N=200 C=20 MAX_TOKENS=4096 scripts/hey.sh
#
# URL    nginx's base URL (default http://127.0.0.1:28118); requests go to $URL/chat/completions
# KEY    a client API key (one of OCRVL_API_KEYS); required
# N, C   number of requests and of concurrent workers (default 200 and 20)
# MODEL, MAX_TOKENS, TIMEOUT   model name sent, max_completion_tokens, seconds per request
# BODY   where the request body is written (default .cache/hey/request.json)
# PYTHON an interpreter with Pillow (default .venv/bin/python, else python3)
# Prints hey's summary; its "Status code distribution" shows 200s, and 429s when nginx throttled.
set -euo pipefail

cd "$(dirname "$0")/.."
: "${KEY:?set KEY to a client API key (one of OCRVL_API_KEYS)}"
URL="${URL:-http://127.0.0.1:28118}"
N="${N:-200}"
C="${C:-20}"
MODEL="${MODEL:-PaddleOCR-VL-1.5-0.9B}"
MAX_TOKENS="${MAX_TOKENS:-4096}"
TIMEOUT="${TIMEOUT:-600}"
BODY="${BODY:-.cache/hey/request.json}"
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3

command -v hey >/dev/null || { echo "hey is not installed (Debian/Ubuntu: apt-get install hey)" >&2; exit 2; }
"$PYTHON" -m bench.hey_body --out "$BODY" --model "$MODEL" --max-tokens "$MAX_TOKENS"
exec hey -n "$N" -c "$C" -t "$TIMEOUT" -m POST -D "$BODY" -T application/json \
    -H "Authorization: Bearer $KEY" "${URL%/}/chat/completions"
