#!/usr/bin/env bash
# Session 8: ple_mix_f32 with the window column in registers and a block per (stream, 256
# channels). gpu_layout and gpu_e2e, the decode timeline, the headline bench.
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
./gpu-bin/gpu_layout > "$OUT/gpu_layout.log" 2>&1; echo "gpu_layout rc $?"
grep -E "test result|panicked|ple_mix_f32 +T(1|8) H2560|ple_mix_f32 +T3 H64" "$OUT/gpu_layout.log" | head -20
./gpu-bin/gpu_e2e > "$OUT/gpu_e2e.log" 2>&1; echo "gpu_e2e rc $?"
grep -E "test result|panicked" "$OUT/gpu_e2e.log"
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline" "$OUT/trace.log" | cut -c1-60,150-230
grep -E "^    (embed|blk.1\.ple|blk.1\.attn_hc)" "$OUT/trace.log" | grep blocks | cut -c1-110
bash scripts/gpu_bench.sh >/dev/null 2>&1; echo "bench rc $?"
grep -E "^ +(1024|8192) |dense parts in the replayed|greedy decode at|tokens in one step" "$OUT/bench.log"
