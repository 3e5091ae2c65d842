#!/usr/bin/env bash
# Session 9: the helper's three folds (hc_read_exit, embed_streams, ple_embed) merged: every GPU
# test, the decode timeline and the headline bench. carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
OUT=$OUT bash scripts/gpu_tests.sh run >/dev/null 2>&1; echo "gpu tests rc $?"
grep -E "^## |test result|panicked|FAIL" "$OUT/gpu_tests.log" | head -40
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline" "$OUT/trace.log" | cut -c1-60,150-230
grep -E "^    (embed|blk.1.ple|exit|lm_head)" "$OUT/trace.log" | grep blocks
bash scripts/gpu_bench.sh >/dev/null 2>&1; echo "bench rc $?"
grep -E "^ +(1024|8192) |dense parts in the replayed|greedy decode at|tokens in one step" "$OUT/bench.log"
