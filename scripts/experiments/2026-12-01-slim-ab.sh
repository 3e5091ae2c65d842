#!/usr/bin/env bash
# PREPARED in session 12, NOT RUN (the device budget was spent): two latency-bound decode
# kernels without the paths the decode shape never takes (less code to fetch; the lesson of the
# router and the hyper-connection gate, docs/cuda-plan.md's twelfth session):
#   patches/2026-12-01-conv-step1.patch          causal_conv_step1_f32: 344 SASS instructions
#                                                against causal_conv_step_f32's 1328
#   patches/2026-12-01-shared-write-short.patch  moe_shared_write_short_*: 520 against the
#                                                general kernel's 2112 (bf16)
# They touch different files and apply together (checked); both build, the kernel text test
# passes here. Build: main's binary into gpu-bin/head/ (a worktree with its own target dir),
# then on a branch `git apply` both, cargo build --release && bash scripts/gpu_tests.sh build &&
# cp target/release/graphrun gpu-bin/ && strip gpu-bin/* gpu-bin/head/*. carry: ["gpu-bin"].
# Runs gpu_gdn (every conv check; step1 at one row of dilation 1) and gpu_kernels (the shared
# write's short form against the CPU and bit-equal to the general kernel), the plain bench at 8
# layers, 8k, head / slim alternating three times, a trace of the slim build, memcheck of the
# tiny model. If a form wins alone, land it alone (each patch stands by itself).
# RESULT (session 13, results/2026-12-01-session13-slim-ab-*.log): correct (gpu_gdn, gpu_kernels,
# memcheck), no gain: segments 1.199 / 1.203 / 1.209 (head) against 1.205 / 1.203 / 1.203 (slim);
# in the timeline causal_conv_step1 2.43 us against 2.56 for the general kernel, the short shared
# write 1.53 against 1.50. Not landed; the patches stay.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
source scripts/experiments/ab_bench.sh
gpu_test_runs gpu_gdn gpu_kernels
for pass in 1 2 3; do
    bench head ./gpu-bin/head/graphrun
    bench slim ./gpu-bin/graphrun
done
trace_of slim ./gpu-bin/graphrun "^    blk.1\.(gdn.qkv_conv|mlp_res)"
memcheck_tiny ./gpu-bin/graphrun
