#!/usr/bin/env bash
# Session 14's closing run of main (the lm head and the one-token groups streamed): every GPU
# test, the decode timeline at 8 layers, 8k, the default bench, the sanitizers. Builds: main's
# graphrun and `bash scripts/gpu_tests.sh build` in gpu-bin/ (carry ["gpu-bin"]).
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/closing_checks.sh
closing_checks "^    blk\.0\.(gdn|attn)|^    blk\.3\.qsa\.qg|lm_head"
