#!/usr/bin/env bash
# Session 11's first device call, tree b82d037 (the review mends 1985350 and b82d037, never run on
# the GPU): every GPU test, then the decode timeline at 8 layers, 8k context.
# Build here: cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/ && strip gpu-bin/*
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
bash scripts/gpu_tests.sh run >/dev/null 2>&1; echo "gpu_tests rc $?"
grep -E "^## |test result|panicked|FAILED" "$OUT/gpu_tests.log" | head -30
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline|dense parts in the replayed" "$OUT/trace.log" | cut -c1-60,150-230
