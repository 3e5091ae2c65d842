#!/usr/bin/env bash
# Session 12: the hyper-connection read of one row in one launch (hc_read_fused_*: the act items,
# a grid barrier, the gate), against the two kernels (GRAPHRUN_HC_FUSED=0).
# RESULT (results/2026-11-30-session12-hc-fused-*.log): correct, and slower: 11-16 us a read
# against 8.9 (segments 1.36 against 1.233 ms). A grid barrier waits for the last block to be
# resident, where two kernels let each block work as it lands. Not landed.
# Build: main + patches/2026-11-30-hc-read-fused.patch; cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/ && strip gpu-bin/*
# carry: ["gpu-bin"]. gpu_layout (every hc_read check at one row takes the fused kernel) and
# gpu_e2e (the model against the CPU), then the plain bench at 8 layers, 8k, fused / not, twice,
# then a trace of the fused, then memcheck of the tiny model (the barrier under the sanitizer).
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
for t in gpu_layout gpu_e2e; do
    timeout 120 ./gpu-bin/$t --nocapture --test-threads=1 >"$OUT/$t.log" 2>&1; echo "$t rc $?"
    grep -E "test result|panicked|hc_read_(s4|s2)_bf16 exit x .*T1 H2560" "$OUT/$t.log" | head -8
done
source scripts/experiments/ab_bench.sh
for pass in 1 2; do
    bench two ./gpu-bin/graphrun GRAPHRUN_HC_FUSED=0
    bench fused ./gpu-bin/graphrun GRAPHRUN_HC_FUSED=1
done
NAME=trace-fused timeout 100 bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1
echo "trace rc $?"; rm -f "$OUT/trace-fused.json"
grep -E "decode timeline" "$OUT/trace-fused.log" | cut -c1-60,150-230
grep -E "^    blk.1\.|exit|lm_head" "$OUT/trace-fused.log" | grep blocks | cut -c1-130
timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool memcheck ./gpu-bin/graphrun run --model models/tiny-qwen4exp --prompt "the cat sat on the mat ." --max-new-tokens 4 --device cuda >"$OUT/memcheck.log" 2>&1
echo "memcheck rc $?"; grep -E "ERROR SUMMARY" "$OUT/memcheck.log"
