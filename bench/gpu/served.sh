#!/usr/bin/env bash
# The GPU host's side of a floor pass (bench.gpu.floor + bench.gpu.served): the floor of a page
# and the layouts as `scripts/serve.sh` starts them, in the calls the device tool allows. From
# the checkout root there, after the wheel parts arrived (bench/gpu/session.sh receive K, carrying
# .gpu-wheels-032/chunkK and .gpu-wheels-032/scripts, one call each):
#
#   bash bench/gpu/served.sh install        # vLLM 0.32 + gateway wheels (.whl), checkpoint, corpus
#   bash bench/gpu/served.sh floor          # python -m bench.gpu.floor (the host's own torch)
#   bash bench/gpu/served.sh run PLAN       # python3 -m bench.gpu.served run --plan PLAN
#   bash bench/gpu/served.sh merge STEM     # layouts A,B against the floor into $OUT/STEM.*
#
# Stages chain in one call: `bash bench/gpu/served.sh floor run A:sweep,B:sweep,B:hey,A:hey merge
# gpu-h200-DATE-floor` (a stage that takes an argument is followed by it). LEVELS, DURATION,
# HEY_S, CORPUS, RUN_LIMIT tune `run`; FLOOR_ARGS=--profile adds the floor's kernel tables. What the call measured goes back as few files ($OUT holds
# at most 8): the merged report, floor.json and raw.tar.gz (every result, serve.sh and engine log).
set -uo pipefail
export GPU_BENCH_DIR=/tmp/gpu-bench GPU_RESULTS_DIR=/tmp/gpu-results GPU_VLLM_VERSION=0.32.0
export WHEELS=${WHEELS:-.gpu-wheels-032} PYTHONUNBUFFERED=1
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out" "$GPU_BENCH_DIR" "$GPU_RESULTS_DIR"

collect() {
  cp "$GPU_RESULTS_DIR/floor.json" "$out/" 2>/dev/null
  tar -czf "$out/raw.tar.gz" -C /tmp gpu-results $(cd /tmp && ls -d gpu-bench/serve-* \
    gpu-bench/*.csv gpu-bench/*.log 2>/dev/null) 2>/dev/null
  return 0
}
trap collect EXIT

host_env() {  # vLLM 0.32 from /tmp/site032; `vllm` as a user has it; hey from the carried tools
  . "$WHEELS/scripts/env.sh"
  mkdir -p /tmp/bin
  printf '#!/bin/sh\nexec python3 -m vllm.entrypoints.cli.main "$@"\n' > /tmp/bin/vllm
  chmod +x /tmp/bin/vllm
  export PATH=/tmp/bin:$PATH VLLM_BIN=/tmp/bin/vllm OCRVL_BENCH_HEY=$PWD/.gpu-tools/hey
}

while [ $# -gt 0 ]; do
  stage=$1; shift
  echo "=== $stage $(date -u +%T)"
  case $stage in
  install)
    OUT=/tmp/session-out bash bench/gpu/session.sh install || exit 1  # its own collect stays there
    host_env
    python3 -c "from app.bench.corpus import synthetic; print(len(synthetic(${CORPUS:-4000})), 'pages')"
    nvidia-smi --query-gpu=name,memory.total,driver_version,uuid --format=csv,noheader
    ;;
  floor)
    python3 -m bench.gpu.floor --out "$GPU_RESULTS_DIR" ${FLOOR_ARGS:-} || echo "floor failed"
    cp "$GPU_RESULTS_DIR/floor-profile.txt" "$out/" 2>/dev/null
    ;;
  run)
    plan=${1:?run PLAN}; shift
    host_env
    for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
      echo "ending leftover GPU process $pid"; kill "$pid" 2>/dev/null
    done
    timeout -s INT -k 30 "${RUN_LIMIT:-480}" python3 -m bench.gpu.served run --plan "$plan" \
      --levels "${LEVELS:-256,512}" --duration "${DURATION:-15}" --hey-s "${HEY_S:-40}" \
      --corpus "${CORPUS:-4000}"
    ;;
  merge)
    stem=${1:?merge STEM}; shift
    host_env
    python3 -m bench.gpu.layouts merge A,B --out "$out" --stem "$stem" --note "A: scripts/serve.sh \
PROFILE=h200-141gb (one engine, as shipped); B: the same with ENGINES=2 (the memory model's share \
each, MPS on); sweeps A then B, hey B then A, one serve.sh start per run of a layout."
    ;;
  *)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
  esac
done
