#!/usr/bin/env bash
# Session 8: the router's fast variant (moe_router_fast_f32, rule moe_router.cuda_fast): gpu_moe
# and gpu_e2e, the decode timeline and the headline bench; and the attention split counts 33
# and 44 (branch qsa-attention-sweeps in gpu-bin/sweeps/). carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
./gpu-bin/gpu_moe --nocapture > "$OUT/gpu_moe.log" 2>&1; echo "gpu_moe rc $?"
grep -E "test result|panicked" "$OUT/gpu_moe.log" | head
grep -E "moe_router_fast_f32" "$OUT/gpu_moe.log" | head -12
./gpu-bin/gpu_e2e > "$OUT/gpu_e2e.log" 2>&1; echo "gpu_e2e rc $?"
grep -E "test result|panicked" "$OUT/gpu_e2e.log"
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline" "$OUT/trace.log" | cut -c1-60,150-230
grep -E "^    blk.4\." "$OUT/trace.log" | grep blocks | cut -c1-110
bash scripts/gpu_bench.sh >/dev/null 2>&1; echo "bench rc $?"
grep -E "^ +(1024|8192) |dense parts in the replayed|greedy decode at|tokens in one step" "$OUT/bench.log"
for s in 33 44; do
    GRAPHRUN_ATTN_SPLITS=$s GRAPHRUN_BIN=gpu-bin/sweeps/graphrun NAME=sweep-s$s bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "sweep $s rc $?"
    rm -f "$OUT/sweep-s$s.json"
    grep -E "decode timeline" "$OUT/sweep-s$s.log" | cut -c1-60,150-230
    grep -E "^    blk.3\.qsa.attn" "$OUT/sweep-s$s.log" | grep blocks | cut -c1-110
done
