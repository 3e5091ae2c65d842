#!/usr/bin/env bash
# PREPARED in session 13, NOT RUN (the device budget was spent). A diagnostic of the convolving
# group (2026-12-01-group-conv*.sh: correct, but its kernel takes 36-40 us against 24.5 + 2.65
# for linear_parts1 and the conv kernel; cause not found). The patch
# (scripts/experiments/patches/2026-12-01-group-conv-diag.patch, against main 0ba9d6d) is the
# group-conv patch with two knobs in kernels/linear.cu: PARTS_CONV_DIAG (0 the fused kernel; 1
# no conv: rows stored raw, no window or tap loads; 2 the loads, rows stored raw, no window
# stores; 3 no loads, a zero window, the conv and the window stores: the results of 1-3 are
# wrong by design, timing only) and PARTS_CONV_MIN_BLOCKS (the launch bound). Build, on a branch
# with the patch applied:
#   for v in "d0 0 4" "d1 1 6" "d1b4 1 4" "d2 2 4" "d3 3 4"; do set -- $v
#     sed -i "s/^#define PARTS_CONV_DIAG [0-9]/#define PARTS_CONV_DIAG $2/; s/^#define PARTS_CONV_MIN_BLOCKS [0-9]/#define PARTS_CONV_MIN_BLOCKS $3/" kernels/linear.cu
#     cargo build --release && mkdir -p gpu-bin/$1 && cp target/release/graphrun gpu-bin/$1/; done
# plus main's binary in gpu-bin/head/; strip them all; carry ["gpu-bin"].
# Reading: d1 (no conv, linear_parts1's bound) as slow as d0 -> the cost is not the conv's work
# (then the node, its outputs or the launch); d1 fast and d1b4 slow -> the bound of 4 blocks; d2
# or d3 slow -> the loads or the stores.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
for v in head d0 d1 d1b4 d2 d3; do bench $v ./gpu-bin/$v/graphrun; done
for v in d0 d1 d1b4 d2 d3; do trace_of $v ./gpu-bin/$v/graphrun "^    blk.1\.gdn"; done
