"""The test suite's own helpers (conftest.py) that the GPU tests lean on."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import lock_path, one_process_at_a_time

# A second process tries the same lock without waiting: exit 0 if it got it, 1 if not.
_TRY = """
import fcntl, sys
with open(sys.argv[1], "a") as fh:
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(1)
"""


def test_one_process_at_a_time_excludes_other_processes_until_released():
    name = f"selftest-{os.getpid()}"
    path = lock_path(name)
    try_lock = [sys.executable, "-c", _TRY, str(path)]
    with one_process_at_a_time(name):
        assert subprocess.run(try_lock).returncode == 1, "another process took the lock while it was held"
    assert subprocess.run(try_lock).returncode == 0, "the lock was not released"
    path.unlink()


# One pytest-xdist worker's precompile: print how many compilations it ran itself.
_WORKER = """
import sys
sys.path.insert(0, sys.argv[1])
from conftest import precompile
from cc1d._runtime import runtime
rt = runtime()
sources = ['extern "C" __global__ void cc1d_kernel(float* p) { p[threadIdx.x] = %d.0f; }' % i for i in range(6)]
precompile(rt, sources, "sm_90")
print(rt.dispatch_stats()["compiles"])
"""


def test_concurrent_precompiles_compile_each_source_once(nvrtc, tmp_path):
    """Two processes precompiling the same sources at once: the one that waits for the
    lock loads the other's binaries from the shared disk cache, so six sources cost six
    compilations in all, not twelve."""
    env = dict(os.environ, CC1D_CACHE_DIR=str(tmp_path))
    env.pop("CC1D_DISABLE_DISK_CACHE", None)
    here = str(Path(__file__).resolve().parent)
    # -P and another cwd: the installed cc1d, not the source folder of a repository root
    procs = [subprocess.Popen([sys.executable, "-P", "-c", _WORKER, here], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
    counts = [int(out.split()[-1]) for out, _ in results]
    assert sorted(counts) == [0, 6], counts


# Two modules, one fixture each recording what selected_in_module counts for it.
_COUNTING = """
import sys
import pytest
sys.path.insert(0, {here!r})
from conftest import selected_in_module, worth_precompiling

@pytest.fixture(scope="module", autouse=True)
def count(request):
    with open({out!r}, "a") as fh:
        fh.write(f"{{request.node.name}} {{selected_in_module(request)}} {{worth_precompiling(request)}}\\n")

@pytest.mark.parametrize("n", range({n}))
def test_case(n):
    pass
"""


def test_a_module_with_few_selected_tests_skips_the_precompile(tmp_path):
    """selected_in_module counts the tests -k left in the fixture's own module; a module
    with fewer than PRECOMPILE_MIN_TESTS selected is not worth precompiling."""
    from conftest import PRECOMPILE_MIN_TESTS
    here, out = str(Path(__file__).resolve().parent), str(tmp_path / "counts")
    n = PRECOMPILE_MIN_TESTS + 5
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / "t" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "t" / name).write_text(_COUNTING.format(here=here, out=out, n=n))
    # -k keeps test_a's cases 1 and 10-19 (11) and every case of test_b
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                          "t", "-k", "test_b or case[1] or case[1"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(Path(out).read_text().splitlines()) == ["test_a.py 11 False", f"test_b.py {n} True"]


def test_benchmark_script_loads_a_script_whose_siblings_import_by_plain_name():
    """prune_runs.py imports bench_moves and cc1d.tuner.guard: loaded through the helper,
    its sibling resolves as when it is run as a script."""
    from conftest import BENCHMARKS, benchmark_script
    prune = benchmark_script("prune_runs")
    assert prune.__name__ == "cc1d_prune_runs" and Path(prune.__file__) == BENCHMARKS / "prune_runs.py"
    assert str(BENCHMARKS) in sys.path and prune.moves_between is sys.modules["bench_moves"].moves_between
