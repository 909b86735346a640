#!/usr/bin/env bash
# Beside a run on the GPU host: every PERIOD seconds, what each vLLM process (EngineCores, API
# servers: VLLM::APIServer_N when an engine runs more than one) and the layout service (python
# -m ocrvl_layout) does: its threads' CPU (ps) and 5 s of py-spy stacks (raw, one line per
# stack) into DIR. PERIOD 0: one capture now
# (what bench.gpu.steady's --tail-command runs past a window, the load still on), then exit.
#   bash bench/gpu/watch.sh DIR [PERIOD] &
set -uo pipefail
dir=${1:?usage: bench/gpu/watch.sh DIR [PERIOD]}; period=${2:-60}
spy=${SPY:-/tmp/spy/bin/py-spy}
mkdir -p "$dir"
capture() {
    stamp=$(date +%H%M%S)
    ps -eLo pid,tid,pcpu,comm,args --sort=-pcpu | head -60 > "$dir/threads-$stamp.txt"
    for pid in $(ps -eo pid,args | awk '/VLLM::EngineCore|VLLM::APIServer|vllm.entrypoints|-m ocrvl_layout/ && !/awk/ {print $1}'); do
        [ -x "$spy" ] && timeout 20 "$spy" record --pid "$pid" --duration 5 --rate 200 \
            --format raw --output "$dir/spy-$stamp-$pid.txt" --nonblocking >/dev/null 2>>"$dir/spy.err" &
    done
    wait
}
if [ "$period" = 0 ]; then capture; exit 0; fi
while sleep "$period"; do capture; done
