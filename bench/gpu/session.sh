#!/usr/bin/env bash
# The GPU host's side of a bench.gpu.layouts session (../shared/gpu/README.md: vLLM 0.23.0 from
# /tmp/site, wheels carried in six parts, one call each). Run from the checkout root there:
# (vLLM 0.32.0 instead: WHEELS=.gpu-wheels-032 GPU_VLLM_VERSION=0.32.0 on every stage, the parts
# made by bench/gpu/fetch_wheels.sh, 31 of them, the host scripts from bench/gpu/host/)
#
#   bash bench/gpu/session.sh receive K            # part K of .gpu-wheels (carry it and scripts/)
#   bash bench/gpu/session.sh install              # vLLM + the gateway's wheels (.whl), checkpoint
#   bash bench/gpu/session.sh run LAYOUTS [CPUS]   # sweep layouts; CPUS: taskset list, e.g. 0-15
#                                                  # (TOGETHER=1: all engines up at once, KV fixed)
#   bash bench/gpu/session.sh merge                # report of every layout run into $OUT
#
# Every stage copies what exists so far (results, engine logs) to $OUT, so a call cut short by
# its time limit still returns what it measured.
set -uo pipefail
stage=${1:?usage: bench/gpu/session.sh receive K | install | run LAYOUTS [CPUS] | merge}
export GPU_BENCH_DIR=/tmp/gpu-bench GPU_RESULTS_DIR=/tmp/gpu-results
wheels=${WHEELS:-.gpu-wheels}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out" "$GPU_BENCH_DIR" "$GPU_RESULTS_DIR"

collect() {
    cp -r "$GPU_RESULTS_DIR" "$out/results" 2>/dev/null
    mkdir -p "$out/logs"
    cp "$GPU_BENCH_DIR"/*.log "$GPU_BENCH_DIR"/*.csv "$out/logs/" 2>/dev/null
    return 0
}
trap collect EXIT

case $stage in
receive)
    bash "$wheels/scripts/receive.sh" "$wheels" "${2:?part number}"
    ;;
install)
    bash "$wheels/scripts/install.sh" || exit 1
    . "$wheels/scripts/env.sh"
    site=${PYTHONPATH%%:*}  # where env.sh put vLLM: the gateway's own wheels go beside it
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
    # Does this vLLM pin its serving loop to one torch thread itself (later versions do)?
    grep -rln "set_torch_threads_for_runtime\|Reducing Torch threads" "$site/vllm" \
        | head -3 || echo "vLLM does not manage torch threads for serving"
    nproc; nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
    python3 -m bench.gpu.layouts prepare
    ;;
run)
    . "$wheels/scripts/env.sh"
    # An engine a previous call left running (a call cut short) would hold GPU memory: end it
    for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null); do
        echo "ending leftover GPU process $pid"; kill "$pid" 2>/dev/null
    done
    taskset=()
    [ -n "${3:-}" ] && taskset=(taskset -c "$3")
    # RUN_LIMIT (s): interrupt the run in time for its finally blocks (engines stopped) and this
    # script's collect, before the device call's own limit kills everything unsaved
    timeout -s INT -k 60 "${RUN_LIMIT:-540}" \
    "${taskset[@]}" python3 -m bench.gpu.layouts run "${2:?layouts}" ${LEVELS:+--levels "$LEVELS"} \
        ${DURATION:+--duration "$DURATION"} ${CORPUS:+--corpus "$CORPUS"} ${TOGETHER:+--together}
    ;;
merge)
    . "$wheels/scripts/env.sh"
    python3 -m bench.gpu.layouts merge --out "$out" "${2:-}"
    ;;
*)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
esac
