#!/usr/bin/env bash
# Session 13: the weight loads' cache hints (kernels/vec.cuh `load_weight_chunk`, every kernel
# that streams a weight matrix). Binaries: gpu-bin/head (main, __ldg: ld.global.nc), and
# gpu-bin/m1..m3 built with `#define WEIGHT_LOAD_MODE N` in kernels/vec.cuh:
#   m1  ld.global.nc.L1::no_allocate.L2::256B           (256-byte L2 fetches)
#   m2  m1 with an L2 evict-first policy (createpolicy.fractional + .L2::cache_hint)
#   m3  no L1 allocation, evict-first, no fetch size
# The same loaded values: only the caches' handling differs. Plain bench at 8 layers, 8k,
# alternating twice, then a trace of each (lm_head, gdn.qkv, the experts in the timeline).
# RESULT (results/2026-12-01-session13-weight-loads-*.log): __ldg stays. Segments at 8k: head 1.199
# / 1.209 ms, m1 1.264 / 1.265, m2 1.294 / 1.291, m3 1.234 / 1.232; the lm head 318.8 us (head),
# 349.4 (m1), 350.5 (m2), 319.5 (m3): 256-byte L2 fetches cost ~10% on every streamed matrix,
# evict-first changes nothing measurable.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
for pass in 1 2; do
    for v in head m1 m2 m3; do bench $v ./gpu-bin/$v/graphrun; done
done
for v in head m1 m2 m3; do
    NAME=trace-$v GRAPHRUN_BIN=./gpu-bin/$v/graphrun timeout 60 bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1
    echo "trace $v rc $?"; rm -f "$OUT/trace-$v.json"
    grep -E "decode timeline" "$OUT/trace-$v.log" | cut -c1-60,150-230
    grep -A18 "decode timeline" "$OUT/trace-$v.log" | grep -E "^  (linear|moe_experts|hc_read|linear_group|linear_hc)" 
    grep -E "^    (lm_head.logits|blk.1.gdn.qkv|blk.1.moe.routed) " "$OUT/trace-$v.log" | grep blocks | cut -c1-110
done
