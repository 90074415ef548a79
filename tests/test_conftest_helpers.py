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
