#!/usr/bin/env bash
# Session 13: GDN's causal conv as the grouped input projections' epilogue (fusion
# `linear_group_conv`, after the groupings: `Op::LinearGroupConv`, kernel linear_parts1_conv_*),
# one launch fewer a GDN layer at decode. Binaries: gpu-bin/head (main 73ad178), gpu-bin/conv
# (branch conv-epilogue, with the GPU tests). Runs gpu_gdn (the new check: bit for bit against
# linear_group + causal_conv, and the CPU), gpu_kernels, gpu_e2e, the plain bench head / conv
# alternating three times, a trace of each, memcheck of the tiny model with conv.
# RESULT (results/2026-12-01-session13-group-conv-*.log): correct (gpu_gdn's new check bit for
# bit against linear_group + causal_conv, gpu_kernels, gpu_e2e, memcheck), and slower: segments
# 1.194 / 1.195 / 1.199 ms (head) against 1.278 / 1.274 / 1.276; in the timeline the fused
# launch 39.8 us against 24.5 + 2.65 (the projection and the conv). Not landed; the code is
# scripts/experiments/patches/2026-12-01-group-conv.patch (applies to 73ad178).
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
gpu_test_runs gpu_gdn gpu_kernels gpu_e2e
for pass in 1 2 3; do
    bench head ./gpu-bin/head/graphrun
    bench conv ./gpu-bin/conv/graphrun
done
for v in head conv; do trace_of $v ./gpu-bin/$v/graphrun "^    blk.1\.gdn"; done
memcheck_tiny ./gpu-bin/conv/graphrun
