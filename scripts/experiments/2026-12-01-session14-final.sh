#!/usr/bin/env bash
# Session 14's last run: the streamed kernels' weights loaded past L1 (stream_row_load, for the
# lm head and the streamed groups alike), against 0c506c2 (the same kernels through L1), three
# passes of the plain bench; every GPU test and memcheck on the tiny model with it. Builds
# (carry ["gpu-bin"]): gpu-bin/main: 0c506c2; gpu-bin/final (also gpu-bin/graphrun) and
# `bash scripts/gpu_tests.sh build`: the tree.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
source scripts/experiments/closing_checks.sh
for pass in 1 2 3; do
    for v in main final; do bench $v-$pass ./gpu-bin/$v/graphrun; done
done
gpu_tests_check
memcheck_tiny ./gpu-bin/final/graphrun
