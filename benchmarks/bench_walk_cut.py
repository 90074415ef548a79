"""Times the walked channel-first backward winners of a tuning DB whose own shape the
runtime serves through their walk-cut build (the sequence's end cuts a segment,
dispatch.cpp walk_cut), in that build and in their plain build, beside causal-conv1d.

The walk-cut build came after most of these winners were tuned: the DB's time of such a
winner is its plain build's. This says what the build changed at each one's own shape.
Both builds are validated against the float64 reference first, on NaN-poisoned outputs
(a row that fails the tuner's check is marked, and the exit status is 1), then graph-timed interleaved, the order reversed each
round; the reported time is the fastest round.

    python benchmarks/bench_walk_cut.py [--db tuning_db/sm_90.db] [--rounds 2]
        [--max-calls N] [--deadline-s S] [--json OUT.json]

Without --db, the installed package's shipped DB for the device's arch.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from probe_variants import input_sets, peer_calls
from timing import copy_ceiling_gbps, graph_time_us

import cc1d
from cc1d import _cc1d
from cc1d.generator.variant import walk_cut
from cc1d.tuner.db import TuningDB, winner_shape, winner_variant
from cc1d.tuner.problems import problem_for
from cc1d.tuner.shapes import Shape
from cc1d.tuner.validate import compare


def served_through_walk_cut(db: Path, arch: str) -> list[dict]:
    """The DB's winners of `arch` whose own shape its walk-cut build serves, by family and size."""
    with TuningDB(db, readonly=True) as d:
        rows = [w for w in d.winners(arch) if w["op"] == "bwd"]
    out = []
    for w in sorted(rows, key=lambda w: (w["family_key"], w["batch"] * w["dim"] * w["seqlen"])):
        s = winner_shape(w)
        if winner_variant(w).served_build(s.seqlen, arch, seq_idx=s.seq_idx, final_states=s.final_states) == "walkcut":
            out.append(w)
    return out


def shape_of(w: dict) -> Shape:
    """The winner's shape, which this script times: bias and SiLU its only features."""
    if {f for f in w["features"].split(",") if f} - {"bias", "silu"}:
        raise ValueError(f"{w['shape_key']}: only bias and silu are timed here")
    return winner_shape(w)


def time_winner(w: dict, rounds: int, ceiling: float) -> dict:
    shape = shape_of(w)
    plain = winner_variant(w).as_runtime_dict()
    builds = {"plain": plain, "walkcut": walk_cut(plain)}
    problem = problem_for("bwd")
    nbytes = problem.bytes_moved(shape)
    sets = input_sets(problem, shape)
    ref = problem.reference(shape, sets[0][0])
    stream = torch.cuda.current_stream().cuda_stream
    row = dict(family=w["family_key"], shape=w["shape_key"], variant=w["variant_key"], db_us=w["time_us"])
    fns = {}
    for name, kernel in builds.items():
        inputs = problem.make_inputs(shape, seed=0)
        outputs = problem.make_outputs(shape, inputs)
        problem.launch(_cc1d, kernel, shape, inputs, outputs, stream)
        torch.cuda.synchronize()
        row[f"{name}_problem"] = compare(outputs, ref, shape.x_dtype)  # None: right (no NaN, within tolerance)
        fns[name] = [lambda s=s, kernel=kernel: problem.launch(_cc1d, kernel, shape, s[0], s[1],
                                                               torch.cuda.current_stream().cuda_stream)
                     for s in sets]
    peer = peer_calls(shape, sets)  # causal-conv1d's backward, where it is installed
    if peer is not None:
        fns["peer"] = peer
    times: dict[str, list[float]] = {n: [] for n in fns}
    order = list(fns)
    for r in range(rounds):
        for n in (order if r % 2 == 0 else order[::-1]):
            times[n].append(graph_time_us(fns[n]))
    for n, ts in times.items():
        row[f"{n}_us"] = min(ts)
        row[f"{n}_copy"] = nbytes / min(ts) / 1e3 / ceiling
    row["valid"] = all(row[f"{n}_problem"] is None for n in builds)
    row["speedup"] = row["plain_us"] / row["walkcut_us"]
    return row


def line(r: dict) -> str:
    peer = f"{r['peer_us']:.1f} | {r['peer_us'] / r['walkcut_us']:.2f}x" if "peer_us" in r else "— | —"
    flag = "" if r["valid"] else " INVALID: " + "; ".join(
        f"{n} {r[f'{n}_problem']}" for n in ("plain", "walkcut") if r[f"{n}_problem"])
    return (f"| {r['family']} {r['shape']} | {r['variant'].split('.', 4)[4]} | {r['plain_us']:.1f} "
            f"({100 * r['plain_copy']:.0f} %) | {r['walkcut_us']:.1f} ({100 * r['walkcut_copy']:.0f} %) | "
            f"{r['speedup']:.2f}x | {peer}{flag} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", type=Path, help="tuning DB (default: the installed package's for the device)")
    ap.add_argument("--rounds", type=int, default=2, help="timings of each build, interleaved (default 2)")
    ap.add_argument("--max-calls", type=int, default=0, help="time at most this many winners (0: all)")
    ap.add_argument("--deadline-s", type=float, default=0, help="start no winner after this many seconds (0: none)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds: expected a whole number >= 1, got {args.rounds}")
    if not torch.cuda.is_available():
        print("bench_walk_cut: no CUDA device", file=sys.stderr)
        return 2
    arch = _cc1d.device_target("cuda", torch.cuda.current_device())
    db = args.db or Path(cc1d.__file__).resolve().parent / "tuning_db" / f"{arch}.db"
    if not db.is_file():
        ap.error(f"--db: no tuning DB at {db}")
    winners = served_through_walk_cut(db, arch)
    todo = winners[: args.max_calls] if args.max_calls else winners
    ceiling = copy_ceiling_gbps()
    print(f"{torch.cuda.get_device_name()}; copy {ceiling:.0f} GB/s; {db}: {len(winners)} winners served through "
          f"their walk-cut build at their own shape, timing {len(todo)}")
    print("| winner's shape | variant | plain µs (% copy) | walk-cut µs (% copy) | walk-cut speed-up | "
          "peer µs | walk-cut vs peer |")
    print("|---|---|---|---|---|---|---|")
    start, rows = time.monotonic(), []
    for w in todo:
        if args.deadline_s and time.monotonic() - start > args.deadline_s:
            print(f"deadline: {len(todo) - len(rows)} winners not timed", file=sys.stderr)
            break
        rows.append(time_winner(w, args.rounds, ceiling))
        print(line(rows[-1]), flush=True)
    if rows:
        import statistics
        g = statistics.geometric_mean([r["speedup"] for r in rows])
        print(f"\n{len(rows)} timed: walk-cut against plain, geometric mean {g:.3f}x "
              f"({min(r['speedup'] for r in rows):.2f}-{max(r['speedup'] for r in rows):.2f}x); "
              f"{sum(not r['valid'] for r in rows)} invalid")
    if args.json:
        args.json.write_text(json.dumps(dict(db=str(db), arch=arch, copy_gbps=ceiling, rows=rows), indent=1))
    return 1 if any(not r["valid"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
