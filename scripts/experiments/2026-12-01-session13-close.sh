#!/usr/bin/env bash
# Session 13's closing run of main (73ad178: the indexer's staged queries and 4096-score top-k
# chunks), in what device time was left (~380 s): the sanitizers (memcheck, racecheck: the
# score kernel's new shared-memory staging), the timeline at 8 layers, 8k, then the GPU tests
# the indexer's A/B run did not already pass on the same kernels (gpu_attention and gpu_e2e
# passed there: results/2026-12-01-session13-indexer-gpu_*.log).
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/closing_checks.sh
sanitize_check
trace_check "^    blk.7\.qsa"
for t in gpu_kernels gpu_moe gpu_layout gpu_gdn; do
    timeout 100 ./gpu-bin/$t --test-threads=1 >"$OUT/$t.log" 2>&1; echo "$t rc $?"
    grep -E "test result|panicked" "$OUT/$t.log"
done
