"""Graph-timed device time and the copy ceiling, as ANCHORS.md measures them.

Each measured function is captured N times in a CUDA graph, each capture on
the next of several input sets (rotated so the working set exceeds L2), and
the graph's replays are timed with CUDA events; the median per call is kept.
"""
from __future__ import annotations

import json
import statistics
import time
from typing import Callable, Sequence

import torch

ROTATE_BYTES = 256 << 20  # working set that defeats the 50-60 MB L2
MAX_SETS = 8192           # a decode step at batch 1 moves ~80 KB: ~3300 sets reach ROTATE_BYTES
INTERLEAVED = "interleaved"  # a benchmark JSON's "timing" where graph_times_us timed cc1d beside the peer


def n_buffers(bytes_per_set: int) -> int:
    """Input sets whose total reaches ROTATE_BYTES (ANCHORS.md's method: every call finds
    its inputs outside L2), at least 2."""
    return max(2, min(MAX_SETS, -(-ROTATE_BYTES // max(bytes_per_set, 1))))


def _captured(fns: Sequence[Callable[[], object]], calls: int) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of `calls` calls cycling through `fns`, warmed up and replayed once."""
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
    return graph


def _replay_us(graph: "torch.cuda.CUDAGraph", calls: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / calls


def graph_time_us(fns: Sequence[Callable[[], object]], replays: int = 30,
                  calls_per_graph: int | None = None) -> float:
    """Median device time per call (µs) of cycling through `fns` inside a CUDA graph."""
    calls = calls_per_graph or max(len(fns), 20)
    graph = _captured(fns, calls)
    return statistics.median(_replay_us(graph, calls) for _ in range(replays))


def graph_times_us(candidates: dict[str, Sequence[Callable[[], object]]],
                   replays: int = 30, setup: dict[str, Callable[[], object]] | None = None) -> dict[str, float | str]:
    """graph_time_us of several candidates (say cc1d and the peer on the same inputs) with
    their replays interleaved: each round replays every candidate's graph once, the order
    reversed every other round. A device whose speed drifts during a run (clocks, heat,
    other work) then slows each candidate alike, so their ratio holds where back-to-back
    timings drift apart (session 58: the same two kernels measured 0.86-1.12x of each other
    across four runs). A candidate that raises while warming up or being captured gets the
    error's text (its first 200 characters) instead of a time; the others are timed.
    `setup[name]`, where given, runs before that candidate is warmed up and captured
    (bench_moves.py points the dispatcher at another tuning DB there)."""
    graphs: dict[str, tuple] = {}
    out: dict[str, float | str] = {}
    for name, fns in candidates.items():
        calls = max(len(fns), 20)
        try:
            if setup and name in setup:
                setup[name]()
            graphs[name] = (_captured(fns, calls), calls)
        except Exception as exc:  # a peer rejects some layouts or dtypes, or its signature moved
            out[name] = str(exc)[:200] or type(exc).__name__
    times: dict[str, list[float]] = {name: [] for name in graphs}
    order = list(graphs)
    for r in range(replays):
        for name in (order if r % 2 == 0 else order[::-1]):
            graph, calls = graphs[name]
            times[name].append(_replay_us(graph, calls))
    out.update({name: statistics.median(t) for name, t in times.items()})
    return {name: out[name] for name in candidates}


def record_times(row: dict, times: dict[str, float | str], frac: Callable[[float], float],
                 prefixes: dict[str, str] | None = None) -> None:
    """Puts graph_times_us's results into a benchmark row: per candidate `<prefix>_us` and `<prefix>_frac` (the prefix its name unless
    `prefixes` renames it), or `<prefix>_error` where the peer refused the case. Any other
    candidate's failure raises: no row is worth writing."""
    for name, t in times.items():
        prefix = (prefixes or {}).get(name, name)
        if not isinstance(t, str):
            row.update({f"{prefix}_us": t, f"{prefix}_frac": frac(t)})
        elif name == "peer":  # the peer rejects some layouts and dtypes
            row[f"{prefix}_error"] = t
        else:
            where = " ".join(str(row[k]) for k in ("op", "layout", "shape") if k in row)
            raise RuntimeError(f"{name} failed on {where}: {t}")


def run_header(device: str, copy_gbps: float, peer_installed: bool) -> str:
    """The line above a benchmark's table: the device, the copy ceiling, the peer."""
    return (f"\n{device}; copy ceiling {copy_gbps:.0f} GB/s; causal_conv1d "
            f"{'installed' if peer_installed else 'not installed'}\n")


def peer_columns(row: dict, own_us: float, speed_suffix: str = "") -> str:
    """A table row's peer cells (record_times' `peer_us`, `peer_frac`): µs, % of copy, and
    cc1d's speed against it (the peer's time over `own_us`); dashes where it did not run."""
    if "peer_us" not in row:
        return "— | — | —"
    return f"{row['peer_us']:.1f} | {100 * row['peer_frac']:.0f} % | {row['peer_us'] / own_us:.2f}{speed_suffix}"


def write_interleaved_run(path: str, rows: list[dict], **fields: object) -> None:
    """A benchmark's JSON: `fields` (device, copy_gbps, peer_version, ...), the rows, and
    "timing": INTERLEAVED (its cc1d and peer times came from graph_times_us)."""
    with open(path, "w") as fh:
        json.dump(dict(fields, timing=INTERLEAVED, rows=rows), fh, indent=1)


def gpu_and_db(script: str, given, option: str, gpu_free: str) -> tuple:
    """The visible GPU (tuner/device.py DeviceInfo) and the tuning DB a script reads: `given`,
    else this checkout's tuning_db/<arch>.db. SystemExit, naming the script, where no GPU is
    visible (`gpu_free`: what the script can do without one) or there is no such DB
    (`option`: the one that names it)."""
    from pathlib import Path

    from cc1d.tuner.device import probe_device
    device = probe_device()
    if device is None:
        raise SystemExit(f"{script}: no GPU is visible ({gpu_free} needs none)")
    path = given or Path(__file__).resolve().parents[1] / "tuning_db" / f"{device.target}.db"
    if not path.is_file():
        raise SystemExit(f"{script}: no {option} given and no {path} for this GPU's arch")
    return device, path


def write_whole(path, text: str) -> None:
    """`text` at `path` (a pathlib.Path), written whole or not at all (a file beside it,
    then renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write_json(path, doc: dict) -> None:
    """`doc` as JSON at `path`, written whole or not at all: a run that rewrites its results
    after every call (cross_serve.py, bench_moves.py) and is stopped keeps the last whole file."""
    write_whole(path, json.dumps(doc, indent=1))


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
