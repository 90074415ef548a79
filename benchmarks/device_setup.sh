# Sourced by the device scripts (device_check.sh, device_tune.sh), from the checkout's root on
# the GPU machine: the packages missing there, travelling as wheels in .whl/ (see the device
# README), on PYTHONPATH; `build_cc1d` installs this checkout (again after a change to its
# tuning DB: the package holds a copy); `install_peer NAME` installs causal-conv1d's wheel
# from $PEER_WHEELS (default .peer, benchmarks/build_peer_wheel.sh) where there is one.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi

build_cc1d() {
  python3 -m pip install -q --no-build-isolation --no-deps . >/tmp/cc1d-build.log 2>&1 \
    || { tail -40 /tmp/cc1d-build.log; exit 1; }
}

install_peer() {
  local wheels=${PEER_WHEELS:-.peer}
  compgen -G "$wheels/causal_conv1d-*.whl" >/dev/null || return 0
  python3 -m pip install -q --no-deps "$wheels"/causal_conv1d-*.whl >/tmp/cc1d-peer-install.log 2>&1 \
    || { tail -20 /tmp/cc1d-peer-install.log
         echo "$1: the peer's wheel did not install; benchmarks run without it"; }
}
