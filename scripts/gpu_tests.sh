#!/usr/bin/env bash
# GPU tests, in two halves because the GPU machine has no Rust toolchain.
#
#   here:            bash scripts/gpu_tests.sh build     # release test binaries → gpu-bin/ (git-ignored)
#   on the device:   bash scripts/gpu_tests.sh run       # through the `device` tool, carry: ["gpu-bin"]
#
# ONLY="gpu_nvfp4 gpu_parity" limits either half to those binaries.
#
# `run` writes $OUT/gpu_tests.log (or results/ when OUT is unset); commit it as
# results/gpu-tests.log. Leave the GPU's settings alone; NCCL_NVLS_ENABLE=0 stays set.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
# gpu_real_parity skips unless GRAPHRUN_REAL_PARITY names its fixture (scripts/gpu_real_parity.sh).
TESTS=(gpu_kernels gpu_layout gpu_gdn gpu_attention gpu_moe gpu_nvfp4 gpu_parity gpu_e2e gpu_speculative gpu_real_parity)
if [ -n "${ONLY:-}" ]; then read -r -a TESTS <<<"$ONLY"; fi

case "${1:-}" in
build)
    mkdir -p gpu-bin
    for t in "${TESTS[@]}"; do
        exe=$(cargo test --release --test "$t" --no-run --message-format=json 2>/dev/null |
            python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])')
        cp "$exe" "gpu-bin/$t"
        echo "gpu-bin/$t <- $exe"
    done
    ;;
run)
    out="${OUT:-results}"  # on the device machine $OUT comes back; copy it to results/gpu-tests.log
    log="$out/gpu_tests.log"
    {
        echo "# graphrun GPU tests"
        echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "# command: ${ONLY:+ONLY=\"$ONLY\" }bash scripts/gpu_tests.sh run"
        echo "# commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
        export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels
        # Every binary runs even when one fails, so that one run shows every failure.
        failed=()
        for t in "${TESTS[@]}"; do
            echo "## $t"
            "./gpu-bin/$t" --nocapture --test-threads=1 || failed+=("$t")
        done
        echo "## failed: ${failed[*]:-none}"
        [ ${#failed[@]} -eq 0 ]
    } 2>&1 | tee "$log"
    ;;
*)
    echo "usage: $0 build|run" >&2
    exit 2
    ;;
esac
