#!/usr/bin/env bash
# Session 8: weights prefetched into L2 from the side stream while latency-bound chains run
# (src/exec/cuda/prefetch.rs). GRAPHRUN_L2_PREFETCH_MB = the budget a streaming node (0/unset:
# off). The end-to-end tests with it on (graphs, eager, replay bits), then the decode timeline and
# the 8k bench for off and a few budgets. carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
GRAPHRUN_L2_PREFETCH_MB=24 ./gpu-bin/gpu_e2e > "$OUT/e2e-prefetch24.log" 2>&1; echo "gpu_e2e (24 MB) rc $?"
grep -E "test result|panicked" "$OUT/e2e-prefetch24.log"
for mb in 0 24 40; do
    GRAPHRUN_L2_PREFETCH_MB=$mb NAME=trace-pf$mb bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace $mb rc $?"
    rm -f "$OUT/trace-pf$mb.json"
    grep -E "decode timeline" "$OUT/trace-pf$mb.log" | cut -c1-60,150-230
    grep -E "^    blk.(3|4)\." "$OUT/trace-pf$mb.log" | grep blocks | grep -E "qkv|qg|h_new|attn_hc|selection" | cut -c1-110
done
for mb in 0 24; do
    GRAPHRUN_L2_PREFETCH_MB=$mb NAME=bench-pf$mb bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 >/dev/null 2>&1; echo "bench $mb rc $?"
    rm -f "$OUT/bench-pf$mb.json"
    grep -E "^ +8192 |dense parts in the replayed|greedy decode at" "$OUT/bench-pf$mb.log"
done
