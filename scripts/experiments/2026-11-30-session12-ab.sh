#!/usr/bin/env bash
# RUN in session 12 (results/2026-11-30-session12-ab-*.log, -summary.log): the narrow router
# 3.6 against 4.5 us a layer (landed); the GDN holds changed nothing (the recurrence's phases the
# same: its latency chain is not the next kernel's weight prefetch); the ring kernel's launches
# past 48 KB failed (the allowance was not rounded as the launcher rounds: fixed in the patch,
# run by 2026-11-30-session12-ring.sh). The router patch is on main now: apply the other two.
# Three experiments of session 11 in one device call.
# Build (here), on a branch:
#   git apply scripts/experiments/patches/2026-11-30-gdn-marks-hold.patch   # GDN marks + holds
#   git apply scripts/experiments/patches/2026-11-30-router-narrow.patch    # the narrow router
#   git apply scripts/experiments/patches/2026-11-30-down-ring2.patch       # the ring down kernel
#   (the three apply together and build: checked at the end of session 11)
#   cargo build --release && bash scripts/gpu_tests.sh build && cp target/release/graphrun gpu-bin/ && strip gpu-bin/*
#   (with the GDN patch the text test every_kernel_waits_for_its_producers_before_touching_memory
#   fails: its phase mark 0 is taken before the wait, on purpose; nothing else does)
# Then: gpu_moe (the narrow router against the reference on every router check; the ring down
# kernel against the rows kernel bit for bit and the CPU) and the decode timeline at 8 layers, 8k
# context, alternating: main's behaviour (the general router, the GDN recurrence's trigger at its
# wait, the rows down kernel), the narrow router, the recurrence's trigger after its step 2
# (hold 1) and after its norm (hold 2), the ring down kernel (helper-written, never run: if
# gpu_moe fails, drop its runs; if the ring's first launch fails inside graph capture, see
# the patch's device.rs: the shared-memory opt-in is set at the first launch). GRAPHRUN_MARKS=1 prints the recurrence's phase marks
# (docs/cuda-plan.md, eleventh session, says what they are and what each outcome would mean).
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
./gpu-bin/gpu_moe --nocapture --test-threads=1 >"$OUT/gpu_moe.log" 2>&1; echo "gpu_moe rc $?"
grep -E "test result|panicked" "$OUT/gpu_moe.log"
run() {  # name, then env assignments
    local name=$1; shift
    env "$@" GRAPHRUN_MARKS=1 NAME=trace-$name bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1
    echo "$name trace rc $?"
    rm -f "$OUT/trace-$name.json"
    grep -E "decode timeline" "$OUT/trace-$name.log" | cut -c1-60,150-230
    grep -E "marks slot (1[2-7]):" "$OUT/trace-$name.log"
    grep -E "blk.1.gdn.o_norm|blk.1.attn_res|blk.1.moe.expert_ids|blk.1.moe.shared_h|blk.1.moe.routed moe" "$OUT/trace-$name.log" | cut -c1-130
}
for pass in 1 2; do
    run main GRAPHRUN_ROUTER_GENERAL=1 GRAPHRUN_GDN_HOLD=0 GRAPHRUN_DOWN_RING=0
    run narrow GRAPHRUN_GDN_HOLD=0 GRAPHRUN_DOWN_RING=0
    run hold1 GRAPHRUN_ROUTER_GENERAL=1 GRAPHRUN_GDN_HOLD=1 GRAPHRUN_DOWN_RING=0
    run hold2 GRAPHRUN_ROUTER_GENERAL=1 GRAPHRUN_GDN_HOLD=2 GRAPHRUN_DOWN_RING=0
    run ring GRAPHRUN_ROUTER_GENERAL=1 GRAPHRUN_GDN_HOLD=0
done
