#!/usr/bin/env bash
# EXPERIMENT (branch gdn-marks): the GDN normed recurrence's phases inside the replayed decode
# graph (block 0, thread 0, %globaltimer): 0 start, 1 past the wait, 2 the state in registers,
# 3 step 1 (q, k normed, v, gates; barrier), 4 step 2 (the recurrence; barrier), 5 the norm,
# 6 back in the kernel, 7 the state stored (a fence). GRAPHRUN_MARKS=1: the bench prints them.
# The code (not on main): git apply scripts/experiments/patches/2026-11-30-gdn-marks-hold.patch
# on a branch, then build graphrun into gpu-bin/. Run: HOLDS="0 1 0 1" (the default) compares the
# trigger at the wait (0, main's) with the trigger after step 2 (1); HOLDS="0 1 2 0 1 2" adds the
# trigger after the norm (2). Holds 1 and 2 have NOT run yet (the first try lacked the trace
# record; fixed in the patch, then the device budget was spent).
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
# Then GRAPHRUN_GDN_HOLD=1: the recurrence lets the next kernel (the output projection, which
# prefetches 31 MB of weights) launch only after its step 2 instead of at its wait; alternated.
for hold in ${HOLDS:-0 1 0 1}; do
    GRAPHRUN_GDN_HOLD=$hold GRAPHRUN_MARKS=1 NAME=trace-$hold bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "hold $hold trace rc $?"
    rm -f "$OUT/trace-$hold.json"
    grep -E "decode timeline" "$OUT/trace-$hold.log" | cut -c1-60,150-230
    grep -E "marks slot (1[2-7]):" "$OUT/trace-$hold.log"  # the traced graph's six GDN layers here
    grep -E "blk.1.gdn.o_norm|blk.1.attn_res|blk.1.mlp_hc.x hc_read_act" "$OUT/trace-$hold.log" | cut -c1-130
done
