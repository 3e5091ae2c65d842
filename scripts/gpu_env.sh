# Sourced by the scripts run on the GPU machine (gpu_bench.sh, gpu_ncu_*.sh): the settings they
# share. Runs from the repository root, keeps NVLink multicast off, caches compiled kernels, and
# writes into $OUT (the device tool's folder) or results/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export NCCL_NVLS_ENABLE=0
export GRAPHRUN_KERNEL_CACHE="${GRAPHRUN_KERNEL_CACHE:-/tmp/graphrun-kernels}"
out="${OUT:-results}"
NCU=${NCU:-/usr/local/cuda/bin/ncu}
