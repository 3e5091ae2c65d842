#!/usr/bin/env bash
# Where the one-launch hyper-connection read's time goes: the decode timeline (8 layers, 8k) with
# hc_read_one_o4 as built (mode 0), without the blocks' meeting (1), without the weights'
# staging (2), without both (3); 4: the next kernel released only after the meeting (4 + 1 = 5,
# 4 + 3 = 7); 8: no dynamic shared memory asked and none read (with 2; 15, 11). Modes with 1, 2 or 8
# compute wrong values: timing only
# (GRAPHRUN_HC_ONE_MODE, an experiment-only switch on branch hc-read-one-experiment).
# gpu-bin/graphrun-o4: `cargo build --release` with CHOSEN = one_launch(4). carry: ["gpu-bin"].
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
for m in 7 15 11; do
    GRAPHRUN_HC_ONE_MODE=$m GRAPHRUN_BIN=./gpu-bin/graphrun-o4 NAME=trace-mode$m bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1
    echo "mode $m trace rc $?"
    rm -f "$OUT/trace-mode$m.json"
    grep -E "decode timeline" "$OUT/trace-mode$m.log" | cut -c1-60,150-230
    grep -A8 "^  launches over" "$OUT/trace-mode$m.log" | grep -E -A1 "hc_read_one" | cut -c1-150
done
