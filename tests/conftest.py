"""Shared fixtures: the compiled runtime, compiler availability, opt-in runs."""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Test helpers (covering.py, fwd_cases.py, ...) import by plain name; with
# --import-mode=importlib pytest does not put this folder on sys.path itself.
sys.path.insert(0, str(Path(__file__).resolve().parent))
BENCHMARKS = REPO / "benchmarks"


def benchmark_script(name: str):
    """benchmarks/<name>.py loaded as a module (cc1d_<name>), with benchmarks/ on sys.path
    first, so that its sibling imports (timing, peers, bench_moves, ...) resolve as when it
    is run as a script."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"cc1d_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_addoption(parser):
    parser.addoption("--all-variants", action="store_true", default=False,
                     help="compile and GPU-validate every valid variant of every family")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--all-variants"):
        return
    skip = pytest.mark.skip(reason="opt-in: run with --all-variants")
    for item in items:
        if "all_variants" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def rt():
    from cc1d._runtime import runtime
    return runtime()


@pytest.fixture
def clean_rt():
    """The runtime with no caller tuning DB, an empty decision memo and, after the test, no
    log handler, set so again when the test ends: a dispatch test sees only the DBs it names.
    Modules of such tests take it as their `rt`."""
    from cc1d._runtime import runtime
    rt = runtime()
    rt.set_tuning_dbs([])
    rt.clear_dispatch_cache()
    yield rt
    rt.set_log_handler(None)
    rt.set_tuning_dbs([])
    rt.clear_dispatch_cache()


_TRIVIAL = 'extern "C" __global__ void cc1d_kernel(float* p) { p[threadIdx.x] = 1.0f; }\n'


@pytest.fixture(scope="session")
def nvrtc(rt):
    """Skips unless NVRTC can compile for sm_90 on this machine."""
    try:
        rt.compile(_TRIVIAL, "sm_90")
    except RuntimeError as exc:
        pytest.skip(f"NVRTC not usable here: {exc}".splitlines()[0])
    return rt


@pytest.fixture
def nvrtc_rt(monkeypatch, tmp_path):
    """The runtime with a fresh compile cache, where it compiles for sm_90 (NVRTC); else a skip."""
    monkeypatch.setenv("CC1D_CACHE_DIR", str(tmp_path / "cache"))
    try:
        from cc1d._runtime import runtime
        rt = runtime()
        rt.compile(_TRIVIAL, "sm_90")
    except (ImportError, RuntimeError) as exc:
        pytest.skip(f"runtime/NVRTC not usable here: {str(exc).splitlines()[0]}")
    return rt


def rocm_trixie_script() -> Path | None:
    """../shared/tools/rocm-trixie.sh (or $CC1D_ROCM_TRIXIE_SH): Debian 13's hipRTC 5.7."""
    env = os.environ.get("CC1D_ROCM_TRIXIE_SH")
    candidates = [Path(env)] if env else []
    candidates += [REPO.parent / "shared" / "tools" / "rocm-trixie.sh",
                   REPO / "shared" / "tools" / "rocm-trixie.sh"]
    return next((c for c in candidates if c.is_file()), None)


@pytest.fixture(scope="session")
def trixie():
    """rocm-trixie.sh, set up; skips where it is missing or its setup fails (no hipRTC
    that knows gfx942)."""
    import subprocess
    script = rocm_trixie_script()
    if script is None:
        pytest.skip("rocm-trixie.sh not found (set CC1D_ROCM_TRIXIE_SH): no hipRTC that knows gfx942")
    setup = subprocess.run(["bash", str(script), "setup"], capture_output=True, text=True)
    if setup.returncode:
        pytest.skip(f"rocm-trixie.sh setup failed: {setup.stderr.strip()[-500:]}")
    return script


def pythonpath_with(folder) -> str:
    """A child process's PYTHONPATH: `folder` first, then the caller's own (a cc1d found
    through it must stay importable there)."""
    return os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)


def lock_path(name: str) -> Path:
    """The file one_process_at_a_time(name) locks: in the temp folder, per user."""
    return Path(tempfile.gettempdir()) / f"cc1d-tests-{os.getuid()}-{name}.lock"


@contextlib.contextmanager
def one_process_at_a_time(name: str):
    """An exclusive lock on lock_path(name), shared by every process of this user
    (pytest-xdist workers among them)."""
    with open(lock_path(name), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# Below this many selected tests in a module, its setup compiles nothing ahead: a few tests
# (device_tune.sh's `-k <new variants>`) compile their own kernels, where the module's whole
# catalog is a fixed cost (session 71 on a fresh H200: 12 such tests took 111 s, 61 took 112).
PRECOMPILE_MIN_TESTS = 40


def selected_in_module(request) -> int:
    """How many of the session's selected tests (after -k and -m) a module-scoped fixture's
    module holds."""
    return sum(1 for item in request.session.items if item.getparent(pytest.Module) is request.node)


def worth_precompiling(request) -> bool:
    return selected_in_module(request) >= PRECOMPILE_MIN_TESTS


def precompile(rt, sources, target: str, options: list[str] | None = None) -> None:
    """Fill the runtime's compile cache in parallel (compile() releases the GIL), so
    GPU tests that then launch many variants do not compile them one by one.
    One process compiles at a time: under pytest-xdist the first worker fills the
    shared disk cache and the others then load from it, where all of them compiling
    the same ~1000 forward sources at once (14 workers on 16 cores) took longer than
    a whole device call."""
    from concurrent.futures import ThreadPoolExecutor
    unique = list(dict.fromkeys(sources))
    with one_process_at_a_time(f"precompile-{target}"), \
            ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        list(pool.map(lambda s: rt.compile(s, target, *([options] if options else [])), unique))
