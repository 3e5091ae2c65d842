#!/usr/bin/env bash
# Session 14: the lm head (2560 -> 248320, 1.27 GB of bf16, ~319 us a step: 0.93 of the copy
# rate) against a pure read of the same bytes, and two new one-token kernels for it:
# `linear_rows1_whole` (a warp per row, all of a lane's chunks of the row in flight at once) and
# `linear_rows1_stream` (the same by a persistent grid of two blocks an SM, each warp loading its
# next row before the products of the one it holds). Builds (carry ["gpu-bin"]):
#   gpu-bin/graphrun, gpu-bin/gpu_kernels: the tree (the variants, the sweep's read ceiling);
#   gpu-bin/head/graphrun: main before it; gpu-bin/{WarpPerRowWhole,Streamed}/graphrun: the
#   tree with OneToken::for_shape giving the lm head that variant.
# Runs: gpu_kernels (every variant against the CPU, the new ones bit for bit against
# linear_rows1), `bench --sweep-linear` (every one-token shape and variant, the read ceiling),
# then the plain bench A/B, twice round.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
gpu_test_runs gpu_kernels
sweep_rows "248320|read ceiling"
for pass in 1 2; do
    for v in head WarpPerRowWhole Streamed; do bench $v-$pass ./gpu-bin/$v/graphrun; done
done
grep -h "lm_head.logits" "$OUT"/bench-*.log | head -12
