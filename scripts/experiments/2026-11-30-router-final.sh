#!/usr/bin/env bash
# The router's final form (branch router-halving, before its merge): every GPU test, the decode
# timeline at 8 layers, 8k context, the headline bench and the sanitizers.
# Build here: cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/ && strip gpu-bin/*
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
bash scripts/gpu_tests.sh run >/dev/null 2>&1; echo "gpu_tests rc $?"
grep -E "^## |test result|panicked|FAILED" "$OUT/gpu_tests.log" | head -30
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline|dense parts in the replayed" "$OUT/trace.log" | cut -c1-60,150-230
grep -E "blk.1.moe|blk.1.mlp" "$OUT/trace.log" | cut -c1-130
bash scripts/gpu_bench.sh >/dev/null 2>&1; echo "bench rc $?"
grep -E "^ +(1024|8192) |dense parts in the replayed|greedy decode at|tokens in one step" "$OUT/bench.log"
timeout 170 bash scripts/gpu_sanitize.sh >/dev/null 2>&1; echo "sanitize rc $?"
grep -E "^##|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize.log"
