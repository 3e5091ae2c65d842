#!/usr/bin/env bash
# The persistent, ring-buffered down kernel (moe_experts_down_ring_*, branch down-ring, not on
# main): gpu_moe built from the branch, then the decode timeline at 8 layers, 8k context, with it
# (gpu-bin/graphrun-ring; compare results/2026-11-30-session10-final-trace.log, main without it).
# Build (here): a worktree of branch down-ring, `cargo build --release`, its graphrun as
# gpu-bin/graphrun-ring and its gpu_moe test binary as gpu-bin/gpu_moe (both stripped); then,
# with `DownKernel::Ring { ids_early: false }` in `DownKernel::choose` (launch/moe.rs), the
# copies issued after the wait, its graphrun as gpu-bin/graphrun-ring-late (traced if present).
# NOT RUN YET: written at the end of session 10, when the device budget was spent.
# LOST: session 11's checkout held main only; the branch down-ring is gone (scripts/README.md).
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
timeout 40 ./gpu-bin/gpu_moe --nocapture --test-threads=1 >"$OUT/gpu_moe.log" 2>&1
echo "gpu_moe rc $?"
grep -E "test result|panicked|ring" "$OUT/gpu_moe.log" | head -20
for v in ring ring-late; do
    [ -x ./gpu-bin/graphrun-$v ] || continue
    GRAPHRUN_BIN=./gpu-bin/graphrun-$v NAME=trace-$v timeout 40 bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1
    echo "$v trace rc $?"
    rm -f "$OUT/trace-$v.json"
    grep -E "decode timeline|dense parts in the replayed" "$OUT/trace-$v.log" | cut -c1-60,150-230
    grep -E "blk.[01].moe.routed|blk.[01].mlp_res" "$OUT/trace-$v.log" | tail -6 | cut -c1-110
done
