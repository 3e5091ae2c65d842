#!/usr/bin/env bash
# Session 14, after the lm head's streamed kernel landed (5479a2b): the same streaming for the
# grouped input projections (`linear_parts1_stream`: the parts' rows end to end, a persistent
# grid of two blocks an SM, each warp loading its next row before the products of the one it
# holds; GDN's 2560 -> 10240+6144+48+48 and QSA's 2560 -> 12288+512+512+640 take it), and the lm
# head's kernel also asking the row after next into L2 (`linear_rows1_stream_ahead`). Builds
# (carry ["gpu-bin"]): gpu-bin/graphrun and gpu-bin/gpu_kernels: the tree (the sweep gains both);
# gpu-bin/head: the tree's choices (the lm head streamed, groups by blocks); gpu-bin/ahead: the lm
# head takes stream_ahead; gpu-bin/gstream: every one-token group that fits is streamed.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
gpu_test_runs gpu_kernels
sweep_rows "248320|read ceiling|linear_group"
for pass in 1 2; do
    for v in head ahead gstream; do bench $v-$pass ./gpu-bin/$v/graphrun; done
done
for v in head gstream; do trace_of $v ./gpu-bin/$v/graphrun "^    blk\.[03]\.(gdn|qsa)|lm_head"; done
