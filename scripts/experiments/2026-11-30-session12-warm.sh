#!/usr/bin/env bash
# Session 12: does a latency-bound kernel wait on instruction fetch? The hyper-connection read's
# two kernels run their body once before their wait, storing nothing (GRAPHRUN_WARM_CODE=1: the
# body is a loop of two passes, one copy of the code, so the second pass finds it in the SM's
# instruction caches; the first also pulls the weights and h into L1/L2). A/B against 0.
# RESULT (results/2026-11-30-session12-warm-*.log): slower (segments 1.37 against 1.275 ms):
# the act kernel's dry pass outlasts its wait (6.2 -> 12.3 us); the gate, whose dry pass fits in
# its wait, 0.8 us faster after its release. Not landed.
# Build: main + patches/2026-11-30-warm-code.patch; cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/ && strip gpu-bin/*
# carry: ["gpu-bin"].
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
GRAPHRUN_WARM_CODE=1 timeout 120 ./gpu-bin/gpu_layout --test-threads=1 >"$OUT/gpu_layout.log" 2>&1; echo "gpu_layout (warm) rc $?"
grep -E "test result|panicked" "$OUT/gpu_layout.log" | head -4
source scripts/experiments/ab_bench.sh
for pass in 1 2 3; do
    bench cold ./gpu-bin/graphrun GRAPHRUN_WARM_CODE=0
    bench warm ./gpu-bin/graphrun GRAPHRUN_WARM_CODE=1
done
for w in 0 1; do
    trace_of warm$w ./gpu-bin/graphrun "^    blk.(1|3)\.(attn|mlp)_hc|^    blk.1.gdn.qkv |^    blk.1.moe.router_logits|exit" GRAPHRUN_WARM_CODE=$w
done
