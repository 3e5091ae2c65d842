#!/usr/bin/env bash
# The router's final form (branch router-halving, before its merge): every GPU test, the decode
# timeline at 8 layers, 8k context, the headline bench and the sanitizers.
# Build here: cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/ && strip gpu-bin/*
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/closing_checks.sh
closing_checks "blk.1.moe|blk.1.mlp"
