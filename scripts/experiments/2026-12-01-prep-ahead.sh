#!/usr/bin/env bash
# Session 13: GatedAttention's first kernel (gated_attention_prepare_f32) running ahead of the
# indexer's single-block top-k (branch prep-ahead: its head normalised and rotated into shared
# memory before the wait, stored after), and phase marks in the QSA chain's kernels (branch
# qsa-marks, on top of it: block (0,0) thread 0's %globaltimer at each phase, printed by the
# traced bench with GRAPHRUN_MARKS=1). Binaries: gpu-bin/head (main), gpu-bin/ahead
# (prep-ahead, with the GPU tests), gpu-bin/marks (qsa-marks).
# RESULT (results/2026-12-01-session13-prep-ahead-*.log): correct (gpu_attention checks the
# ahead form bit for bit against the unfused kernels, gpu_e2e passes). In the timeline the
# prepare kernel 3.6 -> 1.0 us and the QSA chain ~2.3 us shorter a layer, but the plain bench's
# segments were 1.200 / 1.200 / 1.200 ms (head) against 1.204 / 1.202 / 1.202 (ahead): not
# landed (patches/2026-12-01-prep-ahead.patch). The marks (patches/2026-12-01-qsa-marks.patch,
# on top of it) steered 2026-12-01-indexer.sh: score 1.92 us to its tile, 3.1 in its dot
# products; top-k 0.83 to its first bin, 3.5 more through the cross-chunk path and the first
# radix pass; split 1.3 to q, 4.1 in the K loads and scores, 7.8 to its end (block 0);
# combine 2.05 (block 0).
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
gpu_test_runs gpu_attention gpu_e2e
for pass in 1 2 3; do
    bench head ./gpu-bin/head/graphrun
    bench ahead ./gpu-bin/ahead/graphrun
done
for v in ahead marks; do trace_of $v ./gpu-bin/$v/graphrun "^    blk.7\.qsa" GRAPHRUN_MARKS=1; done
