#!/usr/bin/env bash
# Session 7: hc_read's act and gate kernels load their first weight chunks into registers before
# their wait (and the router keeps its logits in shared memory), against the build before
# (gpu-bin/two/). carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
T=(--layers 8 --contexts 8192 --prefills 16 --trace)
for t in gpu_layout gpu_moe; do ./gpu-bin/$t --test-threads=1 >"$OUT/$t.log" 2>&1; echo "$t rc $?"; grep -E "test result|panicked" "$OUT/$t.log" | head -3; done
run() { GRAPHRUN_BIN=$2 NAME=$1 bash scripts/gpu_bench.sh "${T[@]}" >/dev/null 2>&1; echo "$1 rc $?"; rm -f "$OUT/$1.json"
    grep -E "decode timeline" "$OUT/$1.log" | cut -c1-60,150-230; grep -E "^  (hc_read|moe_router) " "$OUT/$1.log" | tail -2; }
run trace-before gpu-bin/two/graphrun
run trace-preload gpu-bin/graphrun
run trace-before2 gpu-bin/two/graphrun
run trace-preload2 gpu-bin/graphrun
