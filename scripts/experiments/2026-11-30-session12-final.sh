#!/usr/bin/env bash
# Session 12's closing call on main with the narrow router: every GPU test (gpu_moe runs both
# router kernels on every router check), the decode timeline at 8 layers, 8k, the default bench
# (1k/8k decode, 2k/8k prefill) and the sanitizers.
# Build: cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/ && strip gpu-bin/*
# carry: ["gpu-bin"]; logs in $OUT (results/2026-11-30-session12-final-*.log).
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/closing_checks.sh
closing_checks "blk.1.moe|blk.1.mlp"
