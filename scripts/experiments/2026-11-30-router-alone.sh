#!/usr/bin/env bash
# Session 8: is the router slow because ahead-running blocks share its multiprocessor?
# GRAPHRUN_ROUTER_ALONE=1 makes the fast router's block ask for all of a multiprocessor's shared
# memory. gpu_moe with it, then the decode timeline with and without. carry: ["gpu-bin"].
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
GRAPHRUN_ROUTER_ALONE=1 ./gpu-bin/gpu_moe > "$OUT/gpu_moe-alone.log" 2>&1; echo "gpu_moe (alone) rc $?"
grep -E "test result|panicked" "$OUT/gpu_moe-alone.log" | head
for alone in 0 1; do
    GRAPHRUN_ROUTER_ALONE=$alone NAME=trace-alone$alone bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace alone=$alone rc $?"
    rm -f "$OUT/trace-alone$alone.json"
    grep -E "decode timeline" "$OUT/trace-alone$alone.log" | cut -c1-60,150-230
    grep -E "^    blk.4\.(moe|mlp)" "$OUT/trace-alone$alone.log" | grep blocks | cut -c1-130
done
