#!/usr/bin/env bash
# Session 8: the PLE tail as one kernel (fusion ple_mix) and the embed gather a thread a value.
# Every GPU test, then the decode timeline and the headline bench. carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
OUT=$OUT bash scripts/gpu_tests.sh run >/dev/null 2>&1; echo "gpu tests rc $?"
grep -E "^## |test result|panicked|ple_mix" "$OUT/gpu_tests.log" | head -60
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline" "$OUT/trace.log" | cut -c1-60,150-230
grep -E "^    (embed|blk.1\.ple|blk.1\.attn_hc)" "$OUT/trace.log" | grep blocks | cut -c1-110
bash scripts/gpu_bench.sh >/dev/null 2>&1; echo "bench rc $?"
grep -E "^ +(1024|8192) |dense parts in the replayed|greedy decode at|tokens in one step|bytes/token" "$OUT/bench.log"
