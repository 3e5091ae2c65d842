#!/usr/bin/env bash
# Session 12: the gate's early form as its own kernel (hc_read_gate_se_*, 1520 SASS instructions;
# hc_read_gate_s_* keeps the general form, 2512; the two in one kernel were 3256), against the
# commit before (gpu-bin/head/graphrun), then the closing checks of the change: every GPU test,
# the decode timeline, the default bench, the sanitizers.
# Build: cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/
#   and the commit before's binary into gpu-bin/head/ (a worktree, its own target dir); strip both.
# carry: ["gpu-bin"].
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
source scripts/experiments/closing_checks.sh
for pass in 1 2 3; do
    bench head ./gpu-bin/head/graphrun
    bench early ./gpu-bin/graphrun
done
closing_checks "^    blk.1\.(attn|mlp)_hc.*blocks|exit.x.*blocks"
