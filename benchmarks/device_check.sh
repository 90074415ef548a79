#!/usr/bin/env bash
# On the GPU machine: build cc1d, run the gpu tests (extra pytest args pass through)
# and the forward, backward and host-overhead benchmarks (bench_python_path.py: the Python side's
# pieces). Logs go to $OUT (the device tool's folder) or /tmp/cc1d-out.
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
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -P -m pytest -q -m gpu -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu_tests.log" | tail -60
if [ -z "${SKIP_BENCH:-}" ]; then
  python3 benchmarks/bench_fwd.py --out "$OUT/bench_fwd.json" 2>&1 | tee "$OUT/bench_fwd.log"
  python3 benchmarks/bench_bwd.py --out "$OUT/bench_bwd.json" 2>&1 | tee "$OUT/bench_bwd.log"
  python3 benchmarks/bench_overhead.py --out "$OUT/bench_overhead.json" 2>&1 | tee "$OUT/bench_overhead.log"
  python3 benchmarks/bench_python_path.py --out "$OUT/bench_python_path.json" 2>&1 | tee "$OUT/bench_python_path.log"
  python3 benchmarks/bench_varlen.py --out "$OUT/bench_varlen.json" 2>&1 | tee "$OUT/bench_varlen.log"
fi
