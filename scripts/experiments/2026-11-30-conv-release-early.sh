#!/usr/bin/env bash
# Session 9: the GDN conv's decode kernel releases the recurrence before its own wait
# (release_dependents_early), so the recurrence's blocks load their state while the projection
# drains: gpu_gdn, gpu_e2e (replay vs eager, programmatic launch on/off) and the timeline.
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
for t in gpu_gdn gpu_e2e; do ./gpu-bin/$t --test-threads=1 --nocapture > "$OUT/$t.log" 2>&1; echo "$t rc $?"; grep -E "test result|panicked" "$OUT/$t.log"; done
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline" "$OUT/trace.log" | cut -c1-60,150-230
grep -E "^  (linear_group|causal_conv|gdn_normed)" "$OUT/trace.log" | head -3
grep -E "^    blk.(0|1)\.gdn" "$OUT/trace.log" | grep blocks
grep -E "released out of order" "$OUT/trace.log"
