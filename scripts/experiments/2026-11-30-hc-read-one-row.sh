#!/usr/bin/env bash
# Session 7's second device call: the one-kernel hc_read (HcReadAct::one_row) checked against
# the CPU (gpu_layout, gpu_e2e), its timeline against the two-kernel build (gpu-bin/two/, the
# same tree with CHOSEN.one_row false), the handoff and router-phase branches' timelines (their
# first run's logs did not come back), and the headline bench. carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
T=(--layers 8 --contexts 8192 --prefills 16 --trace)
./gpu-bin/gpu_layout --test-threads=1 >"$OUT/gpu_layout.log" 2>&1; echo "gpu_layout rc $?"
grep -E "hc_read.*one_row|test result|panicked|FAIL" "$OUT/gpu_layout.log" | head -20
NAME=trace-one-row bash scripts/gpu_bench.sh "${T[@]}" >/dev/null 2>&1; echo "trace one-row rc $?"
GRAPHRUN_BIN=gpu-bin/two/graphrun NAME=trace-two bash scripts/gpu_bench.sh "${T[@]}" >/dev/null 2>&1; echo "trace two rc $?"
GRAPHRUN_HANDOFF=1 GRAPHRUN_BIN=gpu-bin/handoff/graphrun NAME=trace-handoff bash scripts/gpu_bench.sh "${T[@]}" >/dev/null 2>&1; echo "trace handoff rc $?"
GRAPHRUN_BIN=gpu-bin/router/graphrun NAME=trace-router bash scripts/gpu_bench.sh "${T[@]}" >/dev/null 2>&1; echo "trace router rc $?"
rm -f "$OUT"/trace-*.json
for f in "$OUT"/trace-*.log; do echo "== $f"; grep -E "decode timeline|^  hc_read|^  moe_router" "$f" | head -4; grep -E "blk.4.(attn|mlp)_hc" "$f" | head -4; tail -3 "$f" | grep -i error; done
./gpu-bin/gpu_e2e --test-threads=1 >"$OUT/gpu_e2e.log" 2>&1; echo "gpu_e2e rc $?"
grep -E "test result|panicked" "$OUT/gpu_e2e.log"
bash scripts/gpu_bench.sh >/dev/null 2>&1; echo "bench rc $?"
grep -E "^ +(1024|8192) |dense parts in the replayed|greedy decode at|tokens in one step" "$OUT/bench.log"
