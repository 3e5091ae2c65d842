#!/usr/bin/env bash
# The router in a few steps (kernels/moe.cu: a thread per expert, the sum by butterfly shuffles in
# the reference's new halving order, selection on the probabilities by warp rounds and a counting
# merge): the MoE tests and end to end, then the decode timeline at 8 layers, 8k context
# (compare results/2026-11-30-session11-start-trace.log: router ~6.2 us a layer).
# It ran the router's FIRST rewrite (no longer on main: the branch's later commits replaced the
# selection, results/2026-11-30-router-marks.log); main's router is in router-final.sh's run.
# Build here: cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/ && strip gpu-bin/*
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
for t in gpu_moe gpu_e2e; do
    ./gpu-bin/$t --nocapture --test-threads=1 >"$OUT/$t.log" 2>&1; echo "$t rc $?"
    grep -E "test result|panicked|moe_router" "$OUT/$t.log" | cut -c1-200 | head -40
done
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline|dense parts in the replayed" "$OUT/trace.log" | cut -c1-60,150-230
grep -E "blk.1.moe|blk.1.mlp" "$OUT/trace.log" | cut -c1-130
