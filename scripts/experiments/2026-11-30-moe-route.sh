#!/usr/bin/env bash
# Session 8: the router's linear and the router in one launch (fusion moe_route: the linear's
# last block routes). gpu_moe and gpu_e2e, the decode timeline and the headline bench.
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
./gpu-bin/gpu_moe --nocapture --test-threads=1 > "$OUT/gpu_moe.log" 2>&1; echo "gpu_moe rc $?"
grep -E "test result|panicked|^moe_route " "$OUT/gpu_moe.log" | head -20
./gpu-bin/gpu_e2e > "$OUT/gpu_e2e.log" 2>&1; echo "gpu_e2e rc $?"
grep -E "test result|panicked" "$OUT/gpu_e2e.log"
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline" "$OUT/trace.log" | cut -c1-60,150-230
grep -E "^    blk.4\." "$OUT/trace.log" | grep blocks | cut -c1-130
bash scripts/gpu_bench.sh >/dev/null 2>&1; echo "bench rc $?"
grep -E "^ +(1024|8192) |dense parts in the replayed|greedy decode at|tokens in one step" "$OUT/bench.log"
