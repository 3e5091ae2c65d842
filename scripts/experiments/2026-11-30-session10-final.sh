#!/usr/bin/env bash
# Session 10's last device call, at the session's final tree (the chain kernels' round trips and
# DOWN_BATCH 10, whose GPU tests ran in the calls before: results/2026-11-30-chain-rounds-*.log,
# results/2026-11-30-down-batch-*.log): the decode timeline, the headline bench and the
# sanitizers. carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline" "$OUT/trace.log" | cut -c1-60,150-230
bash scripts/gpu_bench.sh >/dev/null 2>&1; echo "bench rc $?"
grep -E "^ +(1024|8192) |dense parts in the replayed|greedy decode at|tokens in one step" "$OUT/bench.log"
timeout 150 bash scripts/gpu_sanitize.sh >/dev/null 2>&1; echo "sanitize rc $?"
grep -E "^##|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize.log"
