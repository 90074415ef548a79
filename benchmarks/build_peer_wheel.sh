#!/usr/bin/env bash
# Build Dao-AILab causal-conv1d (the peer the benchmarks time) as a wheel for sm_90 only,
# on any Linux machine with the CUDA toolkit (no GPU needed), for the device's Python and
# torch, so that a device run installs it in seconds instead of building it (~7 minutes):
#   bash benchmarks/build_peer_wheel.sh [OUT_DIR (.peer)] [VERSION (1.7.0)] [TORCH (2.11.0)] [PYTHON (python3.12)]
# On the device:  python3 -m pip install --no-deps OUT_DIR/causal_conv1d-*.whl
# The wheel links against the torch it was built with: TORCH must be the device's version
# (PyPI's torch 2.11.0 is the +cu130 build), and nvcc's CUDA major version torch's.
set -euo pipefail
OUT=$(realpath -m "${1:-.peer}"); VERSION=${2:-1.7.0}; TORCH=${3:-2.11.0}; PY=${4:-python3.12}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# Run it, not just find it: a pyenv shim is found even where that version is not selected.
"$PY" -c 'import sys, venv' >/dev/null 2>&1 || {
  echo "build_peer_wheel: $PY does not run here (the device runs Python 3.12; pass an interpreter's path as PYTHON)" >&2
  exit 2; }
[ -x "$CUDA_HOME/bin/nvcc" ] || { echo "build_peer_wheel: no nvcc under CUDA_HOME=$CUDA_HOME" >&2; exit 2; }
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q "torch==$TORCH" ninja packaging wheel "setuptools<82"
# pip download would run the sdist's setup.py (which imports torch): fetch the file itself.
"$WORK/venv/bin/python" - "$VERSION" "$WORK" <<'PYEOF'
import re, sys, urllib.request
version, work = sys.argv[1], sys.argv[2]
page = urllib.request.urlopen("https://pypi.org/simple/causal-conv1d/").read().decode()
links = re.findall(rf'href="([^"#]+causal_conv1d-{re.escape(version)}\.tar\.gz)', page)
if not links:
    sys.exit(f"build_peer_wheel: no sdist of causal-conv1d {version} on PyPI")
urllib.request.urlretrieve(links[0], f"{work}/peer.tar.gz")
PYEOF
tar xzf "$WORK/peer.tar.gz" -C "$WORK"
cd "$WORK/causal_conv1d-$VERSION"
# Its setup.py names every arch from sm_75 up; the device is sm_90.
grep -q '^    if FORCE_CXX11_ABI:' setup.py || { echo "build_peer_wheel: setup.py layout changed" >&2; exit 3; }
sed -i '/^    if FORCE_CXX11_ABI:/i\    cc_flag = ["-gencode", "arch=compute_90,code=sm_90"]' setup.py
CUDA_HOME="$CUDA_HOME" CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS=${MAX_JOBS:-$(nproc)} \
  "$WORK/venv/bin/pip" wheel -q --no-build-isolation --no-deps -w "$OUT" .
ls -l "$OUT"/causal_conv1d-"$VERSION"-*.whl
