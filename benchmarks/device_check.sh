#!/usr/bin/env bash
# On the GPU machine: build cc1d, run the gpu tests (extra pytest args pass through)
# and every benchmark docs/PERFORMANCE.md is written from (bench_python_path.py besides: the
# Python side's pieces) and bench_near.py (lengths around a tuned one). $OUT (the device tool's
# folder, default /tmp/cc1d-out) gets eight files, as many as the device tool brings back: one log
# (device_check.log: the gpu tests' last 150 lines and every benchmark's output) and the seven benchmark JSONs;
# the build's and the peer's install logs stay in /tmp (their tails are printed when they fail).
# The peer times beside cc1d where its wheel (benchmarks/build_peer_wheel.sh) is in $PEER_WHEELS
# (default .peer). Then, on the CPU machine: perf_report.py --fwd ... --out docs (or docs/<device>).
# A device call runs 10 minutes at most: split the run, SKIP_BENCH=1 for the tests alone (a
# -k subset each call), SKIP_TESTS=1 for the benchmarks alone.
#   [SKIP_TESTS=1 | SKIP_BENCH=1] bash benchmarks/device_check.sh [pytest args...]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cc1d-out}; mkdir -p "$OUT"
source benchmarks/device_setup.sh  # .whl/ wheels, build_cc1d, install_peer
LOG="$OUT/device_check.log"
build_cc1d
install_peer device_check
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$LOG"
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -P -m pytest -q -m gpu -p no:cacheprovider "$@" >/tmp/cc1d-gpu-tests.log 2>&1
  tail -150 /tmp/cc1d-gpu-tests.log | tee -a "$LOG"
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  for bench in fwd bwd overhead python_path varlen near; do
    echo "== bench_$bench" | tee -a "$LOG"
    python3 "benchmarks/bench_$bench.py" --out "$OUT/bench_$bench.json" 2>&1 | tee -a "$LOG"
  done
  echo "== bench_update --indices" | tee -a "$LOG"
  python3 benchmarks/bench_update.py --indices --out "$OUT/bench_update.json" 2>&1 | tee -a "$LOG"
fi
