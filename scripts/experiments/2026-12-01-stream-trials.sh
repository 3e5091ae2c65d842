#!/usr/bin/env bash
# Session 14: two trials of the lm head's streamed kernel, against the ~281 us a pure read of its
# bytes takes: x copied into shared memory once a block (`linear_rows1_stream_xs`: the streamed
# weights, ~160 KB in flight an SM through L1, might evict x, whose reloads would then wait on
# L2 at every row), and the weights loaded past L1 (`linear_rows1_stream_nol1`). Builds (carry
# ["gpu-bin"]): gpu-bin/graphrun and gpu-bin/gpu_kernels: the tree (every variant in the sweep
# and against the CPU, bit for bit against linear_rows1); gpu-bin/main: the tree's choices (the
# lm head streamed); gpu-bin/StreamedXs, gpu-bin/StreamedNoL1: the lm head takes that trial.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
gpu_test_runs gpu_kernels
sweep_rows "248320|read ceiling|linear_group"
for pass in 1 2; do
    for v in main StreamedXs StreamedNoL1; do bench $v-$pass ./gpu-bin/$v/graphrun; done
done
