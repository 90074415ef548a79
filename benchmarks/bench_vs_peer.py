"""Peer sweep: calls of the tuning grid, served by one tuning DB, timed against causal-conv1d.

ANCHORS.md names a few shapes; the dispatcher serves every other call from the nearest
tuned shape (docs/DISPATCH.md), and some of those run behind the peer without any DB
change moving them, so bench_moves.py never times them (session 69 found fp32
channel-first backward calls at length 3000 at 0.92-0.99x only because an entry moved
them). This takes tuner/moves.py's grid of each chosen family (batches, the family's tuned
dims, lengths, each feature set it was tuned with; its tuned shapes too), times each call
through the DB and through the peer on the same inputs (graph replays interleaved,
timing.graph_times_us), lists them slowest against the peer first, and can write those
behind it by more than 3 % as a shapes file for the next tuning run
(benchmarks/device_tune.sh). Calls the peer cannot make (widths above 4, a backward with
states) are listed as not timed; one it refuses when called (channel-first seq_idx) is
timed alone, its refusal in the peer's column, and never counted behind it (session 70's
sweep found such a call at 1 % of copy that way).

    python benchmarks/bench_vs_peer.py --families bwd.cf.f32 [--db DB] [--batches 1,4,16]
        [--lengths 1000,3000] [--max-calls 60] [--out p.json] [--shapes-out behind.yaml]
    python benchmarks/bench_vs_peer.py --families bwd --list      # no GPU

--families takes family-key prefixes (fwd, bwd.cl, bwd.cf.f32wf32.w4); --db defaults to the
shipped DB of the GPU's arch (with --list, tuning_db/sm_90.db).
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

from bench_moves import (add_output_options, check_output_options, collect_rows, grouped,  # siblings
                         labels_hold, package_dir_with, ratio, slower_rows, time_call, untimed, us_text,
                         write_shapes)
from bench_near import positive_ints

REPO = Path(__file__).resolve().parents[1]
PEER_WIDTHS = (2, 3, 4)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from cc1d.tuner.moves import GRID_BATCHES, GRID_LENGTHS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=None,
                    help="the tuning DB serving the calls (default: this checkout's tuning_db/<arch>.db)")
    ap.add_argument("--families", default="fwd,bwd",
                    help="family-key prefixes separated by commas, e.g. bwd.cf.f32 (default fwd,bwd)")
    ap.add_argument("--batches", default=",".join(map(str, GRID_BATCHES)),
                    help="batch sizes (default the grid's, %(default)s)")
    ap.add_argument("--lengths", default=",".join(map(str, GRID_LENGTHS)),
                    help="sequence lengths (default the grid's, %(default)s)")
    ap.add_argument("--list", action="store_true", help="print the calls and stop (no GPU)")
    ap.add_argument("--seed", type=int, default=0,
                    help="order of each family's calls before --max-calls takes them in turn (default 0)")
    ap.add_argument("--max-calls", type=int, default=60,
                    help="time at most this many calls, a family at a time in turn (default 60)")
    add_output_options(ap, "write the calls behind the peer (by more than 3 %%, or failing where it ran) as a "
                           "shapes file for cc1d-tune; a new file: not written where none is behind")
    args = ap.parse_args(argv)
    if args.db is not None and not args.db.is_file():
        ap.error(f"--db: no such file {str(args.db)!r}")
    args.families = [f for f in args.families.split(",") if f]
    if not args.families:
        ap.error("--families expects family-key prefixes separated by commas, got ''")
    args.batches = positive_ints(args.batches, "--batches", ap)
    args.lengths = positive_ints(args.lengths, "--lengths", ap)
    check_output_options(ap, args, "timed behind the peer")
    if os.environ.get("CC1D_TUNING_DB"):
        ap.error("CC1D_TUNING_DB is set: its DBs would serve the calls before --db; unset it")
    return args


def chosen_calls(db: Path, args: argparse.Namespace, arch: str | None = None) -> list:
    """grid's calls for the options, from the DB read once; where a --families prefix names
    no family (unmatched), SystemExit with status 2, the message on stderr."""
    from cc1d.tuner.db import TuningDB
    from cc1d.tuner.moves import snapshot
    with TuningDB(db, readonly=True) as t:
        rows_of = snapshot(t)
    problem = unmatched(rows_of, db, args.families, arch)
    if problem:
        print(f"bench_vs_peer.py: {problem}", file=sys.stderr)
        raise SystemExit(2)
    return grid(rows_of, args.families, args.batches, args.lengths, arch)


def grid(rows_of: dict, prefixes: list[str], batches: list[int], lengths: list[int], arch: str | None = None) -> list:
    """Each chosen family's calls (families whose key starts with one of `prefixes`; one
    arch's, or every arch's, of a DB's winners rows, tuner/moves.py snapshot): tuner/moves.py
    grid_calls with `batches` and `lengths`, tuned shapes included, as Moves whose variant
    before and after is the one the DB serves the call (entry: it is a tuned shape)."""
    from cc1d.tuner.moves import Move, grid_calls
    from cc1d.tuner.serving import serve_from
    calls = []
    for (a, fkey), rows in sorted(rows_of.items()):
        if arch not in (None, a) or not any(fkey.startswith(p) for p in prefixes):
            continue
        for feats, call, shape in grid_calls(fkey, rows, batches, lengths, with_tuned=True):
            served = serve_from(rows, a, shape)
            calls.append(Move(a, fkey, feats, call, served["variant_key"], served["variant_key"],
                              entry=served["shape_key"] == shape.key(), after_shape=served["shape_key"]))
    return calls


def unmatched(rows_of: dict, db: Path, prefixes: list[str], arch: str | None = None) -> str | None:
    """What to tell a user whose --families prefixes name no forward or backward family of
    the DB's winners rows (one arch's, or any arch's), or None where each names one."""
    keys = sorted({fkey for (a, fkey) in rows_of if arch in (None, a)})
    missing = [p for p in prefixes if not any(k.startswith(p) for k in keys)]
    if not missing:
        return None
    ops_layouts = sorted({".".join(k.split(".")[:2]) for k in keys})
    return (f"--families: no forward or backward family of {db} starts with {', '.join(map(repr, missing))} "
            f"(its families start with {', '.join(ops_layouts) or 'nothing: it has none'})")


def why_no_peer(call) -> str | None:
    """Why the peer cannot make this call (so it is not timed), or None where it can."""
    family = call.shape.family()  # a forward or backward one: grid takes no other
    if family.width not in PEER_WIDTHS:
        return f"width {family.width}: the peer takes widths {PEER_WIDTHS[0]}-{PEER_WIDTHS[-1]}"
    if family.op == "bwd" and (call.shape.initial_states or call.shape.final_states):
        return "a backward with states: the peer's wrapper here takes none"
    return None


def plan(calls: list, max_calls: int, seed: int = 0) -> tuple[list, list[dict]]:
    """The calls to time (at most max_calls of those the peer can make, a family at a time
    in turn: tuner/moves.py round_robin) and the rest, each with why it is not timed. Each
    family's calls are taken in an order shuffled by `seed`: in grid order a cap would
    time only the first batch and dim of each family."""
    from cc1d.tuner.moves import round_robin
    timeable = [c for c in calls if why_no_peer(c) is None]
    random.Random(seed).shuffle(timeable)
    timed = round_robin(timeable, max_calls)[0]
    chosen = set(timed)
    rest = [untimed(c, why_no_peer(c) or f"past --max-calls {max_calls}") for c in calls if c not in chosen]
    return timed, rest


def print_list(calls: list, max_calls: int, seed: int) -> None:
    """Every call with the variant the DB serves it, and why those not timed would not be."""
    timed, rest = plan(calls, max_calls, seed)
    why = {(r["family"], r["features"], tuple(r["call"])): r["reason"] for r in rest}
    n = sum(c.entry for c in calls)
    print(f"{len(calls)} calls" + (f", {n} of them tuned shapes" if n else "") + f"; {len(timed)} would be timed")
    for c in calls:
        reason = why.get((c.family_key, c.features, c.call))
        print(f"{c.text().split(': ')[0]}: {short(c)}" + (f"  (not timed: {reason})" if reason else ""))


def short(call) -> str:
    from cc1d.tuner.moves import short_variant
    return short_variant(call.after, call.family_key)


def measure(args: argparse.Namespace) -> dict:
    from cc1d._runtime import runtime
    from peers import causal_conv1d, causal_conv1d_bwd, causal_conv1d_version
    from timing import copy_ceiling_gbps, gpu_and_db

    device, db = gpu_and_db("bench_vs_peer.py", args.db, "--db", "--list")
    arch = device.target
    calls = chosen_calls(db, args, arch)
    version = causal_conv1d_version()
    if version is None:
        raise SystemExit("bench_vs_peer.py: causal-conv1d is not installed: there is no peer to time against")
    timed, not_timed = plan(calls, args.max_calls, args.seed)
    peers = {"fwd": causal_conv1d("causal_conv1d_fn"), "bwd": causal_conv1d_bwd()}
    doc = dict(device=device.name, arch=arch, db=str(db), copy_gbps=copy_ceiling_gbps(),
               peer_version=version, rows=[], not_timed=not_timed)

    def row_of(c) -> dict:
        times, nbytes = time_call(c.shape, peers[c.shape.op], ("cc1d",), arch=arch)
        row = dict(family=c.family_key, features=c.features, call=list(c.call), variant=c.after,
                   served_by=c.after_shape, entry=c.entry, copy_frac=None, **times)
        row["labels_hold"] = labels_hold(row)
        if row.get("cc1d_us"):
            row["copy_frac"] = nbytes / (row["cc1d_us"] * 1e-6) / 1e9 / doc["copy_gbps"]
        row["vs_peer"] = ratio(row.get("peer_us"), row.get("cc1d_us"))
        return row
    with tempfile.TemporaryDirectory(prefix="cc1d-vs-peer-") as tmp:
        runtime().set_package_dir(str(package_dir_with(db, arch, Path(tmp), "db")))
        collect_rows(timed, row_of, line, doc, args.out, "calls", args.deadline_s)  # then the package's DBs
    return doc


def line(row: dict) -> str:
    from cc1d.tuner.moves import short_variant
    frac = row.get("copy_frac")
    vs = row.get("vs_peer")
    return (f"| {row['family']} | {row['features'] or '-'} | {tuple(row['call'])}{' entry' if row.get('entry') else ''} | "
            f"{short_variant(row['variant'], row['family'])} | {us_text(row, 'cc1d')} | "
            f"{f'{100 * frac:.0f} %' if frac else '-'} | {us_text(row, 'peer')} | {f'{vs:.2f}x' if vs else '-'} |")


def behind_rows(doc: dict) -> list[dict]:
    """The timed calls behind the peer: the peer faster by more than the guard's 3 %
    (tuner/guard.py SLOWER), or cc1d failing where the peer ran."""
    return slower_rows(doc, "cc1d", "peer")


def by_family(rows: list[dict]) -> list[dict]:
    """Per family: calls timed, how many are behind the peer, and the geometric mean of the
    speed against it (None where no call had both times); most behind first."""
    return [dict(family=family, calls=n, behind=bad, geomean=geo)
            for family, n, bad, geo in grouped(rows, lambda r: r["family"], behind_rows, "vs_peer")]


def print_table(doc: dict) -> None:
    print(f"\n{doc['device']}; copy ceiling {doc['copy_gbps']:.0f} GB/s; causal_conv1d {doc['peer_version']}; "
          f"DB {doc['db']}")
    print("| family | features | (batch, dim, seqlen) | variant served | cc1d µs | cc1d % of copy | peer µs | "
          "speed vs peer |")
    print("|---|---|---|---|---|---|---|---|")
    for row in sorted(doc["rows"], key=lambda r: r.get("vs_peer") or 0.0):
        print(line(row))
    print("\n| family | calls timed | behind the peer > 3 % or failing | geometric mean speed vs peer |")
    print("|---|---|---|---|")
    for g in by_family(doc["rows"]):
        geo = f"{g['geomean']:.2f}x" if g["geomean"] is not None else "-"
        print(f"| {g['family']} | {g['calls']} | {g['behind']} | {geo} |")
    print(f"{len(doc['rows'])} calls timed, {len(behind_rows(doc))} behind the peer (by more than 3 %, or failing "
          f"where it ran); {len(doc['not_timed'])} not timed")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # before torch touches a GPU: a bad option costs nothing
    if args.list:
        print_list(chosen_calls(args.db or REPO / "tuning_db" / "sm_90.db", args), args.max_calls, args.seed)
        return 0
    with tempfile.TemporaryDirectory(prefix="cc1d-vs-peer-cache-") as cache:
        os.environ["CC1D_CACHE_DIR"] = cache  # no user tuning DB ahead of --db in the chain
        doc = measure(args)
        print_table(doc)
    if args.shapes_out:
        n = write_behind(args.shapes_out, doc)
        print(f"{n} calls behind the peer written to {args.shapes_out}" if n
              else f"no call behind the peer: {args.shapes_out} not written")
    return 0


def write_behind(path: Path, doc: dict) -> int:
    """The calls behind the peer (behind_rows) as a shapes file for cc1d-tune, written whole,
    or nothing where there are none; how many."""
    behind = behind_rows(doc)
    if behind:
        rows = [dict(r, before_variant=r["variant"], after_variant=r["variant"]) for r in behind]
        write_shapes(path, doc, rows, header=f"calls behind causal-conv1d {doc['peer_version']} through "
                                             f"{doc['db']} on {doc['device']} (benchmarks/bench_vs_peer.py)")
    return len(behind)


if __name__ == "__main__":
    from script_exit import exit_with  # a sibling script
    exit_with(main, "bench_vs_peer.py")
