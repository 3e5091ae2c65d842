#!/usr/bin/env bash
# Session 7: the three launch-removing fusions (IndexerSelectQk, GatedAttention,
# GdnConvNormedRecurrence): every GPU test, the timeline against the build before them
# (gpu-bin/two/), and the headline bench. carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
OUT=$OUT bash scripts/gpu_tests.sh run >/dev/null 2>&1; echo "gpu tests rc $?"
grep -E "^## |test result|panicked|FAILED" "$OUT/gpu_tests.log" | head -30
T=(--layers 8 --contexts 8192 --prefills 16 --trace)
run() { GRAPHRUN_BIN=$2 NAME=$1 bash scripts/gpu_bench.sh "${T[@]}" >/dev/null 2>&1; echo "$1 rc $?"; rm -f "$OUT/$1.json"
    grep -E "decode timeline" "$OUT/$1.log" | cut -c1-60,150-230; }
run trace-before gpu-bin/two/graphrun
run trace-after gpu-bin/graphrun
grep -E "^    blk.(3|4)\." "$OUT/trace-after.log" | grep blocks
bash scripts/gpu_bench.sh >/dev/null 2>&1; echo "bench rc $?"
grep -E "^ +(1024|8192) |dense parts in the replayed|greedy decode at|tokens in one step" "$OUT/bench.log"
