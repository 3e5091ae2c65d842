#!/usr/bin/env bash
# PREPARED in session 13, NOT RUN (the device budget was spent). Build: `git apply
# scripts/experiments/patches/2026-12-01-group-conv-diag.patch` on a branch of main (it holds the
# group-conv patch with the diagnostic change), cargo build --release, copy graphrun to
# gpu-bin/noconv/, main's to gpu-bin/head/, strip both; carry ["gpu-bin"].
# A diagnostic of the convolving group (2026-12-01-group-conv*.sh: ~12 us a GDN layer slower
# than linear_parts1 + the conv kernel, cause not found): gpu-bin/noconv is the fused node's
# kernel with its conv epilogue removed (the rows stored raw as linear_parts1 does, no window or
# tap loads; bound 6 blocks as linear_parts1; the results are wrong by design, timing only),
# gpu-bin/head main. If noconv is as slow as the fused kernel, the cost is not the conv's work.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
bench head ./gpu-bin/head/graphrun
bench noconv ./gpu-bin/noconv/graphrun
trace_of noconv ./gpu-bin/noconv/graphrun "^    blk.1\.gdn"
