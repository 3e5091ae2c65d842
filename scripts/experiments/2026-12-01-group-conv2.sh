#!/usr/bin/env bash
# Session 13, second run of the convolving group (2026-12-01-group-conv.sh found it correct and
# 15 us slower a GDN layer: the epilogue's window and taps, held in registers through the
# products, spilled under linear_parts1's bound of 6 blocks, and the spill's store waited for
# the loads, a round trip before every block's products). Now 4 taps at most (GDN's; 7
# registers): gpu-bin/conv5 (bound 5 blocks: 48 registers, an 8-byte spill left, after the
# wait), gpu-bin/conv4 (bound 4: 61 registers, no spill; with the GPU tests), gpu-bin/head.
# RESULT (results/2026-12-01-session13-group-conv2-*.log): still slower: segments 1.193 / 1.194
# (head), 1.266 / 1.262 (conv4), 1.247 / 1.247 (conv5); the fused launch 37.6 (conv4) and 37.9 us
# (conv5): the spill was not the cause.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
gpu_test_runs gpu_gdn gpu_e2e
for pass in 1 2; do
    for v in head conv4 conv5; do bench $v ./gpu-bin/$v/graphrun; done
done
for v in conv4 conv5; do trace_of $v ./gpu-bin/$v/graphrun "^    blk.1\.gdn"; done
