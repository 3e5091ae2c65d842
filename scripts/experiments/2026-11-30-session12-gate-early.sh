#!/usr/bin/env bash
# Session 12: the gate's early form as its own kernel (hc_read_gate_se_*, 1520 SASS instructions;
# hc_read_gate_s_* keeps the general form, 2512; the two in one kernel were 3256), against the
# commit before (gpu-bin/head/graphrun), then the closing checks of the change: every GPU test,
# the decode timeline, the default bench, the sanitizers.
# Build: cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/
#   and the commit before's binary into gpu-bin/head/ (a worktree, its own target dir); strip both.
# carry: ["gpu-bin"].
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
bench() {  # name, binary
    NAME=bench-$1 GRAPHRUN_BIN=$2 timeout 100 bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 >/dev/null 2>&1
    echo "$1 rc $? $(grep -h "dense parts in the replayed" "$OUT/bench-$1.log" | grep -o '0\.[0-9]* of copy' | tr '\n' ' ') | $(grep -hE '^ +8192 ' "$OUT/bench-$1.log" | head -1 | tr -s ' ')"
    rm -f "$OUT/bench-$1.json"
}
for pass in 1 2 3; do
    bench head ./gpu-bin/head/graphrun
    bench early ./gpu-bin/graphrun
done
bash scripts/gpu_tests.sh run >/dev/null 2>&1; echo "gpu_tests rc $?"
grep -E "^## |test result|panicked|FAILED" "$OUT/gpu_tests.log" | head -30
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline" "$OUT/trace.log" | cut -c1-60,150-230
grep -E "^    blk.1\.(attn|mlp)_hc|exit.x" "$OUT/trace.log" | grep blocks | cut -c1-130
bash scripts/gpu_bench.sh >/dev/null 2>&1; echo "bench rc $?"
grep -E "^ +(1024|8192) |dense parts in the replayed|greedy decode at|tokens in one step" "$OUT/bench.log"
timeout 170 bash scripts/gpu_sanitize.sh >/dev/null 2>&1; echo "sanitize rc $?"
grep -E "^##|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize.log"
