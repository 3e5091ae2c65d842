#!/usr/bin/env bash
# Session 8: the output projection's weights in registers before its wait
# (GRAPHRUN_HC_WRITE_PRE=1: linear_hc_write_pre_*, branch hc-write-preload-experiment). gpu_e2e
# with it, the decode timeline without and with, the 8k bench with. carry: ["gpu-bin"].
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
GRAPHRUN_HC_WRITE_PRE=1 ./gpu-bin/gpu_e2e > "$OUT/gpu_e2e-pre.log" 2>&1; echo "gpu_e2e (pre) rc $?"
grep -E "test result|panicked" "$OUT/gpu_e2e-pre.log"
for pre in 0 1; do
    GRAPHRUN_HC_WRITE_PRE=$pre NAME=trace-pre$pre bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace pre=$pre rc $?"
    rm -f "$OUT/trace-pre$pre.json"
    grep -E "decode timeline" "$OUT/trace-pre$pre.log" | cut -c1-60,150-230
    grep -E "^    blk.(3|4)\.(gdn.o_norm|qsa.attn|attn_res|mlp_hc)" "$OUT/trace-pre$pre.log" | grep blocks | cut -c1-130
done
GRAPHRUN_HC_WRITE_PRE=1 NAME=bench-pre1 bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 >/dev/null 2>&1; echo "bench pre=1 rc $?"
rm -f "$OUT/bench-pre1.json"
grep -E "^ +8192 |dense parts in the replayed|greedy decode at" "$OUT/bench-pre1.log"
