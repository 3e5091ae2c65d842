#!/usr/bin/env bash
# Session 12's closing call on main with the narrow router: every GPU test (gpu_moe runs both
# router kernels on every router check), the decode timeline at 8 layers, 8k, the default bench
# (1k/8k decode, 2k/8k prefill) and the sanitizers.
# Build: cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/ && strip gpu-bin/*
# carry: ["gpu-bin"]; logs in $OUT (results/2026-11-30-session12-final-*.log).
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
