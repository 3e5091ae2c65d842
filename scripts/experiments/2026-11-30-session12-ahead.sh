#!/usr/bin/env bash
# Session 12: prefetching later nodes' weights into L2 from the hyper-connection read's first
# kernel (before its wait), whose two dependent kernels leave HBM mostly idle for ~9 us: the
# next weight-streaming nodes' first GRAPHRUN_PREFETCH_AHEAD_MB (gdn.qkv, qsa.qg, the router
# logits + the shared expert, lm_head) then come from L2.
# RESULT (results/2026-11-30-session12-ahead-*.log, -summary.log): slower at every budget, more
# so the more is prefetched (segments 1.237 -> 1.255 at 8 MB, 1.300 at 48 MB): the read's first
# kernel 4.4 -> 6-8 us (its own loads queue behind the bulk prefetches) and gdn.qkv no faster
# (24.35 against 24.55 us) with its first 24 MB in L2. Not landed.
# Build: main + patches/2026-11-30-prefetch-ahead.patch (the router patch it ran with is landed);
#   cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/ && strip gpu-bin/*
# carry: ["gpu-bin"]. gpu_layout (hc_read unchanged), then the plain bench at 8 layers, 8k,
# at budgets 0..48 MB, twice, then a trace at 24 MB.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
./gpu-bin/gpu_layout --test-threads=1 >"$OUT/gpu_layout.log" 2>&1; echo "gpu_layout rc $?"
grep -E "test result|panicked" "$OUT/gpu_layout.log" | head
source scripts/experiments/ab_bench.sh
for pass in 1 2; do
    for mb in 0 8 16 24 32 48; do bench ahead$mb ./gpu-bin/graphrun GRAPHRUN_PREFETCH_AHEAD_MB=$mb; done
done
GRAPHRUN_PREFETCH_AHEAD_MB=24 NAME=trace-ahead24 bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1
echo "trace rc $?"; rm -f "$OUT/trace-ahead24.json"
grep -E "decode timeline" "$OUT/trace-ahead24.log" | cut -c1-60,150-230
grep -E "^    blk.(1|3)\.|lm_head|exit" "$OUT/trace-ahead24.log" | grep blocks | cut -c1-130
