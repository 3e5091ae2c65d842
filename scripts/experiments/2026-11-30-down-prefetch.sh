#!/usr/bin/env bash
# EXPERIMENT (branch down-prefetch): the decode down kernel (moe_experts_down_rows_*) asks its
# rows of each slot's expert into L2 before its wait (the router's ids are final by then), while
# the gate/up ahead still streams. gpu_moe, then the decode timeline at 8 layers, 8k context,
# with it and without it (GRAPHRUN_DOWN_PREFETCH=0) in the same call.
# NOT re-runnable on main: measured slower and not kept (results/2026-11-30-down-prefetch.log);
# the branch did not outlive the session.
# Build here: cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/ && strip gpu-bin/*
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
./gpu-bin/gpu_moe --nocapture --test-threads=1 >"$OUT/gpu_moe.log" 2>&1; echo "gpu_moe rc $?"
grep -E "test result|panicked" "$OUT/gpu_moe.log"
for v in 1 0 1 0; do
    GRAPHRUN_DOWN_PREFETCH=$v NAME=trace-$v bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "prefetch $v trace rc $?"
    rm -f "$OUT/trace-$v.json"
    grep -E "decode timeline|dense parts in the replayed" "$OUT/trace-$v.log" | cut -c1-60,150-230
    grep -E "blk.[12].moe.routed moe|blk.[12].mlp_res" "$OUT/trace-$v.log" | cut -c1-130
done
