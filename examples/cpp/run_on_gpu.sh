#!/usr/bin/env bash
# On the GPU machine: build the C++ example with cc1d's CMake build (no Python
# package needed at run time) and run it. Arguments go to the example, e.g.
#   bash examples/cpp/run_on_gpu.sh --batch 8 --dim 5120 --seqlen 2048 --layout cl
# The repository's tuning_db/<arch>.db is the shipped DB it reads (CC1D_PACKAGE_DIR).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/example}
cmake -S . -B "$BUILD" -DCC1D_BUILD_EXAMPLES=ON -DCC1D_BUILD_PYTHON=OFF -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$(command -v python3)" >"${OUT:-/tmp}/example-cmake.log" 2>&1 \
  || { tail -30 "${OUT:-/tmp}/example-cmake.log"; exit 1; }
grep -F "cc1d examples: skipped" "${OUT:-/tmp}/example-cmake.log" && exit 1
cmake --build "$BUILD" -j --target cc1d_forward >>"${OUT:-/tmp}/example-cmake.log" 2>&1 \
  || { tail -30 "${OUT:-/tmp}/example-cmake.log"; exit 1; }
CC1D_PACKAGE_DIR=${CC1D_PACKAGE_DIR:-$PWD} exec "$BUILD/examples/cpp/cc1d_forward" "$@"
