#!/usr/bin/env bash
# Session 13, third run of the convolving group: 2026-12-01-group-conv2.sh found the kernel still
# ~13 us slower than linear_parts1 with no spill (conv4), i.e. about a memory round trip a block
# over its 10 waves: the window and taps were loaded before griddepcontrol.wait, which (so the
# timing says) waits for the thread's loads in flight. Now loaded after the wait, in flight with
# the products. gpu-bin/conv4 (bound 4 blocks, 61 registers; with the GPU tests), gpu-bin/conv5
# (bound 5, 48 registers, an 8-byte spill), gpu-bin/head (main 73ad178).
# RESULT (results/2026-12-01-session13-group-conv3-*.log): no change: segments 1.197 / 1.197
# (head), 1.261 / 1.265 (conv4), 1.253 / 1.256 (conv5); the fused launch 38.0 / 36.2 us. The
# loads before the wait were not the cause either; why the same products with a two-thread
# epilogue take ~12 us longer over the grid's 10 waves is not understood (SASS: the same main
# loop, 896-1304 instructions against 544). See docs/cuda-plan.md, thirteenth session.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
gpu_test_runs gpu_gdn
for pass in 1 2; do
    for v in head conv4 conv5; do bench $v ./gpu-bin/$v/graphrun; done
done
for v in conv4 conv5; do trace_of $v ./gpu-bin/$v/graphrun "^    blk.1\.gdn"; done
