#!/usr/bin/env bash
# The routed experts' down kernel with 10 chunks a lane in flight (DOWN_BATCH 10: 8 lanes a
# product, 32 products a block at once, 3 rounds of loads instead of 5; branch down-batch):
# gpu_moe, gpu_kernels and gpu_e2e built with it, then the decode timeline at 8 layers, 8k,
# with it (gpu-bin/graphrun-db10) and without (gpu-bin/graphrun-cand: DOWN_BATCH 5), twice
# each. carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
for t in gpu_moe gpu_kernels gpu_e2e; do
    ./gpu-bin/$t --nocapture --test-threads=1 >"$OUT/$t.log" 2>&1
    echo "$t rc $?"
    grep -E "test result|panicked|down" "$OUT/$t.log" | head -12
done
for v in cand db10 cand db10; do
    GRAPHRUN_BIN=./gpu-bin/graphrun-$v NAME=trace-$v bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1
    echo "$v trace rc $?"
    rm -f "$OUT/trace-$v.json"
    grep -E "decode timeline|dense parts in the replayed" "$OUT/trace-$v.log" | cut -c1-60,150-230
    grep -E "blk.0.moe|blk.0.mlp_res" "$OUT/trace-$v.log" | tail -6 | cut -c1-110
done
