"""Cross-serve matrix: a family's tuned winners timed at calls that are not their own.

An untuned call runs the winner of the nearest tuned shape (docs/DISPATCH.md: features,
then tiling misfit, then the shape distance; backward: |log batch| + 2 |log seqlen| +
0.5 |log dim| apart, other ops |log(batch x seqlen)| + |log dim|). Whether that rule picks
well is a question of times no tuning run measures: those of each winner at the other
calls. This measures them. At every call of a grid it times every distinct variant the
family's winners name (with their features), through the tuner's own evaluator: each is
checked against the float64 reference on fresh data and timed as the tuner times it, as
its realigned twin where the dispatcher would run that. It prints, per call, the variant
the dispatcher serves, the fastest, and the served one's regret (its time over the
fastest's, less one).

--out keeps the matrix as JSON, with the winners rows it ranked; --score FILE ranks those
rows again under each rule of serving_rules.py's RULES (no GPU) and prints every rule's
regret, so that a change of the rule can be judged on measured times before it is made.

--weights FILE... (no GPU) scores every weight triple of serving_rules.py's WEIGHT_GRID
(batch, seqlen and dim apart, as weights_rank) on saved matrices and prints the best by
summed mean regret, beside RULES: where a candidate rule comes from, to be timed with
bench_rule.py.

--loo DB... (no GPU) scores the rules on times tuning runs already measured: each entry of
--db's family whose shape the DBs hold trials of is left out in turn, each rule picks the
entry that would serve its shape from the others, and that entry's variant is looked up
among the shape's trials (regret: its time over the fastest trial's, less one; a pick never
timed there is counted apart). The entries were tuned where the dispatcher served them
badly (session 67's guard shapes), so the current rule is scored where it failed: a lead
for a --score run on a fresh grid, not a verdict.

    python benchmarks/cross_serve.py --family bwd.cf.bf16wbf16.w4 --batches 1,4,16 \\
        --dims 2048,5120 --lengths 700,1500,3000,6000 [--db tuning_db/sm_90.db] --out m.json
    python benchmarks/cross_serve.py --score m.json
    python benchmarks/cross_serve.py --weights m1.json m2.json [--top 10]
    python benchmarks/cross_serve.py --loo run1.db run2.db [--db tuning_db/sm_90.db] [--family ...]
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from bench_near import positive_ints  # sibling scripts: run as benchmarks/cross_serve.py
from serving_rules import RULES, call_shape, current_rank, loo_score, pick, score, trial_times, weight_search

REPO = Path(__file__).resolve().parents[1]
FEATURES = ("bias", "silu")
# Winners-row columns a rule may read (the row's source and environment stay in the DB).
ROW_COLUMNS = ("family_key", "shape_key", "batch", "dim", "seqlen", "features", "variant_key", "config",
               "threads", "tile_l", "tile_d", "align_bytes", "split_blocks", "time_us")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="bwd.cf.bf16wbf16.w4", help="family key (default bwd.cf.bf16wbf16.w4)")
    ap.add_argument("--features", default="bias,silu", help="the calls' features: bias, silu (default both)")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--dims", default="2048,4096,5120")
    ap.add_argument("--lengths", default="512,1000,1500,2048,3000,4096,6000,8192")
    ap.add_argument("--db", type=Path, default=None, help="tuning DB (default: the shipped one for the GPU's arch)")
    ap.add_argument("--out", type=Path, default=None, help="write the matrix as JSON here")
    ap.add_argument("--score", type=Path, default=None, metavar="FILE",
                    help="rank a saved matrix's rows under every rule and print their regret (no GPU)")
    ap.add_argument("--weights", type=Path, nargs="+", default=None, metavar="FILE",
                    help="rank saved matrices' rows under every (batch, seqlen, dim) weight triple of "
                         "serving_rules.WEIGHT_GRID and print the best --top sets by summed mean regret (no GPU)")
    ap.add_argument("--top", type=int, default=10, help="with --weights: how many sets to print (default 10)")
    ap.add_argument("--loo", type=Path, nargs="+", default=None, metavar="DB",
                    help="score every rule leaving out each entry of --db's family whose shape these "
                         "tuning DBs hold trials of (no GPU)")
    args = ap.parse_args(argv)
    modes = [name for name in ("score", "loo", "weights") if getattr(args, name) is not None]
    if len(modes) > 1:
        ap.error(f"{' and '.join('--' + m for m in modes)}: one at a time")
    if args.score is not None:
        if not args.score.is_file():
            ap.error(f"--score: no such file {str(args.score)!r}")
        return args
    if args.weights is not None:
        missing = [str(p) for p in args.weights if not p.is_file()]
        if missing:
            ap.error(f"--weights: no such file {missing[0]!r}")
        if args.top < 1:
            ap.error(f"--top expects a positive integer, got {args.top}")
        return args
    if args.loo is not None:
        for path in [*args.loo, *([args.db] if args.db else [])]:
            if not path.is_file():
                ap.error(f"--{'loo' if path in args.loo else 'db'}: no such file {str(path)!r}")
    from cc1d.tuner.db import family_from_key
    try:
        args.family = family_from_key(args.family)
    except (KeyError, ValueError) as exc:
        ap.error(f"--family: not a family key ({exc}), got {args.family!r}")
    if args.loo is not None:
        return args
    if args.family.op not in ("fwd", "bwd"):
        ap.error(f"--family: forward and backward families are timed, got op {args.family.op!r}")
    args.features = sorted(f for f in args.features.split(",") if f)
    bad = [f for f in args.features if f not in FEATURES]
    if bad:
        ap.error(f"--features expects some of {', '.join(FEATURES)} separated by commas, got {bad}")
    args.batches = positive_ints(args.batches, "--batches", ap)
    args.dims = positive_ints(args.dims, "--dims", ap)
    args.lengths = positive_ints(args.lengths, "--lengths", ap)
    if args.db is not None and not args.db.is_file():
        ap.error(f"--db: no such file {str(args.db)!r}")
    return args


def print_loo(args: argparse.Namespace) -> None:
    from cc1d.tuner.db import TuningDB
    db_path = args.db or REPO / "tuning_db" / "sm_90.db"
    fkey = args.family.key()
    with TuningDB(db_path, readonly=True) as db:
        rows = [{c: r[c] for c in (*ROW_COLUMNS, "arch", "epoch")} for r in db.winners()
                if r["family_key"] == fkey]
    archs = sorted({r["arch"] for r in rows})
    if len(archs) != 1:
        raise SystemExit(f"--loo: expected the family {fkey} in one arch of {db_path}, found {archs or 'none'}")
    times = trial_times(args.loo, archs[0], fkey, {r["shape_key"]: r["epoch"] for r in rows})
    print(f"{fkey} in {db_path}: {len(rows)} entries, {len(times)} with trials in {len(args.loo)} DBs "
          f"({sum(map(len, times.values()))} variants timed)")
    if not times:
        return
    print("| rule | mean regret | median | worst regret | worst call | within 5 % of the fastest | "
          "pick not among the trials |")
    print("|---|---|---|---|---|---|---|")
    for s in loo_score(rows, times, archs[0]):
        print(f"| {s['rule']} | {100 * s['mean']:.1f} % | {100 * s['median']:.1f} % | {100 * s['worst']:.1f} % | "
              f"{s['worst_call']} | {s['within_5pct']} / {s['calls']} | {s['unknown']} |")


def print_score(matrix: dict) -> None:
    print(f"{matrix['device']}; {matrix['family']} ({','.join(matrix['features'])}); "
          f"{len(matrix['calls'])} calls, {len(matrix['rows'])} winners rows")
    print("| rule | mean regret | worst regret | worst call | within 5 % of the fastest | pick failed |")
    print("|---|---|---|---|---|---|")
    for s in score(matrix):
        print(f"| {s['rule']} | {100 * s['mean']:.1f} % | {100 * s['worst']:.1f} % | {s['worst_call']} | "
              f"{s['within_5pct']} / {s['calls']} | {s['failed']} |")


def print_weights(matrices: list[dict], top: int) -> None:
    for i, m in enumerate(matrices, 1):
        print(f"matrix {i}: {m['device']}; {m['family']} ({','.join(m['features'])}); {len(m['calls'])} calls")
    found = weight_search(matrices)
    calls = sum(len(m["calls"]) for m in matrices)
    print(f"{len(found)} weight sets on {calls} calls: the best is a lead to time (bench_rule.py), not a result")
    cols = " | ".join(f"matrix {i} mean regret" for i in range(1, len(matrices) + 1))
    print(f"| weights (batch / seqlen / dim) | {cols} | sum |")
    print("|---|" + "---|" * (len(matrices) + 1))

    def row(name: str, means: list[float]) -> str:
        return f"| {name} | " + " | ".join(f"{100 * x:.1f} %" for x in means) + f" | {100 * math.fsum(means):.1f} % |"
    for r in found[:top]:
        print(row(" / ".join(f"{w:g}" for w in r["weights"]), r["means"]))
    for name, rank in RULES.items():  # the named rules, for comparison
        print(row(f"rule {name}", [score(m, {name: rank})[0]["mean"] for m in matrices]))


def load_matrix(path: Path, option: str) -> dict:
    """A matrix cross_serve.py wrote (--out), or SystemExit naming the option and the file."""
    try:
        matrix = json.loads(path.read_text())
        if not isinstance(matrix, dict):
            raise TypeError(f"a JSON {type(matrix).__name__}, not an object")
        missing = [k for k in ("device", "arch", "family", "features", "rows", "calls") if k not in matrix]
        if missing:
            raise KeyError(missing[0])
        return matrix
    except (ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"{option} {path}: not a matrix that cross_serve.py wrote "
                         f"({type(exc).__name__}: {exc})") from None


# ---- measuring (GPU) ------------------------------------------------------------------

def measure(args: argparse.Namespace) -> dict:
    import torch
    from tqdm import tqdm

    from cc1d._runtime import runtime
    from cc1d.tuner.db import TuningDB, winner_variant
    from cc1d.tuner.evaluate import CandidateError, GpuEvaluator
    from timing import gpu_and_db, write_json

    device, path = gpu_and_db("cross_serve.py", args.db, "--db", "--score FILE")
    rt, arch = runtime(), device.target
    feats = ",".join(args.features)
    with TuningDB(path, readonly=True) as db:
        rows = [{c: r[c] for c in ROW_COLUMNS} for r in db.winners(arch)
                if r["family_key"] == args.family.key() and r["features"] == feats]
    if not rows:
        raise SystemExit(f"cross_serve.py: {path} holds no {arch} winner of {args.family.key()} "
                         f"with features {feats!r}")
    variants = {r["variant_key"]: winner_variant(r) for r in rows}
    calls = [(b, d, n) for b in args.batches for d in args.dims for n in args.lengths]
    matrix = dict(device=device.name, arch=arch, db=str(path), family=args.family.key(),
                  features=args.features, rows=rows, calls=[])
    bar = tqdm(total=len(calls) * len(variants), desc="timings", unit="kernel", disable=None)
    for b, d, n in calls:
        shape = call_shape(args.family, b, d, n, args.features)
        ev = GpuEvaluator(rt, shape, arch)
        times, errors = {}, {}
        for key, v in variants.items():
            try:
                ev.compile(v)
                ev.validate(v)
                times[key] = ev.time(v, None).median_us
            except CandidateError as exc:  # kept as a failure: a rule that picks it is told so
                times[key], errors[key] = None, str(exc)
            bar.update(1)
        served = pick(rows, shape, current_rank, arch)["variant_key"]
        matrix["calls"].append(dict(batch=b, dim=d, seqlen=n, times=times, errors=errors, served=served))
        ok = {k: t for k, t in times.items() if t is not None}
        best = min(ok, key=ok.get) if ok else None
        regret = f"{100 * (ok[served] / ok[best] - 1):.1f} %" if served in ok else "failed"
        tqdm.write(f"{shape.key()}: served {served} {ok.get(served, float('nan')):.1f} µs, "
                   f"fastest {best} {ok.get(best, float('nan')):.1f} µs, regret {regret}")
        if args.out:  # after every call: a run that is stopped keeps what it measured
            write_json(args.out, matrix)
        del ev
        torch.cuda.empty_cache()
    bar.close()
    return matrix


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # before torch touches a GPU: a bad option costs nothing
    if args.loo is not None:
        print_loo(args)
        return 0
    if args.score is not None:
        matrix = load_matrix(args.score, "--score")
        try:
            print_score(matrix)
        except (ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"--score {args.score}: not a matrix that cross_serve.py wrote "
                             f"({type(exc).__name__}: {exc})") from None
        return 0
    if args.weights is not None:
        matrices = [load_matrix(p, "--weights") for p in args.weights]
        try:
            print_weights(matrices, args.top)
        except (ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"--weights: a matrix that cross_serve.py did not write "
                             f"({type(exc).__name__}: {exc})") from None
        return 0
    print_score(measure(args))
    return 0


if __name__ == "__main__":
    from script_exit import exit_with  # a sibling script
    exit_with(main, "cross_serve.py")
