#!/usr/bin/env bash
# Session 9: the GDN normed recurrence at 64 registers a thread (__launch_bounds__(512, 2): ~100
# bytes of spills) so that its block fits beside three of the input projection's blocks and
# starts loading its state earlier: gpu_gdn, gpu_e2e and the decode timeline.
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
for t in gpu_gdn gpu_e2e; do ./gpu-bin/$t --test-threads=1 --nocapture > "$OUT/$t.log" 2>&1; echo "$t rc $?"; grep -E "test result|panicked" "$OUT/$t.log"; done
NAME=trace bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1; echo "trace rc $?"
rm -f "$OUT/trace.json"
grep -E "decode timeline" "$OUT/trace.log" | cut -c1-60,150-230
grep -E "^    blk.(0|1)\.gdn" "$OUT/trace.log" | grep blocks
