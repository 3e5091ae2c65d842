#!/usr/bin/env bash
# Session 7's first device call: the review-mended gpu_moe, every GPU test, the timeline of main
# and of the three prepared experiment branches (built here into gpu-bin/<branch>/, stripped).
#   carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
T=(--layers 8 --contexts 8192 --prefills 16 --trace)
./gpu-bin/gpu_moe --test-threads=1 >"$OUT/gpu_moe.log" 2>&1; echo "gpu_moe rc $?"
OUT=$OUT bash scripts/gpu_tests.sh run >/dev/null 2>&1; echo "gpu tests rc $?"
grep -E "test result|## failed|panicked" "$OUT/gpu_tests.log"
NAME=trace-main bash scripts/gpu_bench.sh "${T[@]}" >/dev/null 2>&1; echo "trace main rc $?"
GRAPHRUN_HANDOFF=1 GRAPHRUN_BIN=gpu-bin/handoff/graphrun NAME=trace-handoff bash scripts/gpu_bench.sh "${T[@]}" >/dev/null 2>&1; echo "trace handoff rc $?"
(export GRAPHRUN_HANDOFF=1; ./gpu-bin/handoff/gpu_layout --test-threads=1; ./gpu-bin/handoff/gpu_e2e --test-threads=1) >"$OUT/handoff-tests.log" 2>&1; echo "handoff tests rc $?"
GRAPHRUN_DOWN_EARLY=1 GRAPHRUN_BIN=gpu-bin/downearly/graphrun NAME=trace-downearly bash scripts/gpu_bench.sh "${T[@]}" >/dev/null 2>&1; echo "trace downearly rc $?"
GRAPHRUN_DOWN_EARLY=1 GRAPHRUN_NO_GATE_UP_AHEAD=1 GRAPHRUN_BIN=gpu-bin/downearly/graphrun NAME=trace-downearly-noahead bash scripts/gpu_bench.sh "${T[@]}" >/dev/null 2>&1; echo "trace downearly-noahead rc $?"
GRAPHRUN_DOWN_EARLY=1 ./gpu-bin/downearly/gpu_moe --test-threads=1 >"$OUT/downearly-gpu_moe.log" 2>&1; echo "downearly gpu_moe rc $?"
GRAPHRUN_BIN=gpu-bin/router/graphrun NAME=trace-router bash scripts/gpu_bench.sh "${T[@]}" >/dev/null 2>&1; echo "trace router rc $?"
for f in "$OUT"/trace-*.log; do echo "== $f"; grep -E "decode timeline|hc_read|moe_router|moe_experts " "$f" | head -8; done
