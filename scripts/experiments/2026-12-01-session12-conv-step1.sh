#!/usr/bin/env bash
# PREPARED in session 12, NOT RUN (the device budget was spent): apply
# patches/2026-12-01-conv-step1.patch on main (it builds; the text test passes locally), build
# main's binary into gpu-bin/head/ from a worktree (its own target dir), then this one.
# The decode convolution's own kernel (causal_conv_step1_f32, 344 SASS
# instructions against causal_conv_step_f32's 1328) against the commit before (gpu-bin/head/),
# alternating twice; gpu_gdn (every conv check, step1 at one row of dilation 1); memcheck of the
# tiny model. Build as 2026-11-30-session12-gate-early.sh. carry: ["gpu-bin"].
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
timeout 60 ./gpu-bin/gpu_gdn --test-threads=1 >"$OUT/gpu_gdn.log" 2>&1; echo "gpu_gdn rc $?"
grep -E "test result|panicked" "$OUT/gpu_gdn.log"
bench() {  # name, binary
    NAME=bench-$1 GRAPHRUN_BIN=$2 timeout 60 bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 >/dev/null 2>&1
    echo "$1 rc $? $(grep -h "dense parts in the replayed" "$OUT/bench-$1.log" | grep -o '0\.[0-9]* of copy' | tr '\n' ' ') | $(grep -hE '^ +8192 ' "$OUT/bench-$1.log" | head -1 | tr -s ' ')"
    rm -f "$OUT/bench-$1.json"
}
for pass in 1 2; do
    bench head ./gpu-bin/head/graphrun
    bench step1 ./gpu-bin/graphrun
done
timeout 40 /usr/local/cuda/bin/compute-sanitizer --tool memcheck ./gpu-bin/graphrun run --model models/tiny-qwen4exp --prompt "the cat sat on the mat ." --max-new-tokens 4 --device cuda >"$OUT/memcheck.log" 2>&1
echo "memcheck rc $?"; grep -E "ERROR SUMMARY" "$OUT/memcheck.log"
