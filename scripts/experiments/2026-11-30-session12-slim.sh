#!/usr/bin/env bash
# Session 12: do the latency-bound kernels wait on instruction fetch? The hyper-connection read's
# kernels in forms without the paths the real shape never takes (GRAPHRUN_HC_SLIM=1): the gate's
# early path alone (hc_read_gate_se_*: 1528 SASS instructions against 3256, no spills against 4
# bytes) and the act kernel's 16-byte path alone (hc_read_act_sv2_*: 544 against 616). A/B
# against 0, three times, then a trace of each. (The narrow router, a quarter of the wide one's
# code, was 0.9 us faster a layer: results/2026-11-30-session12-ab-*.log.)
# Build: main + patches/2026-11-30-hc-slim.patch; cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/ && strip gpu-bin/*
# carry: ["gpu-bin"].
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
for t in gpu_layout gpu_e2e; do GRAPHRUN_HC_SLIM=1 timeout 120 ./gpu-bin/$t --test-threads=1 >"$OUT/$t.log" 2>&1; echo "$t (slim) rc $?"; grep -E "test result|panicked" "$OUT/$t.log" | head -4; done
source scripts/experiments/ab_bench.sh
for pass in 1 2 3; do
    bench full ./gpu-bin/graphrun GRAPHRUN_HC_SLIM=0
    bench slim ./gpu-bin/graphrun GRAPHRUN_HC_SLIM=1
done
for w in 0 1; do
    trace_of slim$w ./gpu-bin/graphrun "^    blk.(1|3)\.(attn|mlp)_hc|^    blk.1.gdn.qkv |^    blk.1.moe.router_logits|exit" GRAPHRUN_HC_SLIM=$w
done
