#!/usr/bin/env bash
# EXPERIMENT (branch router-halving): the MoE tests and end to end, then the new router's phases by %globaltimer marks, alone
# (gpu_moe's ignored router_phases) and inside the replayed decode graph (GRAPHRUN_ROUTER_MARKS=1:
# the bench prints each router launch's marks after the traced steps).
# NOT re-runnable on main: the marks and switches were experiment code on the branch, which did not
# outlive the session; the router it converged on is main's (c50ff0c). A generic form of the marks
# (GRAPHRUN_MARKS) is in scripts/experiments/patches/2026-11-30-gdn-marks-hold.patch.
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
for t in ${TESTS:-gpu_moe gpu_e2e}; do
    ./gpu-bin/$t --nocapture --test-threads=1 >"$OUT/$t.log" 2>&1; echo "$t rc $?"
    grep -E "test result|panicked" "$OUT/$t.log" | cut -c1-200 | head -10
done
./gpu-bin/gpu_moe --nocapture --test-threads=1 --ignored router_phases >"$OUT/phases.log" 2>&1; echo "phases rc $?"
grep -E "router phases|panicked" "$OUT/phases.log"
GRAPHRUN_ROUTER_MARKS=1 NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline" "$OUT/trace.log" | cut -c1-60,150-230
grep -E "router marks" "$OUT/trace.log"
grep -E "blk.1.moe|blk.1.mlp" "$OUT/trace.log" | cut -c1-130
# The bound as the least of the warps' max logits (one warp minimum; more candidates).
GRAPHRUN_ROUTER_MIN_BOUND=1 ./gpu-bin/gpu_moe --nocapture --test-threads=1 --ignored router_phases >"$OUT/phases-min.log" 2>&1; echo "phases-min rc $?"
grep -E "router phases|panicked" "$OUT/phases-min.log"
GRAPHRUN_ROUTER_MIN_BOUND=1 ./gpu-bin/gpu_moe --nocapture --test-threads=1 router_matches >"$OUT/gpu_moe-min.log" 2>&1; echo "gpu_moe-min rc $?"
grep -E "test result|panicked" "$OUT/gpu_moe-min.log"
GRAPHRUN_ROUTER_MIN_BOUND=1 GRAPHRUN_ROUTER_MARKS=1 NAME=trace-min bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace-min rc $?"
rm -f "$OUT/trace-min.json"
grep -E "decode timeline" "$OUT/trace-min.log" | cut -c1-60,150-230
grep -E "router marks slot (5[6-9]|6[0-3])" "$OUT/trace-min.log"
grep -E "blk.1.moe.expert_ids" "$OUT/trace-min.log" | cut -c1-130
