#!/usr/bin/env bash
# Session 9: the routed experts' gate/up kernel releases the down kernel at its start (release_dependents_early), before its
# own wait: gpu_moe, gpu_e2e and the decode timeline.
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
for t in gpu_moe gpu_e2e; do ./gpu-bin/$t --test-threads=1 --nocapture > "$OUT/$t.log" 2>&1; echo "$t rc $?"; grep -E "test result|panicked" "$OUT/$t.log"; done
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline" "$OUT/trace.log" | cut -c1-60,150-230
grep -E "^  moe_experts" "$OUT/trace.log" | head -2
grep -E "^    blk.(0|1)\.moe" "$OUT/trace.log" | grep blocks
