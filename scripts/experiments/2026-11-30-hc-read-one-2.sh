#!/usr/bin/env bash
# (Code: branch hc-read-one-experiment, not landed.) The one-launch hyper-connection read, second try (the blocks poll a generation flag with a
# back-off instead of the arrival count; 32-bit staging index math): the layout and
# end-to-end GPU tests (built with HcReadAct::CHOSEN = one_launch(3), so that every decode read of
# the tiny models takes it), then the decode timeline at 8 layers, 8k context, with the by-stream
# pair (s2, the chosen read before) and with one launch at Q = 2, 3, 4 outputs a block.
# gpu-bin/graphrun-{s2,o2,o3,o4}: `cargo build --release` with CHOSEN set to each.
# carry: ["gpu-bin"]; logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export GRAPHRUN_KERNEL_CACHE=/tmp/graphrun-kernels NCCL_NVLS_ENABLE=0
for t in gpu_layout gpu_e2e; do
    echo "## $t"
    ./gpu-bin/$t --nocapture --test-threads=1 >"$OUT/$t.log" 2>&1
    echo "rc $?"
    grep -E "hc_read_one|hc_read_o|test result|panicked|FAIL|worst" "$OUT/$t.log" | head -30
done
i=0
for v in s2 o2 o3 o4; do
    i=$((i + 1))
    GRAPHRUN_BIN=./gpu-bin/graphrun-$v NAME=trace-$i-$v bash scripts/gpu_bench.sh --layers 8 --contexts 8192 --prefills 16 --trace >/dev/null 2>&1
    echo "$v trace rc $?"
    rm -f "$OUT/trace-$i-$v.json"
    grep -E "decode timeline" "$OUT/trace-$i-$v.log" | cut -c1-60,150-230
    grep -E "blk.0.(attn|mlp)_hc.x|exit" "$OUT/trace-$i-$v.log" | head -6
done
