#!/usr/bin/env bash
# Session 7's third device call: one shared-memory carveout for every kernel (GRAPHRUN_CARVEOUT,
# percent; an experiment switch in Gpu::function) against the driver's choice per kernel, for
# the two-kernel hc_read (gpu-bin/two/) and the one-kernel form (gpu-bin/graphrun), whose 102 KB
# of shared memory may force multiprocessors to drain to change their split. carry: ["gpu-bin"].
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
T=(--layers 8 --contexts 8192 --prefills 16 --trace)
./gpu-bin/gpu_layout --test-threads=1 >"$OUT/gpu_layout.log" 2>&1; echo "gpu_layout rc $?"
grep -E "test result|panicked" "$OUT/gpu_layout.log" | head -5
run() { # name, binary, carveout
    if [ -n "$3" ]; then export GRAPHRUN_CARVEOUT=$3; else unset GRAPHRUN_CARVEOUT; fi
    GRAPHRUN_BIN=$2 NAME=$1 bash scripts/gpu_bench.sh "${T[@]}" >/dev/null 2>&1; echo "$1 rc $?"
    rm -f "$OUT/$1.json"
    grep -E "decode timeline" "$OUT/$1.log" | cut -c1-60,150-230; grep -E "^  hc_read" "$OUT/$1.log" | tail -1
}
run trace-two gpu-bin/two/graphrun ""
run trace-two-c100 gpu-bin/two/graphrun 100
run trace-two-c50 gpu-bin/two/graphrun 50
run trace-one-c100 gpu-bin/graphrun 100
run trace-one-c50 gpu-bin/graphrun 50
run trace-two-c0 gpu-bin/two/graphrun 0
