#!/usr/bin/env bash
# Session 8: the routed experts right after the router, guessing its ids from the logits
# (moe_experts_guessing), and the QSA attention sweeps (branch qsa-attention-sweeps, built into
# gpu-bin/sweeps/). gpu_moe and gpu_e2e on this tree, then the decode timeline and the 8k bench;
# then the sweeps' timelines. carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
./gpu-bin/gpu_moe > "$OUT/gpu_moe.log" 2>&1; echo "gpu_moe rc $?"
grep -E "test result|panicked|FAILED" "$OUT/gpu_moe.log" | head
./gpu-bin/gpu_e2e > "$OUT/gpu_e2e.log" 2>&1; echo "gpu_e2e rc $?"
grep -E "test result|panicked" "$OUT/gpu_e2e.log" | head
NAME=trace-guess bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace-guess.json"
grep -E "decode timeline" "$OUT/trace-guess.log" | cut -c1-60,150-230
grep -E "^    blk.(3|4)\." "$OUT/trace-guess.log" | grep blocks | cut -c1-110
NAME=bench-guess bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 >/dev/null 2>&1; echo "bench rc $?"
rm -f "$OUT/bench-guess.json"
grep -E "^ +8192 |dense parts in the replayed|greedy decode at" "$OUT/bench-guess.log"
if [ -x gpu-bin/sweeps/graphrun ]; then
    for s in 65 130 260; do
        GRAPHRUN_ATTN_SPLITS=$s GRAPHRUN_BIN=gpu-bin/sweeps/graphrun NAME=sweep-s$s bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "sweep $s rc $?"
        rm -f "$OUT/sweep-s$s.json"
        grep -E "decode timeline" "$OUT/sweep-s$s.log" | cut -c1-60,150-230
        grep -E "^    blk.3\.qsa" "$OUT/sweep-s$s.log" | grep blocks | cut -c1-110
    done
    GRAPHRUN_UNGATED_COMBINE=1 GRAPHRUN_BIN=gpu-bin/sweeps/graphrun NAME=sweep-ungated bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "ungated rc $?"
    rm -f "$OUT/sweep-ungated.json"
    grep -E "decode timeline" "$OUT/sweep-ungated.log" | cut -c1-60,150-230
    grep -E "^    blk.3\.qsa" "$OUT/sweep-ungated.log" | grep blocks | cut -c1-110
fi
