"""Serving-rule benchmark: the calls a change of the dispatcher's rule would move, timed
under the winner each rule serves them.

An untuned call runs the winner of the nearest tuned shape (docs/DISPATCH.md). A candidate
rule (benchmarks/serving_rules.py RULES) ranks the same winners otherwise, and changes the
kernel of some calls of every family. This lists those calls over tuner/moves.py's grid
(rule_moves), takes a sample spread over the families (round robin, --max-calls), and
times each under the variant the current rule serves and the one the candidate would,
both checked against the float64 reference first, as the tuner and `cc1d-tune --guard`
time them (tuner/guard.py check_moves). cross_serve.py judges a rule at one family's grid
with every winner timed; this judges it across families with two timings a call.

    python benchmarks/bench_rule.py --rule weighted-1/2/0.5 [--db DB] [--max-calls 120] [--out r.json]
    python benchmarks/bench_rule.py --rule weighted-1/2/0.5 --list          # no GPU
    python benchmarks/bench_rule.py --rule weighted-0.5/4/0 --ops bwd       # the backward's calls only
"""
from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from pathlib import Path

from serving_rules import RULES, current_rank  # a sibling module: run as benchmarks/bench_rule.py

REPO = Path(__file__).resolve().parents[1]
OPS = ("fwd", "bwd")  # --ops' choices: the ops whose moved calls it lists and times


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rule", required=True, help=f"the candidate rule: one of {', '.join(RULES)}")
    ap.add_argument("--db", type=Path, default=None,
                    help="tuning DB (default: this checkout's tuning_db/<arch>.db; with --list, sm_90)")
    ap.add_argument("--max-calls", type=int, default=120,
                    help="time at most this many moved calls, taken in turn from each family (default 120)")
    ap.add_argument("--ops", default="fwd,bwd",
                    help="the ops whose calls count, comma-separated: fwd, bwd (default both)")
    ap.add_argument("--list", action="store_true", help="print the moved calls per family and stop (no GPU)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here (after every call)")
    args = ap.parse_args(argv)
    if args.rule not in RULES or args.rule == "current":
        ap.error(f"--rule: expected one of {', '.join(r for r in RULES if r != 'current')}, got {args.rule!r}")
    if args.db is not None and not args.db.is_file():
        ap.error(f"--db: no such file {str(args.db)!r}")
    args.ops = tuple(args.ops.split(","))
    if not args.ops or any(op not in OPS for op in args.ops):
        ap.error(f"--ops: expected a comma-separated list of {', '.join(OPS)}, got {','.join(args.ops)!r}")
    if args.max_calls < 1:
        ap.error(f"--max-calls expects a positive integer, got {args.max_calls}")
    return args


def moves_of(db_path: Path, rule: str, arch: str | None = None, ops: tuple[str, ...] = OPS) -> list:
    """tuner/moves.py rule_moves: the grid calls of `ops` the current rule and `rule` serve apart."""
    from cc1d.tuner.db import TuningDB
    from cc1d.tuner.moves import rule_moves, snapshot
    with TuningDB(db_path, readonly=True) as db:
        rows = snapshot(db)
    return [m for m in rule_moves(rows, current_rank, RULES[rule])
            if arch in (None, m.arch) and m.family_key.split(".", 1)[0] in ops]


def summary(rows: list[dict]) -> list[dict]:
    """Per family, then over all: calls timed, faster / slower by more than 3 % under the
    candidate, failures, and the geometric mean of current / candidate time (above 1: the
    candidate is faster)."""
    from cc1d.tuner.guard import SLOWER

    def one(name: str, rs: list[dict]) -> dict:
        both = [r for r in rs if r["current_us"] and r["candidate_us"]]
        ratios = [r["current_us"] / r["candidate_us"] for r in both]
        return dict(family=name, calls=len(rs), failed=len(rs) - len(both),
                    faster=sum(x > SLOWER for x in ratios), slower=sum(x < 1 / SLOWER for x in ratios),
                    geomean=statistics.geometric_mean(ratios) if ratios else math.nan)
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r["family"]].append(r)
    return [one(k, groups[k]) for k in sorted(groups)] + [one("all", rows)]


def print_list(moves: list, rule: str) -> None:
    counts: dict[str, int] = defaultdict(int)
    for m in moves:
        counts[m.family_key] += 1
    print(f"{len(moves)} grid calls served another winner under {rule}, in {len(counts)} families")
    for fkey in sorted(counts):
        print(f"  {fkey}: {counts[fkey]}")
    for m in moves:
        print(m.text())


def measure(args: argparse.Namespace) -> dict:
    import torch
    from tqdm import tqdm

    from cc1d._runtime import runtime
    from cc1d.tuner import evaluate
    from cc1d.tuner.db import TuningDB
    from cc1d.tuner.guard import check_moves, variants_of
    from cc1d.tuner.moves import round_robin, snapshot
    from timing import gpu_and_db, write_json

    device, path = gpu_and_db("bench_rule.py", args.db, "--db", "--list")
    rt, arch = runtime(), device.target
    moves = moves_of(path, args.rule, arch, args.ops)
    timed = round_robin(moves, args.max_calls)[0]  # a cap still reaches every family
    with TuningDB(path, readonly=True) as db:
        variants = variants_of(snapshot(db))
    doc = dict(device=device.name, arch=arch, db=str(path), rule=args.rule, moved=len(moves), rows=[])
    bar = tqdm(total=len(timed), desc="moved calls", unit="call", disable=None)

    def on_check(c) -> None:
        m = c.move
        doc["rows"].append(dict(family=m.family_key, features=m.features, call=list(m.call), current=m.before,
                                candidate=m.after, candidate_shape=m.after_shape, current_us=c.before_us,
                                candidate_us=c.after_us, error=c.error))
        bar.update(1)
        tqdm.write(line(doc["rows"][-1]))
        if args.out:  # after every call: a run that is stopped keeps what it measured
            write_json(args.out, doc)
        torch.cuda.empty_cache()

    try:
        check_moves(timed, variants, lambda shape: evaluate.GpuEvaluator(rt, shape, arch), {}, on_check)
    finally:
        bar.close()
    return doc


def _us(t: float | None) -> str:
    return f"{t:.1f}" if t is not None else "failed"


def line(row: dict) -> str:
    from cc1d.tuner.moves import short_variant
    fam = row["family"]
    ratio = row["current_us"] / row["candidate_us"] if row["current_us"] and row["candidate_us"] else None
    return (f"| {fam} | {row['features'] or '-'} | {tuple(row['call'])} | {short_variant(row['current'], fam)} -> "
            f"{short_variant(row['candidate'], fam)} | {_us(row['current_us'])} | {_us(row['candidate_us'])} | "
            f"{f'{ratio:.2f}x' if ratio else '-'} |")


def print_table(doc: dict) -> None:
    print(f"\n{doc['device']}; {doc['db']}; rule {doc['rule']}: {doc['moved']} grid calls move, "
          f"{len(doc['rows'])} timed")
    print("| family | features | (batch, dim, seqlen) | variant current -> candidate | current µs | "
          "candidate µs | candidate speed |")
    print("|---|---|---|---|---|---|---|")
    for row in doc["rows"]:
        print(line(row))
    print("\n| family | calls timed | faster > 3 % | slower > 3 % | failed | geometric mean speed |")
    print("|---|---|---|---|---|---|")
    for s in summary(doc["rows"]):
        print(f"| {s['family']} | {s['calls']} | {s['faster']} | {s['slower']} | {s['failed']} | "
              f"{s['geomean']:.3f}x |")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # before torch touches a GPU: a bad option costs nothing
    if args.list:
        print_list(moves_of(args.db or REPO / "tuning_db" / "sm_90.db", args.rule, ops=args.ops), args.rule)
        return 0
    print_table(measure(args))
    return 0


if __name__ == "__main__":
    from script_exit import exit_with  # a sibling script
    exit_with(main, "bench_rule.py")
