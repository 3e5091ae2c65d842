#!/usr/bin/env bash
# Session 10's first device call: every GPU test (the n-gram hash review mend, e5fca52, never
# run on the GPU before) and the decode timeline at 8 layers, 8k context.
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
OUT=$OUT bash scripts/gpu_tests.sh run >/dev/null 2>&1; echo "gpu tests rc $?"
grep -E "^## |test result|panicked|wide_gdn" "$OUT/gpu_tests.log" | head -40
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline" "$OUT/trace.log" | cut -c1-60,150-230
