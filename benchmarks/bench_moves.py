"""Moved-calls benchmark: the calls a tuning DB change moves to another kernel, timed
through the DB before and the DB after.

An untuned call runs the winner of the nearest tuned shape (docs/DISPATCH.md), so a new
entry serves the calls around it too, and what is fastest at its own shape can be slower at
theirs (session 66: the (1, 5120, 3000) entry took (1, 4096, 3000) from 28.6 to 31.7 µs).
`cc1d-tune db merge` counts the moved calls of a grid (tuner/moves.py); this lists them all
and times each through both DBs and the peer, their CUDA graph replays interleaved in one
process (timing.graph_times_us): the dispatcher is pointed at a folder holding only the
one DB before each is captured. Forward and backward calls are timed, with any of their
features (inputs as the tuner makes them, tuner/problems.py); decode-update and varlen
calls are listed as not timed. The table is followed by the calls grouped by the entry
whose winner serves them after, most slowed first: which entry to re-tune or drop. Each
row also keeps the kernels the runtime itself names for the call under each DB (cc1d.explain:
before_kernel, after_kernel) and whether they are the ones the row names (labels_hold;
prune_runs.py leaves the rows where not: session 73 found the tuner's model naming other
kernels at exact ties).

    python benchmarks/bench_moves.py --before OLD.db [--after NEW.db] [--max-calls 40] [--out m.json]
    python benchmarks/bench_moves.py --before OLD.db [--after NEW.db] --list        # no GPU
    python benchmarks/bench_moves.py --before OLD.db --entries     # the new entries' own calls too
    python benchmarks/bench_moves.py --before OLD.db --shapes-out slowed.yaml      # then tune them:
    cc1d-tune --shapes slowed.yaml --db new.db --start-from NEW.db OLD.db --guard NEW.db

--after defaults to the shipped DB of the GPU's arch (tuning_db/<arch>.db of this checkout;
with --list, tuning_db/sm_90.db).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
TIMED_OPS = ("fwd", "bwd")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="the tuning DB before the change")
    ap.add_argument("--after", type=Path, default=None,
                    help="the tuning DB after it (default: this checkout's tuning_db/<arch>.db)")
    ap.add_argument("--list", action="store_true", help="print the moved calls and stop (no GPU)")
    ap.add_argument("--entries", action="store_true",
                    help="also the tuned shapes of --after that --before served another variant (new or "
                         "re-tuned entries), marked 'entry': listed after the untuned calls, timed first")
    ap.add_argument("--max-calls", type=int, default=40,
                    help="time at most this many calls, the rest listed as not timed (default 40): the "
                         "entries first, then the moved calls a family at a time in turn")
    add_output_options(ap, "write the calls slowed after (more than 3 %%, or failing where they ran) as a "
                           "shapes file for cc1d-tune; a new file: not written where no call slowed")
    args = ap.parse_args(argv)
    for name in ("before", "after"):
        path = getattr(args, name)
        if path is not None and not path.is_file():
            ap.error(f"--{name}: no such file {str(path)!r}")
    check_output_options(ap, args, "timed slower")
    if os.environ.get("CC1D_TUNING_DB"):
        ap.error("CC1D_TUNING_DB is set: its DBs would serve before both --before and --after; unset it")
    return args


def add_output_options(ap: argparse.ArgumentParser, shapes_help: str) -> None:
    """The options this script and bench_vs_peer.py share after --max-calls: --deadline-s,
    --out, and --shapes-out (its help, `shapes_help`, names the calls it writes)."""
    ap.add_argument("--deadline-s", type=float, default=None, metavar="S",
                    help="start no call after S seconds of timing; the rest are listed as not timed (to fit a "
                         "time limit and still print the summary)")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here (after every call)")
    ap.add_argument("--shapes-out", type=Path, default=None, help=shapes_help)


def check_output_options(ap: argparse.ArgumentParser, args: argparse.Namespace, written: str) -> None:
    """Both scripts' checks of --shapes-out (`written`: the calls it writes, e.g. "timed
    slower"), --max-calls and --deadline-s; ap.error on the first that fails."""
    if args.shapes_out is not None:
        if args.list:
            ap.error(f"--shapes-out writes the calls {written}: not with --list, which times none")
        why = new_file_error(args.shapes_out)
        if why:
            ap.error(f"--shapes-out: expected a new file in an existing folder, got {str(args.shapes_out)!r} ({why})")
    if args.max_calls < 1:
        ap.error(f"--max-calls expects a positive integer, got {args.max_calls}")
    if args.deadline_s is not None and not (math.isfinite(args.deadline_s) and args.deadline_s > 0):
        ap.error(f"--deadline-s expects a positive number of seconds, got {args.deadline_s:g}")


def new_file_error(path: Path) -> str | None:
    """Why `path` cannot be a --shapes-out file (it exists, or its folder does not), or None."""
    if path.exists():
        return "exists"
    return None if path.parent.is_dir() else "is in no folder"


def moves_between(before: Path, after: Path, arch: str | None = None, entries: bool = False) -> list:
    """tuner/moves.py's moved calls from one DB to the other (one arch's, or every arch's);
    with `entries`, then the changed entries' own calls (moves.changed_entries)."""
    from cc1d.tuner.db import TuningDB
    from cc1d.tuner.moves import changed_entries, moved_calls, snapshot
    with TuningDB(before, readonly=True) as a, TuningDB(after, readonly=True) as b:
        old, new = snapshot(a), snapshot(b)
    moves = moved_calls(old, new) + (changed_entries(old, new) if entries else [])
    return [m for m in moves if arch in (None, m.arch)]


def why_untimed(move) -> str | None:
    """Why a moved call is not timed here, or None where it is."""
    op = move.family_key.split(".", 1)[0]
    return None if op in TIMED_OPS else f"op {op}"


def plan(moves: list, max_calls: int) -> tuple[list, list[dict]]:
    """The moves to time and the rest, each with why it is not timed. Of those it can time,
    at most max_calls: the entries first (what the tuning run bought), then the moved calls
    a family at a time in turn (tuner/moves.py round_robin), so that a cap reaches them all."""
    from cc1d.tuner.moves import round_robin
    timeable = [m for m in moves if why_untimed(m) is None]
    entries = [m for m in timeable if m.entry][:max_calls]
    timed = entries + round_robin([m for m in timeable if not m.entry], max_calls - len(entries))[0]
    chosen = set(timed)
    rest = [untimed(m, why_untimed(m) or f"past --max-calls {max_calls}") for m in moves if m not in chosen]
    return timed, rest


def print_list(moves: list) -> None:
    n = sum(m.entry for m in moves)
    print(f"{len(moves)} moved calls" + (f", {n} of them entries" if n else ""))
    for m in moves:
        untimed = why_untimed(m)
        note = f"  (not timed: {untimed})" if untimed else ""
        print(f"{m.text()}{note}")


def package_dir_with(db: Path, arch: str, parent: Path, name: str) -> Path:
    """A folder laid out as the package is for the dispatcher (tuning_db/<arch>.db), holding
    a copy of `db` and nothing else (WAL content included: TuningDB.copy_to)."""
    from cc1d.tuner.db import TuningDB
    folder = parent / name
    (folder / "tuning_db").mkdir(parents=True)
    with TuningDB(db, readonly=True) as src:
        src.copy_to(folder / "tuning_db" / f"{arch}.db")
    return folder


def ratio(num: float | None, den: float | None) -> float | None:
    ok = all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in (num, den))
    return num / den if ok else None


def measure(args: argparse.Namespace) -> dict:
    from cc1d._runtime import runtime
    from peers import causal_conv1d, causal_conv1d_bwd, causal_conv1d_version
    from timing import copy_ceiling_gbps, gpu_and_db

    device, after = gpu_and_db("bench_moves.py", args.after, "--after", "--list")
    arch = device.target
    moves = moves_between(args.before, after, arch, args.entries)
    timed, not_timed = plan(moves, args.max_calls)
    peers = {"fwd": causal_conv1d("causal_conv1d_fn"), "bwd": causal_conv1d_bwd()}
    copy_gbps = copy_ceiling_gbps()
    doc = dict(device=device.name, arch=arch, before=str(args.before), after=str(after), copy_gbps=copy_gbps,
               peer_version=causal_conv1d_version(), rows=[], not_timed=not_timed)
    rt = runtime()
    with tempfile.TemporaryDirectory(prefix="cc1d-moves-") as tmp:
        dirs = {"after": package_dir_with(after, arch, Path(tmp), "after"),
                "before": package_dir_with(args.before, arch, Path(tmp), "before")}
        setup = {name: (lambda d=d: rt.set_package_dir(str(d))) for name, d in dirs.items()}

        def row_of(m) -> dict:
            times, nbytes = time_call(m.shape, peers[m.shape.op], ("after", "before"), setup, arch=arch)
            row = dict(family=m.family_key, features=m.features, call=list(m.call), copy_frac_after=None,
                       before_variant=m.before, after_variant=m.after, entry=m.entry,
                       after_shape=m.after_shape, **times)
            row["labels_hold"] = labels_hold(row)
            if row.get("after_us"):
                row["copy_frac_after"] = nbytes / (row["after_us"] * 1e-6) / 1e9 / copy_gbps
            row["after_vs_before"] = ratio(row.get("before_us"), row.get("after_us"))
            row["after_vs_peer"] = ratio(row.get("peer_us"), row.get("after_us"))
            return row
        collect_rows(timed, row_of, line, doc, args.out, "moved calls", args.deadline_s)
    return doc


def untimed(call, reason: str) -> dict:
    """A not-timed entry of the JSON: a moved call's or a sweep call's family, features and
    (batch, dim, seqlen), and why it was not timed."""
    return dict(family=call.family_key, features=call.features, call=list(call.call), reason=reason)


def collect_rows(calls: list, row_of: Callable[[Any], dict], show: Callable[[dict], str], doc: dict,
                 out: Path | None, desc: str, deadline_s: float | None = None) -> None:
    """doc["rows"] gains row_of(call) for each call in turn, each printed (show) as it comes,
    with a progress bar, and doc is rewritten to `out` after every call: a run that is stopped
    keeps what it measured. Past `deadline_s` seconds no call starts: the rest go to
    doc["not_timed"] (untimed), so that a run fitted to a time limit still ends with its
    summary (a killed one does not). However it ends, the dispatcher is pointed back at the
    installed package's DBs (row_of may point it elsewhere). bench_vs_peer.py collects its
    rows here too."""
    from tqdm import tqdm

    import cc1d
    from cc1d._runtime import runtime
    from timing import write_json
    bar = tqdm(total=len(calls), desc=desc, unit="call", disable=None)
    ends = None if deadline_s is None else time.monotonic() + deadline_s
    try:
        for i, c in enumerate(calls):
            if ends is not None and time.monotonic() > ends:
                doc["not_timed"] += [untimed(rest, f"past --deadline-s {deadline_s:g}") for rest in calls[i:]]
                if out:
                    write_json(out, doc)
                break
            row = row_of(c)
            doc["rows"].append(row)
            tqdm.write(show(row))
            if out:
                write_json(out, doc)
            bar.update(1)
    finally:
        bar.close()
        runtime().set_package_dir(str(Path(cc1d.__file__).resolve().parent))


def time_call(shape, peer, names: tuple[str, ...], setup: dict | None = None,
              device: str = "cuda", arch: str | None = None) -> tuple[dict, int]:
    """The shape's call made on fresh inputs (tuner/problems.py) and timed as cc1d under each
    of `names` (`setup[name]` run before that one is captured) and as the peer where it has
    one, replays interleaved (timing.graph_times_us): `<name>_us` or `<name>_error` for each,
    and the bytes the call moves. With `arch`, also `<name>_kernel`: the kernel the runtime
    names for the call under each (runtime_kernels). The inputs are freed before it returns.
    (bench_vs_peer.py times its calls with it too.)"""
    import torch

    from cc1d.tuner.problems import problem_for
    from timing import graph_times_us, n_buffers
    problem = problem_for(shape.op)
    sets = [problem.make_inputs(shape, seed=k, device=device) for k in range(n_buffers(problem.bytes_moved(shape)))]
    kernels = {} if arch is None else runtime_kernels(shape, sets[0], names, setup, arch)
    ours, theirs = calls_of(shape, sets, peer)
    cands = {name: ours for name in names}
    if theirs is not None:
        cands["peer"] = theirs
    times = graph_times_us(cands, setup=setup)
    del sets, ours, theirs
    torch.cuda.empty_cache()
    return ({**{f"{n}_us" if isinstance(t, float) else f"{n}_error": t for n, t in times.items()},
             **{f"{n}_kernel": k for n, k in kernels.items()}}, problem.bytes_moved(shape))


def runtime_kernels(shape, inputs: dict, names: tuple[str, ...], setup: dict | None, arch: str) -> dict:
    """The kernel key cc1d.explain (explain_bwd) gives for the call on `inputs` under each of
    `names` (`setup[name]` run first): what the runtime launches there, whatever the tuner's
    model of it says (they named different kernels at exact ties until session 73). A name
    whose call explain refuses gets none (its timing says why)."""
    import cc1d
    act = "silu" if shape.activation == "silu" else None
    out = {}
    for name in names:
        if setup and name in setup:
            setup[name]()
        s = inputs
        try:
            if shape.op == "fwd":
                e = cc1d.explain(s["x"], s["weight"], s["bias"], s["seq_idx"], s["initial_states"], act,
                                 return_final_states=shape.final_states, arch=arch)
            else:
                e = cc1d.explain_bwd(s["x"], s["weight"], s["bias"], s["dout"], s["seq_idx"],
                                     s["initial_states"], s["dfinal_states"],
                                     return_dinitial_states=shape.initial_states, activation=act, arch=arch)
        except (ValueError, TypeError, RuntimeError):
            continue
        out[name] = e["key"]
    return out


def kernel_key(family_key: str, variant: str | None) -> str:
    """The kernel a call runs: the variant, or where the family has no winner (None), the
    catalog's default that the dispatcher then serves."""
    if variant is not None:
        return variant
    from cc1d.generator import default_variant
    from cc1d.tuner.db import family_from_key
    return default_variant(family_from_key(family_key)).key()


def labels_hold(row: dict) -> bool | None:
    """Whether the kernels the runtime named for a row's call (runtime_kernels; a realigned
    twin or a walk-cut build counts as its variant) are the variants the row names: before and after, or a
    sweep's (bench_vs_peer.py) one (none: the family's default); None where it named none."""
    named = {"cc1d": row["variant"]} if "variant" in row else \
        {n: row.get(f"{n}_variant") for n in ("before", "after")}
    if any(f"{n}_kernel" not in row for n in named):
        return None
    from cc1d.generator.variant import base_key
    return all(base_key(row[f"{n}_kernel"]) == kernel_key(row["family"], v) for n, v in named.items())


def calls_of(shape, sets: list[dict], peer) -> tuple[list, list | None]:
    """cc1d's call of the shape's op on each input set (tuner/problems.py make_inputs), and
    the peer's where it has one for the shape (None: it has none; one it refuses is timed
    as an error)."""
    import cc1d
    act = "silu" if shape.activation == "silu" else None
    if shape.op == "fwd":
        ours = [lambda s=s: cc1d.causal_conv1d_fn(s["x"], s["weight"], s["bias"], seq_idx=s["seq_idx"],
                                                  initial_states=s["initial_states"],
                                                  return_final_states=shape.final_states, activation=act)
                for s in sets]
        theirs = None if peer is None else [
            lambda s=s: peer(s["x"], s["weight"], s["bias"], seq_idx=s["seq_idx"], initial_states=s["initial_states"],
                             return_final_states=shape.final_states, activation=act) for s in sets]
        return ours, theirs
    ours = [lambda s=s: cc1d.causal_conv1d_bwd(s["x"], s["weight"], s["bias"], s["dout"], s["seq_idx"],
                                               s["initial_states"], s["dfinal_states"],
                                               return_dinitial_states=shape.initial_states, activation=act)
            for s in sets]
    # bench_bwd's wrapper of the peer takes no states: where the call has them, it has no peer
    plain = not (shape.initial_states or shape.final_states)
    theirs = None if peer is None or not plain else [
        lambda s=s: peer(s["x"], s["weight"], s["bias"], s["dout"], seq_idx=s["seq_idx"], silu=act == "silu")
        for s in sets]
    return ours, theirs


def us_text(row: dict, name: str) -> str:
    t = row.get(f"{name}_us")
    return f"{t:.1f}" if t is not None else f"failed: {row.get(f'{name}_error', '?')[:60]}"


def _x(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "-"


def line(row: dict) -> str:
    from cc1d.tuner.moves import short_variant
    fam = row["family"]
    peer = us_text(row, "peer") if "peer_us" in row or "peer_error" in row else "-"
    frac = row.get("copy_frac_after")
    entry = " entry" if row.get("entry") else ""
    return (f"| {fam} | {row['features'] or '-'} | {tuple(row['call'])}{entry} | "
            f"{short_variant(row['before_variant'], fam)} -> {short_variant(row['after_variant'], fam)} | "
            f"{us_text(row, 'before')} | "
            f"{us_text(row, 'after')} | {f'{100 * frac:.0f} %' if frac else '-'} | {_x(row['after_vs_before'])} | "
            f"{peer} | {_x(row['after_vs_peer'])} |")


def slowed_rows(doc: dict) -> list[dict]:
    """The timed calls the change slowed: more than 3 % (the guard's SLOWER), or failing
    after where they ran before."""
    return slower_rows(doc, "after", "before")


def slower_rows(doc: dict, name: str, than: str) -> list[dict]:
    """The rows whose `name` time is more than the guard's 3 % (tuner/guard.py SLOWER) above
    their `than` time, or missing (failed) where `than` has one (slowed_rows here,
    bench_vs_peer.py's behind_rows)."""
    from cc1d.tuner.guard import SLOWER
    out = []
    for r in doc["rows"]:
        ref, t = r.get(f"{than}_us"), r.get(f"{name}_us")
        if ref is not None and (t is None or t > SLOWER * ref):
            out.append(r)
    return out


def write_shapes_file(path: Path, header: str, entries: list[tuple[Any, str | None]]) -> None:
    """`entries` ((shape, note)) as a shapes file for cc1d-tune (tuner/shapes.py), written
    whole or not at all: `header` its first line and each note its shape's trailing comment,
    as comments."""
    from cc1d.tuner.guard import shapes_entry
    from timing import write_whole
    lines = [f"# {header}", "shapes:"] + [f"  - {shapes_entry(shape)}" + (f"  # {note}" if note else "")
                                          for shape, note in entries]
    write_whole(path, "\n".join(lines) + "\n")


def write_shapes(path: Path, doc: dict, rows: list[dict], header: str | None = None) -> None:
    """The rows' calls as a shapes file (write_shapes_file), its header `header` (default: the
    calls slowed from doc's before to after)."""
    from cc1d.tuner.moves import Move
    header = header or (f"calls slowed from {doc['before']} to {doc['after']} on {doc['device']} "
                        "(benchmarks/bench_moves.py)")
    moves = [Move(doc["arch"], r["family"], r["features"], tuple(r["call"]), r["before_variant"], r["after_variant"])
             for r in rows]
    write_shapes_file(path, header, [(m.shape, None) for m in moves])


def by_entry(rows: list[dict]) -> list[dict]:
    """The timed calls grouped by the tuned shape whose winner serves them after (the entry
    that took them over; an entry's own call counts with it), most slowed first: how many,
    how many slowed (slowed_rows), and the geometric mean of after vs before over those
    timed through both DBs (None where none was)."""
    return [dict(family=family, shape=shape, calls=n, slowed=bad, geomean=geo)
            for (family, shape), n, bad, geo in grouped(rows, lambda r: (r["family"], r.get("after_shape") or "?"),
                                                        slowed_rows, "after_vs_before")]


def grouped(rows: list[dict], key: Callable[[dict], Any], bad_rows: Callable[[dict], list],
            speed: str) -> list[tuple[Any, int, int, float | None]]:
    """The rows grouped by key(row), as (key, calls, bad, geomean): how many rows, how many of
    them bad_rows finds (given {"rows": the group's}), and the geometric mean of their `speed`
    ratios (None where none has one); the groups with the most bad rows first, then the
    slowest (by_entry here, bench_vs_peer.py's by_family)."""
    groups: dict[Any, list[dict]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    out = []
    for k, rs in groups.items():
        speeds = [r[speed] for r in rs if r.get(speed) is not None]
        out.append((k, len(rs), len(bad_rows({"rows": rs})), statistics.geometric_mean(speeds) if speeds else None))
    return sorted(out, key=lambda g: (-g[2], g[3] if g[3] is not None else 0.0))


def print_table(doc: dict) -> None:
    print(f"\n{doc['device']}; copy ceiling {doc['copy_gbps']:.0f} GB/s; causal_conv1d "
          f"{doc['peer_version'] or 'not installed'}; before {doc['before']}, after {doc['after']}")
    print("| family | features | (batch, dim, seqlen) | variant before -> after | before µs | after µs | "
          "after % of copy | speed after vs before | peer µs | after vs peer |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in sorted(doc["rows"], key=lambda r: r["after_vs_before"] or 0.0):
        print(line(row))
    print("\n| family | served after by the entry | calls timed | slowed > 3 % or failing | "
          "geometric mean speed after vs before |")
    print("|---|---|---|---|---|")
    for g in by_entry(doc["rows"]):
        print(f"| {g['family']} | {g['shape']} | {g['calls']} | {g['slowed']} | {_x(g['geomean'])} |")
    slower = slowed_rows(doc)
    print(f"{len(doc['rows'])} calls timed, {len(slower)} slowed after (more than 3 %, or failing); "
          f"{len(doc['not_timed'])} not timed")
    astray = [r for r in doc["rows"] if r.get("labels_hold") is False]
    if astray:
        print(f"{len(astray)} rows name other kernels than the runtime ran (before_kernel, after_kernel): "
              "the tuner's model of the dispatcher differs from it there; prune_runs.py leaves them out")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)  # before torch touches a GPU: a bad option costs nothing
    if args.list:
        print_list(moves_between(args.before, args.after or REPO / "tuning_db" / "sm_90.db", entries=args.entries))
        return 0
    with tempfile.TemporaryDirectory(prefix="cc1d-moves-cache-") as cache:
        # A user's own tuning DB (<cache dir>/tuning.db) would come before both DBs in the
        # dispatcher's chain: an empty cache folder leaves it out (kernels compile afresh).
        os.environ["CC1D_CACHE_DIR"] = cache
        doc = measure(args)
        print_table(doc)
    if args.shapes_out:
        slowed = slowed_rows(doc)
        if slowed:
            write_shapes(args.shapes_out, doc, slowed)
            print(f"{len(slowed)} slowed calls written to {args.shapes_out}")
        else:
            print(f"no call slowed: {args.shapes_out} not written")
    return 0


if __name__ == "__main__":
    from script_exit import exit_with  # a sibling script
    exit_with(main, "bench_moves.py")
