#!/usr/bin/env bash
# On the GPU machine: build cc1d, run the gpu tests (extra pytest args pass through)
# and every benchmark docs/PERFORMANCE.md is written from (bench_python_path.py besides: the
# Python side's pieces). Logs and JSON go to $OUT (the device tool's folder) or /tmp/cc1d-out.
# The peer times beside cc1d where its wheel (benchmarks/build_peer_wheel.sh) is in $PEER_WHEELS
# (default .peer). Then, on the CPU machine: perf_report.py --fwd ... --out docs (or docs/<device>).
#   bash benchmarks/device_check.sh [pytest args...]
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/cc1d-out}; mkdir -p "$OUT"
# Packages missing on the device travel as wheels in .whl/ (see the device README).
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-build-isolation --no-deps . >"$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
PEER_WHEELS=${PEER_WHEELS:-.peer}
if compgen -G "$PEER_WHEELS/causal_conv1d-*.whl" >/dev/null; then
  python3 -m pip install -q --no-deps "$PEER_WHEELS"/causal_conv1d-*.whl >"$OUT/peer_install.log" 2>&1 \
    || echo "device_check: the peer's wheel did not install (see $OUT/peer_install.log); benchmarks run without it"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -P -m pytest -q -m gpu -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu_tests.log" | tail -60
if [ -z "${SKIP_BENCH:-}" ]; then
  python3 benchmarks/bench_fwd.py --out "$OUT/bench_fwd.json" 2>&1 | tee "$OUT/bench_fwd.log"
  python3 benchmarks/bench_bwd.py --out "$OUT/bench_bwd.json" 2>&1 | tee "$OUT/bench_bwd.log"
  python3 benchmarks/bench_overhead.py --out "$OUT/bench_overhead.json" 2>&1 | tee "$OUT/bench_overhead.log"
  python3 benchmarks/bench_python_path.py --out "$OUT/bench_python_path.json" 2>&1 | tee "$OUT/bench_python_path.log"
  python3 benchmarks/bench_varlen.py --out "$OUT/bench_varlen.json" 2>&1 | tee "$OUT/bench_varlen.log"
  python3 benchmarks/bench_update.py --indices --out "$OUT/bench_update.json" 2>&1 | tee "$OUT/bench_update.log"
fi
