#!/usr/bin/env bash
# The PLE n-gram table on the device against on the host (`--ple-table`), one table size (n-gram
# base 100000, which fits either way), the whole model, in one device call: the host gather's
# cost is the difference.
#
#   here:            cargo build --release && cp target/release/graphrun gpu-bin/
#   on the device:   bash scripts/gpu_ple_placement.sh     # through the `device` tool, carry: ["gpu-bin"]
#
# Writes $OUT/bench-compare.log (or results/): commit it as results/bench-compare.log.
set -euo pipefail
cd "$(dirname "$0")/.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
out="${OUT:-results}"
bench=(./gpu-bin/graphrun bench --layers 48 --contexts 1024,8192,32768 --prefills 2048,8192
    --decode-steps 16 --chunk 4096 --ple-vocab-base 100000)
{
    echo "# graphrun bench: the n-gram table on the device vs on the host, one table size (n-gram base 100000), same call"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# command: bash scripts/gpu_ple_placement.sh"
    for p in device host; do
        echo "## ${bench[*]:1} --ple-table $p"
        "${bench[@]}" --ple-table "$p" 2>&1 |
            grep -E "memory plan|^ +[0-9]+ +[0-9.]+ |greedy|host per|tokens in"
    done
} >"$out/bench-compare.log" 2>&1
