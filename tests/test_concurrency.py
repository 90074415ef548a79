"""Concurrency and the compile cache (issue 8, items 4 and 5): many threads deciding
and compiling at once compile each source once (dispatch_stats()["compiles"]);
several processes share the on-disk cache and agree byte for byte; a truncated
or corrupted cache file is detected by its hash and rebuilt.

CPU tests (NVRTC compiles here, no GPU needed); the GPU launch test carries the
gpu marker. Every source is made unique (a fresh comment) so no earlier run's
cache can satisfy it, and processes use their own CC1D_CACHE_DIR.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

TARGET = "sm_90"


def unique_sources(n: int) -> list[str]:
    tag = uuid.uuid4().hex
    return [f'// {tag} {i}\nextern "C" __global__ void cc1d_kernel(float* p) {{ p[threadIdx.x] = {i}.0f; }}\n'
            for i in range(n)]


def run_threads(n: int, work) -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            start.wait()
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_threads_compile_each_source_once(nvrtc):
    rt = nvrtc
    sources = unique_sources(3)
    before = rt.dispatch_stats()["compiles"]
    binaries: dict[int, set[bytes]] = {i: set() for i in range(len(sources))}
    lock = threading.Lock()

    def work(seed: int) -> None:
        for k in range(6):
            i = (seed + k) % len(sources)
            b = bytes(rt.compile(sources[i], TARGET)[0])
            with lock:
                binaries[i].add(b)

    run_threads(8, work)
    assert rt.dispatch_stats()["compiles"] - before == len(sources)  # 48 requests, 3 compilations
    assert all(len(b) == 1 for b in binaries.values())


def test_threads_deciding_and_compiling_agree(nvrtc):
    """explain/select from 8 threads while the memo is cleared under them: every
    answer is the one a single thread gets, and the kernels they name compile once."""
    from test_bad_input import ARCH, fwd_call, bwd_call
    rt = nvrtc
    rt.set_tuning_dbs([])
    shapes = [(b, d, l) for b in (1, 3) for d in (16, 200) for l in (1, 77, 4096)]
    calls = [("fwd", fwd_call(sizes=(b, d, l, 4), layout=lay)) for b, d, l in shapes for lay in ("cf", "cl")]
    calls += [("bwd", bwd_call(sizes=(b, d, l, 3), layout=lay)) for b, d, l in shapes for lay in ("cf", "cl")]

    def ask(op, a):
        return (rt.explain_fwd(*a, 0, ARCH) if op == "fwd" else rt.explain_bwd(*a, arch=ARCH))["variant"]

    rt.clear_dispatch_cache()
    want = [ask(op, a)["key"] for op, a in calls]
    # Unique copies of the named sources, so this test's compilations are counted from zero.
    tag = f"// {uuid.uuid4().hex}\n"
    sources = {v["key"]: tag + v["source"] for v in (ask(op, a) for op, a in calls)}
    before = rt.dispatch_stats()["compiles"]

    def work(seed: int) -> None:
        for k in range(len(calls)):
            i = (seed * 5 + k) % len(calls)
            op, a = calls[i]
            if k % 7 == seed % 7:
                rt.clear_dispatch_cache()
            v = ask(op, a)
            assert v["key"] == want[i]
            if k % 4 == 0:
                rt.compile(sources[v["key"]], TARGET)

    run_threads(8, work)
    compiled = rt.dispatch_stats()["compiles"] - before
    assert 0 < compiled <= len(sources)  # each distinct source at most once
    rt.clear_dispatch_cache()


# ---- processes sharing one disk cache --------------------------------------------------

_COMPILE_SCRIPT = r"""
import hashlib, json, sys
from cc1d import _cc1d as rt
logs = []
rt.set_log_handler(logs.append)
sources = json.loads(sys.argv[1])
digests = [hashlib.sha256(bytes(rt.compile(s, "sm_90")[0])).hexdigest() for s in sources]
print(json.dumps({"digests": digests, "stats": dict(rt.dispatch_stats()), "logs": logs}))
"""


def compile_in_processes(sources: list[str], cache: Path, n: int) -> list[dict]:
    env = {**os.environ, "CC1D_CACHE_DIR": str(cache), "CC1D_LOG": ""}
    env.pop("CC1D_DISABLE_DISK_CACHE", None)
    procs = [subprocess.Popen([sys.executable, "-P", "-c", _COMPILE_SCRIPT, json.dumps(sources)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(n)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr
        out.append(json.loads(stdout.splitlines()[-1]))
    return out


def cache_files(cache: Path) -> list[Path]:
    return sorted((cache / "kernels" / TARGET).glob("*"))


def test_processes_share_the_disk_cache(nvrtc, tmp_path):
    sources = unique_sources(3)
    cache = tmp_path / "cache"
    first = compile_in_processes(sources, cache, 3)  # at once: each may compile; all must agree
    assert len({tuple(r["digests"]) for r in first}) == 1
    assert all(r["logs"] == [] for r in first), [r["logs"] for r in first]
    files = cache_files(cache)
    assert [f.suffix for f in files] == [".bin"] * 3, files  # no temp file left behind
    again = compile_in_processes(sources, cache, 2)  # later processes: disk hits only
    assert all(r["stats"]["compiles"] == 0 and r["digests"] == first[0]["digests"] for r in again)


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "empty"])
def test_corrupt_cache_file_is_detected_and_rebuilt(nvrtc, tmp_path, damage):
    sources = unique_sources(2)
    cache = tmp_path / "cache"
    (good,) = compile_in_processes(sources, cache, 1)
    victim = cache_files(cache)[0]
    data = victim.read_bytes()
    if damage == "truncate":
        victim.write_bytes(data[: len(data) // 2])
    elif damage == "flip_byte":
        victim.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    else:
        victim.write_bytes(b"")
    (r,) = compile_in_processes(sources, cache, 1)
    assert r["digests"] == good["digests"]
    assert r["stats"]["compiles"] == 1 and r["stats"]["corrupt_cache_files"] == 1, r
    assert len(r["logs"]) == 1 and "fails its hash check; rebuilding it" in r["logs"][0]
    assert victim.read_bytes() == data  # rewritten whole
    (r,) = compile_in_processes(sources, cache, 1)
    assert r["stats"]["compiles"] == 0 and r["logs"] == []


# ---- GPU: launches from many threads ---------------------------------------------------

@pytest.mark.gpu
def test_threads_launch_through_the_api_at_once():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import cc1d
    from cc1d._runtime import runtime
    runtime().clear_dispatch_cache()
    g = torch.Generator().manual_seed(0)
    jobs = []
    for i in range(16):
        d, l, w = 8 + 13 * i, 50 + 31 * i, 2 + i % 7
        layout_cl = i % 2 == 1
        x = torch.randn(2, d, l, generator=g).to(torch.bfloat16).cuda()
        if layout_cl:
            x = x.transpose(1, 2).contiguous().transpose(1, 2)
        jobs.append((x, torch.randn(d, w, generator=g).cuda(), torch.randn(d, generator=g).cuda()))
    results: dict[int, torch.Tensor] = {}

    def work(seed: int) -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for k in range(len(jobs)):
                i = (seed + k) % len(jobs)
                out = cc1d.causal_conv1d_fn(*jobs[i], activation="silu")
                stream.synchronize()
                if seed == i:
                    results[i] = out

    run_threads(8, work)
    for i, out in results.items():
        x, w, b = jobs[i]
        want = cc1d.causal_conv1d_ref(x.double(), w.double(), b.double(), activation="silu")
        err = float(torch.linalg.vector_norm(out.double() - want) / torch.linalg.vector_norm(want))
        assert err < 3e-2, (i, err)
    stats = runtime().dispatch_stats()
    assert stats["loads"] >= 1
    keys = {cc1d.explain(*j, activation="silu")["key"] for j in jobs}
    before = runtime().dispatch_stats()
    run_threads(4, work)  # everything decided and loaded: no new decision, compile or load
    after = runtime().dispatch_stats()
    assert (after["loads"], after["compiles"]) == (before["loads"], before["compiles"]), keys
