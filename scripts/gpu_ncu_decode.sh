#!/usr/bin/env bash
# Per-kernel durations and DRAM throughput of the decode kernels under Nsight Compute, on the GPU
# machine (ncu is at /usr/local/cuda/bin/ncu there; no nsys). ncu runs each kernel alone with
# cold caches, so the times are not a replayed graph's: use them to rank kernels, not to add up.
#
#   here:            cargo build --release && cp target/release/graphrun gpu-bin/
#   on the device:   bash scripts/gpu_ncu_decode.sh      # through the `device` tool, carry: ["gpu-bin"]
#
# Writes $OUT/ncu_decode.csv (raw) and $OUT/ncu_decode.log (by kernel: launches, median µs,
# median DRAM throughput as a percentage of peak), from the first 500 launches of a one-layer bench (weights, a 16-token prefill, decode steps).
source "$(dirname "$0")/gpu_env.sh"
cmd=(./gpu-bin/graphrun bench --layers 1 --contexts 16 --prefills 16 --chunk 16 --decode-steps 4)
"$NCU" --csv --print-units base --launch-count 500 --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    "${cmd[@]}" >"$out/ncu_decode.csv" 2>"$out/ncu_decode.err" || true
{
    echo "# graphrun decode kernels under ncu"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# command: $NCU --csv --print-units base --launch-count 500 --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed ${cmd[*]}"
    python3 - "$out/ncu_decode.csv" <<'PY'
import csv, statistics, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, body = rows[0], rows[1:]
k, m, v = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
by = {}
for r in body:
    name = r[k].split("(")[0]
    by.setdefault(name, {}).setdefault(r[m], []).append(float(r[v].replace(",", "")))
print(f"{'kernel':<48} {'launches':>8} {'median µs':>10} {'DRAM % peak':>12}")
order = sorted(by.items(), key=lambda kv: -statistics.median(kv[1].get("gpu__time_duration.sum", [0])))
for name, ms in order:
    t = ms.get("gpu__time_duration.sum", [0])
    d = ms.get("dram__throughput.avg.pct_of_peak_sustained_elapsed", [0])
    print(f"{name:<48} {len(t):>8} {statistics.median(t) / 1e3:>10.2f} {statistics.median(d):>12.1f}")
PY
} >"$out/ncu_decode.log" 2>&1
tail -5 "$out/ncu_decode.err" || true
