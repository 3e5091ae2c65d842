#!/usr/bin/env bash
# The whole model against transformers at the real geometry with a ~9000-token prompt
# (tests/gpu_real_parity.rs), on the GPU machine: the fixture is made there by
# scripts/make_real_parity_fixture.py (too big to commit: ~24 GB bf16 + ~9.5 GB NVFP4 at 512
# experts), then the test binary built here reads it.
#
#   here:            ONLY=gpu_real_parity bash scripts/gpu_tests.sh build   # -> gpu-bin/gpu_real_parity
#   on the device:   bash scripts/gpu_real_parity.sh [all|fixture|test [FILTER]]   # carry: ["gpu-bin"]
#
# `fixture` writes the folder (default /tmp/graphrun-real-parity; GRAPHRUN_REAL_PARITY sets it;
# FIXTURE_ARGS="--experts 64" and the like are passed to the script); run again, it skips the
# steps already done, so a run cut short by a time limit goes on. `test` runs the four tests
# (FILTER: one of bf16_on_cuda, bf16_on_the_cpu, nvfp4_on_cuda, nvfp4_on_the_cpu, or a part of
# a name). `all` (the default) does both. Writes $OUT/real_parity_<stage>.log (or results/) and
# copies the fixture's meta.json beside it; commit the fixture log as a section of
# results/fixtures.log and the test log as a section of results/gpu-tests.log.
source "$(dirname "$0")/gpu_env.sh"
export GRAPHRUN_REAL_PARITY="${GRAPHRUN_REAL_PARITY:-/tmp/graphrun-real-parity}"
stage="${1:-all}"
filter="${2:-}"
case "$stage" in
all | fixture | test) ;;
*)
    echo "usage: $0 [all|fixture|test [FILTER]]" >&2
    exit 2
    ;;
esac
log="$out/real_parity_$stage.log"
{
    echo "# graphrun real-geometry parity: $stage"
    echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# command: ${FIXTURE_ARGS:+FIXTURE_ARGS=\"$FIXTURE_ARGS\" }bash scripts/gpu_real_parity.sh $*"
    echo "# commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "# fixture: $GRAPHRUN_REAL_PARITY"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    echo "# host: $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2 " GiB memory"}'), $(df -h /tmp | awk 'NR == 2 {print $4 " free on /tmp"}')"
    if [ "$stage" != test ]; then
        echo "## fixture"
        TIMEFORMAT="fixture: %R s"
        # shellcheck disable=SC2086  # FIXTURE_ARGS is a list of arguments
        time python3 scripts/make_real_parity_fixture.py --out "$GRAPHRUN_REAL_PARITY" ${FIXTURE_ARGS:-}
        du -sh "$GRAPHRUN_REAL_PARITY"/* || true
    fi
    if [ "$stage" != fixture ]; then
        echo "## test"
        TIMEFORMAT="test: %R s"
        # shellcheck disable=SC2086  # no filter: every test
        time ./gpu-bin/gpu_real_parity --nocapture --test-threads=1 $filter
    fi
} 2>&1 | tee "$log"
cp "$GRAPHRUN_REAL_PARITY/meta.json" "$out/real_parity_meta.json" 2>/dev/null || true
