#!/usr/bin/env bash
# Session 14: stream_rows takes a row in pieces of up to 10 chunks a lane (a longer row in turn,
# the next piece's loads issued before the products of the one held), so that any row of whole
# chunks streams, and the output projections' residual write gets a streamed form
# (`linear_hc_write1_stream`, 6144 -> 2560: three pieces a row). Builds (carry ["gpu-bin"]):
# gpu-bin/base: cf11c0f (lm head and groups streamed, rows of one piece); gpu-bin/tree (also
# gpu-bin/graphrun, with gpu-bin/gpu_kernels): the pieces, the same choices; gpu-bin/hcstream: the
# tree with the one-token residual writes of k >= 4096 streamed.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
gpu_test_runs gpu_kernels
sweep_rows "248320|6144->|read ceiling|linear_group"
for pass in 1 2; do
    for v in base tree hcstream; do bench $v-$pass ./gpu-bin/$v/graphrun; done
done
