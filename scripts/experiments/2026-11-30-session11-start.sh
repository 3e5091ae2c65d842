#!/usr/bin/env bash
# Session 11's first device call, tree b82d037 (the review mends 1985350 and b82d037, never run on
# the GPU): every GPU test, then the decode timeline at 8 layers, 8k context.
# Build here: cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/ && strip gpu-bin/*
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/closing_checks.sh
gpu_tests_check
trace_check  # the timeline's summary lines alone
