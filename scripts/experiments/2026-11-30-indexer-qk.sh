#!/usr/bin/env bash
# Session 7: IndexerSelectQk (the indexer over its projection) and hc_read_gate_s's up chunks in
# registers before the wait: the GPU tests they touch, then the timeline against the build
# before them (gpu-bin/two/). carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
T=(--layers 8 --contexts 8192 --prefills 16 --trace)
for t in gpu_attention gpu_layout gpu_e2e; do ./gpu-bin/$t --test-threads=1 >"$OUT/$t.log" 2>&1; echo "$t rc $?"; grep -E "test result|panicked" "$OUT/$t.log" | head -3; done
grep -E "indexer_select_qk" "$OUT/gpu_attention.log" | tail -3
run() { GRAPHRUN_BIN=$2 NAME=$1 bash scripts/gpu_bench.sh "${T[@]}" >/dev/null 2>&1; echo "$1 rc $?"; rm -f "$OUT/$1.json"
    grep -E "decode timeline" "$OUT/$1.log" | cut -c1-60,150-230; grep -E "^    blk.3.(qsa|mlp_hc)\." "$OUT/$1.log" | grep blocks; }
run trace-before gpu-bin/two/graphrun
run trace-after gpu-bin/graphrun
