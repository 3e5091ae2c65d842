#!/usr/bin/env bash
# Session 13: the QSA indexer's score and top-k kernels, from the phase marks of
# 2026-12-01-prep-ahead.sh (score: 3.1 of 7.1 us in its dot products, whose queries came from
# L2 a step at a time; top-k: 3.5 us between its first bin and the end of its first radix pass,
# the cross-chunk path's atomics, fences and list reload: the bench's 8k context is 2049+
# blocks, two chunks of 2048). Binaries: gpu-bin/head (main), gpu-bin/scoreq (branch score-q:
# the chain's queries staged in shared memory with the tile), gpu-bin/chunk (branch chunk4k:
# IDX_CHUNK 4096, one chunk up to 16k tokens at block 4), gpu-bin/both (branch both; with the
# GPU tests).
# RESULT (results/2026-12-01-session13-indexer-*.log): both landed. gpu_attention and gpu_e2e
# pass. Segments at 8k: head 1.203 / 1.205 ms, scoreq 1.199 / 1.197, chunk 1.201 / 1.203, both
# 1.196 / 1.199; dense parts 0.682-0.683 (head), 0.687 (both). Timeline: score 7.11 -> 5.54 us,
# top-k 7.90 -> 6.69 (one block).
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
gpu_test_runs gpu_attention gpu_e2e
for pass in 1 2; do
    for v in head scoreq chunk both; do bench $v ./gpu-bin/$v/graphrun; done
done
for v in head both; do trace_of $v ./gpu-bin/$v/graphrun "^    blk.7\.(qsa|attn_res)"; done
