"""Graph-timed device time and the copy ceiling, as ANCHORS.md measures them.

Each measured function is captured N times in a CUDA graph, each capture on
the next of several input sets (rotated so the working set exceeds L2), and
the graph's replays are timed with CUDA events; the median per call is kept.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import torch

ROTATE_BYTES = 256 << 20  # working set that defeats the 50-60 MB L2
MAX_SETS = 8192           # a decode step at batch 1 moves ~80 KB: ~3300 sets reach ROTATE_BYTES


def n_buffers(bytes_per_set: int) -> int:
    """Input sets whose total reaches ROTATE_BYTES (ANCHORS.md's method: every call finds
    its inputs outside L2), at least 2."""
    return max(2, min(MAX_SETS, -(-ROTATE_BYTES // max(bytes_per_set, 1))))


def graph_time_us(fns: Sequence[Callable[[], object]], replays: int = 30,
                  calls_per_graph: int | None = None) -> float:
    """Median device time per call (µs) of cycling through `fns` inside a CUDA graph."""
    calls = calls_per_graph or max(len(fns), 20)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up: compile, allocate, load modules outside the capture
            for fn in fns:    # (twice: a forward plan loads its fixed kernel at its second run)
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def _eager_time_us(fn: Callable[[], object], reps: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / reps)
    return statistics.median(times)


def host_time_us(fn: Callable[[], object], calls: int = 20000, rounds: int = 5) -> float:
    """Median over `rounds` of the wall time per call of `calls` back-to-back eager
    calls, synchronised once at the end: the host's cost per call when the GPU
    keeps up (for tiny kernels it does), else the GPU's."""
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e6 / calls)
    return statistics.median(times)


def copy_ceiling_gbps(nbytes: int = 1 << 30) -> float:
    """Bandwidth of one large device-to-device copy, bytes read + written.

    The best of three ways to copy: a memcpy node inside a graph can run on the
    copy engines, slower than the SM copy kernel eager mode uses, and the
    ceiling must not flatter the kernels judged against it."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(300):  # about a second of copies: clocks leave idle before we measure
        dst.copy_(src)
    times = [graph_time_us([lambda: dst.copy_(src)], replays=30, calls_per_graph=10),
             _eager_time_us(lambda: dst.copy_(src)),
             _eager_time_us(lambda: torch.mul(src, 1.0, out=dst))]
    return 2 * nbytes / (min(times) * 1e-6) / 1e9
