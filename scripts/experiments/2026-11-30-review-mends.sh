#!/usr/bin/env bash
# Session 8's review mends (Gpu::intermediate for the GDN fallbacks with a GPU test of 160-wide
# value heads, GRID_STRIDE in common.cuh, REAL_INDEXER in the tests): every GPU test.
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
OUT=$OUT bash scripts/gpu_tests.sh run >/dev/null 2>&1; echo "gpu tests rc $?"
grep -E "^## |test result|panicked|wide GDN" "$OUT/gpu_tests.log" | head -30
