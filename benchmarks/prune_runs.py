"""Which winners of guarded tuning runs to ship: the calls the runs' winners move, each
looked up in the timings the moves benchmarks took. No GPU needed.

A guarded device run (benchmarks/device_tune.sh) brings back its DB (tune.db) and the moves
it timed (moves.json, from bench_moves.py; a peer sweep's JSON from bench_vs_peer.py serves
too). They time a sample of the calls its winners would move: a winner tuned at one shape
also serves the calls around it, and can slow some. This merges the runs' winners into a
copy of the DB before them, lists every call whose kernel changes (tuner/moves.py's grid,
and the new entries' own calls), and takes each call's time under its kernel before and
after from whichever JSON timed that kernel at that call (the median where several did).

With --out-dir it prunes: every winner that serves a timed call slowed by more than 3 % is
left out and the moves listed again, until none is; each run's DB less those winners is
written there, to `cc1d-tune db merge` into the shipped DB. The summary is the pruned
merge's: per family the calls that change kernel, those timed under both kernels, their
geometric mean speed after against before, how many are faster or slower by more than
3 %, and how many are behind the peer (where it was timed) before and after. Above it,
each moved call that no timing covers under both kernels is listed, marked where the
pruning itself made the move (a winner left out hands its calls to the nearest other entry,
whose kernel no run timed there): time those before shipping. With
--behind-out, every timed call (moved or not) whose kernel after the merge ran more than
3 % slower than the peer there is written as a shapes file, worst first: the next run's.
With --slowed-out, the slowed calls (those that left a winner out, with --out-dir; else the
merge's) are written as a shapes file too, each once, with the kernel that served it before:
tuned as entries of their own (from the DB with the runs merged unpruned), they let the
winners that slowed them keep their own gains. Neither file is written where it would list
no call (cc1d-tune refuses a shapes file without shapes); the output says so.
With --guard-logs, the calls the runs' guard rounds timed (their tune.log lines) count too,
where no timings file timed them: a guard stopped by its deadline leaves the calls it found
slowed untuned, served by the winner that slowed them, and no moves benchmark may have timed
them again. A call a timings file timed keeps the files' times alone (see add_untimed_calls).

    python benchmarks/prune_runs.py --before BEFORE.db --runs r1/tune.db r2/tune.db \\
        --timings r1/moves.json r2/moves.json sweep.json [--guard-logs r1/tune.log r2/tune.log] \\
        [--out-dir pruned/] [--behind-out behind.yaml] [--slowed-out slowed.yaml]
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from bench_moves import (kernel_key, moves_between, new_file_error,  # a sibling script: run as benchmarks/prune_runs.py
                         write_shapes_file)
from cc1d.tuner.guard import SLOWER  # above this ratio, slowed: the guard's and bench_moves.py's 3 %
from cc1d.tuner.moves import Move, short_variant


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="the tuning DB the runs' winners would go into")
    ap.add_argument("--runs", type=Path, nargs="+", required=True, help="the runs' tuning DBs (tune.db)")
    ap.add_argument("--timings", type=Path, nargs="+", required=True,
                    help="JSON rows of bench_moves.py or bench_vs_peer.py (--out) that timed the moved calls")
    ap.add_argument("--guard-logs", type=Path, nargs="+", default=[],
                    help="cc1d-tune logs (tune.log) whose guard rounds' timings count too")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="prune, and write each run's DB less the winners left out here (a new folder)")
    ap.add_argument("--behind-out", type=Path, default=None,
                    help="write the timed calls behind the peer after the merge as a shapes file (a new file)")
    ap.add_argument("--slowed-out", type=Path, default=None,
                    help="write the slowed calls (with --out-dir, those that left a winner out) as a shapes "
                         "file (a new file), to tune as entries of their own")
    args = ap.parse_args(argv)
    for name, paths in (("--before", [args.before]), ("--runs", args.runs), ("--timings", args.timings),
                        ("--guard-logs", args.guard_logs)):
        for path in paths:
            if not path.is_file():
                ap.error(f"{name}: no such file '{path}'")
    if args.out_dir is not None and args.out_dir.exists():
        ap.error(f"--out-dir: expected a new folder, got '{args.out_dir}', which exists")
    for name, path in (("--behind-out", args.behind_out), ("--slowed-out", args.slowed_out)):
        if path is not None and new_file_error(path):
            ap.error(f"{name}: expected a new file, got '{path}', which {new_file_error(path)}")
    if args.behind_out is not None and args.slowed_out is not None and \
            args.behind_out.resolve() == args.slowed_out.resolve():
        ap.error(f"--behind-out and --slowed-out: expected two files, got '{args.behind_out}' for both")
    return args


class TimingsError(ValueError):
    """A timings file that is not a benchmark's JSON rows."""


def load_timings(paths: list[Path]) -> tuple[str, dict[tuple, dict[str, list[float]]]]:
    """The files' arch, and (family key, features, call) -> variant key (or "peer") -> the
    times measured there, in µs: bench_moves.py's rows give the kernels before and after,
    bench_vs_peer.py's the one it served; rows that failed or were not timed give none, nor
    do rows whose kernels the runtime named otherwise (labels_hold false)."""
    times: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    archs = {}
    for path in paths:
        try:
            doc = json.loads(path.read_text())
            archs[path] = doc["arch"]
            for r in doc["rows"]:
                if r.get("labels_hold") is False:
                    continue  # the runtime ran other kernels than the row names (bench_moves.py labels_hold)
                at = times[(r["family"], r["features"], tuple(r["call"]))]
                pairs = [("before_variant", "before_us"), ("after_variant", "after_us"), ("variant", "cc1d_us")]
                for variant, us in pairs:  # a row has the first two (bench_moves.py) or the third
                    if variant in r and isinstance(r.get(us), (int, float)):
                        at[kernel_key(r["family"], r[variant])].append(float(r[us]))
                if isinstance(r.get("peer_us"), (int, float)):
                    at["peer"].append(float(r["peer_us"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise TimingsError(f"--timings: {path} is not the JSON rows of bench_moves.py or bench_vs_peer.py "
                               f"({type(exc).__name__}: {exc})") from None
    if len(set(archs.values())) > 1:
        raise TimingsError("--timings: expected the files of one arch, got " +
                           ", ".join(f"{p} {a}" for p, a in archs.items()))
    return next(iter(archs.values())), times


# A guard round's line for a call it timed (tuner/guard.py Check.describe): the family, the
# call's shape key, the variant that served it and its time, then the new one's. A call no
# winner served before ("(catalog)") or where a variant failed has no pair of times.
GUARD_LINE = re.compile(r"^\s+(?P<family>\S+) b(?P<b>\d+)\.d(?P<d>\d+)\.l(?P<l>\d+)(?P<features>(?:\.\w+)*): "
                        r"(?P<before>\S+) (?P<before_us>[\d.]+) µs -> (?P<after>\S+)(?: \(the \S+ entry's\))? "
                        r"(?P<after_us>[\d.]+) µs")


def load_guard_logs(paths: list[Path], times: dict[tuple, dict[str, list[float]]]) -> int:
    """Add the times each log's guard rounds took to `times` (as load_timings keys them);
    returns how many calls they timed."""
    n = 0
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            m = GUARD_LINE.match(line)
            if m is None:
                continue
            family = m["family"]
            at = times[(family, m["features"][1:].replace(".", ","), (int(m["b"]), int(m["d"]), int(m["l"])))]
            at[f"{family}.{m['before']}"].append(float(m["before_us"]))
            at[f"{family}.{m['after']}"].append(float(m["after_us"]))
            n += 1
    return n


def add_untimed_calls(times: dict[tuple, dict[str, list[float]]],
                      guard: dict[tuple, dict[str, list[float]]]) -> int:
    """Add to `times` the calls of `guard` it holds no time for; returns how many. A guard
    times in the tuner's own runs, not the moves benchmark's (session 81: the same kernels
    1-2 % slower), so in one median with the files' its times would be set against the
    peer's, which only the files hold (session 81's summary counted 3 calls behind the peer
    where the files alone gave 1)."""
    added = 0
    for call, kernels in guard.items():
        if call not in times:
            times[call] = kernels
            added += 1
    return added


def copy_db(src: Path, dest: Path) -> Path:
    """A one-file copy of a tuning DB (SQLite's backup: a run killed mid-write leaves what it
    stored last in its -wal file, which a file copy would miss)."""
    from cc1d.tuner.db import TuningDB
    with TuningDB(src, readonly=True) as db:
        return db.copy_to(dest)


def merged(before: Path, runs: list[Path], left_out: set[tuple[str, str, str]], folder: Path) -> Path:
    """A copy of `before` with each run's winners merged in (where faster, as `cc1d-tune db
    merge`), but for `left_out` ((arch, family key, shape key))."""
    from cc1d.tuner.db import TuningDB
    folder = Path(tempfile.mkdtemp(dir=folder))  # each merge its own files
    path = copy_db(before, folder / "merged.db")
    with TuningDB(path) as db:
        for i, run in enumerate(runs):
            with TuningDB(pruned_copy(run, left_out, folder / f"run{i}.db"), readonly=True) as other:
                db.merge_from(other)
    return path


def pruned_copy(run: Path, left_out: set[tuple[str, str, str]], path: Path) -> Path:
    """The run's DB at `path`, less the winners of `left_out` it holds."""
    from cc1d.tuner.db import TuningDB
    with TuningDB(copy_db(run, path)) as db:
        for arch, family, shape in left_out:
            if db.winner(arch, family, shape) is not None:
                db.drop_winner(arch, family, shape)
    return path


def assess(before: Path, after: Path, times: dict) -> list[dict]:
    """Each call whose kernel changes from `before` to `after`, with its median times under
    both kernels and the peer's where they were timed (None where not)."""
    out = []
    for m in moves_between(before, after, entries=True):
        at = times.get((m.family_key, m.features, m.call), {})
        keys = {"before_us": kernel_key(m.family_key, m.before), "after_us": m.after, "peer_us": "peer"}
        out.append(dict(move=m, **{k: statistics.median(at[v]) if at.get(v) else None for k, v in keys.items()}))
    return out


def timed(row: dict) -> bool:
    """Whether the row's call was timed under both its kernels."""
    return row["before_us"] is not None and row["after_us"] is not None


def slowed(row: dict) -> bool:
    return timed(row) and row["after_us"] > SLOWER * row["before_us"]


def prune(before: Path, runs: list[Path], times: dict,
          folder: Path) -> tuple[set, list[dict], list[dict], Path, set[Move]]:
    """Leave out every winner that serves a timed call slowed by more than 3 %, until the
    merge less them slows none. Returns what was left out, the calls that made it so (as
    first found), the pruned merge's moved calls, the pruned merge, and the unpruned
    merge's moves (against which untimed_lines names the moves the pruning made)."""
    left_out: set[tuple[str, str, str]] = set()
    why: list[dict] = []
    unpruned: set[Move] | None = None
    while True:
        after = merged(before, runs, left_out, folder)
        rows = assess(before, after, times)
        if unpruned is None:
            unpruned = {r["move"] for r in rows}
        bad = [r for r in rows if slowed(r)]
        if not bad:
            return left_out, why, rows, after, unpruned
        why += bad
        left_out |= {(r["move"].arch, r["move"].family_key, r["move"].after_shape) for r in bad}


def behind_calls(after: Path, arch: str, times: dict) -> list[tuple[float, object]]:
    """Every timed call whose kernel in `after` (the winner the dispatcher serves it from
    there, else the family's default) ran more than 3 % slower than the peer, as (its speed
    against the peer, its shape), slowest first."""
    from cc1d.tuner.db import TuningDB
    from cc1d.tuner.serving import served_winner
    out = []
    with TuningDB(after, readonly=True) as db:
        for (family, features, call), at in times.items():
            shape = Move(arch, family, features, call, None, "").shape
            row = served_winner(db, arch, shape)
            served = kernel_key(family, row["variant_key"] if row else None)
            if at.get(served) and at.get("peer"):
                speed = statistics.median(at["peer"]) / statistics.median(at[served])
                if speed < 1 / SLOWER:
                    out.append((speed, shape))
    return sorted(out, key=lambda x: x[0])


def write_behind(path: Path, calls: list[tuple[float, object]], header: str) -> None:
    """The calls as a shapes file for cc1d-tune, each with its speed against the peer."""
    write_shapes_file(path, header, [(shape, f"{speed:.2f}x") for speed, shape in calls])


def write_slowed(path: Path, rows: list[dict], header: str) -> int:
    """The slowed calls as a shapes file for cc1d-tune, each once (the first row naming it),
    with the kernel that served it before and its times; returns how many."""
    first: dict[tuple, dict] = {}
    for r in rows:
        m = r["move"]
        first.setdefault((m.family_key, m.features, m.call), r)
    write_shapes_file(path, header, [
        (r["move"].shape, f"{kernel_key(r['move'].family_key, r['move'].before)} {r['before_us']:.1f} -> "
                          f"{r['after_us']:.1f} µs (the {r['move'].after_shape} entry's)") for r in first.values()])
    return len(first)


def untimed_lines(rows: list[dict], unpruned: set[Move] | None) -> list[str]:
    """The moved calls not timed under both kernels, one line each: the summary counts them
    but nothing vouches for them. Where `unpruned` (the unpruned merge's moves) is given, a
    move it lacks is marked as the pruning's own: with a winner left out, the call went to
    another entry's kernel, which no run timed there (session 80: (4, 2048, 1000), 0.86x)."""
    out = []
    for r in rows:
        if timed(r):
            continue
        m = r["move"]
        made = " (a move the pruning made)" if unpruned is not None and m not in unpruned else ""
        out.append(f"untimed: {m.family_key} {m.call} {short_variant(m.before, m.family_key)} -> "
                   f"{short_variant(m.after, m.family_key)} (the {m.after_shape} entry's){made}")
    return out


def summary_lines(rows: list[dict]) -> list[str]:
    """The moved calls per family and in all, as a markdown table."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r["move"].family_key].append(r)
    head = ["| family | calls moved (entries) | timed under both kernels | geometric mean after vs before | "
            "faster > 3 % | slower > 3 % | behind the peer > 3 %, before -> after (of those timed with it) |",
            "|---|---|---|---|---|---|---|"]

    def line(name: str, rs: list[dict]) -> str:
        both = [r for r in rs if timed(r)]
        speed = [r["before_us"] / r["after_us"] for r in both]
        peer = [r for r in both if r["peer_us"] is not None]
        behind = [sum(r[k] > SLOWER * r["peer_us"] for r in peer) for k in ("before_us", "after_us")]
        gm = f"{statistics.geometric_mean(speed):.2f}x ({min(speed):.2f}-{max(speed):.2f}x)" if speed else "-"
        return (f"| {name} | {len(rs)} ({sum(r['move'].entry for r in rs)}) | {len(both)} | {gm} | "
                f"{sum(s > SLOWER for s in speed)} | {sum(s < 1 / SLOWER for s in speed)} | "
                f"{behind[0]} -> {behind[1]} ({len(peer)}) |")
    return head + [line(f, groups[f]) for f in sorted(groups)] + [line("all", rows)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        arch, times = load_timings(args.timings)
    except TimingsError as exc:
        print(f"prune_runs.py: {exc}", file=sys.stderr)
        return 2
    guard_times: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    guarded = load_guard_logs(args.guard_logs, guard_times)
    guard_only = add_untimed_calls(times, guard_times)
    with tempfile.TemporaryDirectory(prefix="cc1d-prune-") as tmp:
        folder = Path(tmp)
        if args.out_dir is None:
            left_out, why, unpruned = set(), [], None
            after = merged(args.before, args.runs, left_out, folder)
            rows = assess(args.before, after, times)
        else:
            left_out, why, rows, after, unpruned = prune(args.before, args.runs, times, folder)
            args.out_dir.mkdir(parents=True)
            for i, run in enumerate(args.runs):
                pruned_copy(run, left_out, args.out_dir / f"{i + 1}-{run.name}")
        if args.behind_out is not None:
            behind = behind_calls(after, arch, times)
            if behind:
                write_behind(args.behind_out, behind, f"the timed calls behind the peer by more than 3 % after "
                             f"{len(args.runs)} runs{' (pruned)' if args.out_dir else ''} merged into "
                             f"{args.before} (benchmarks/prune_runs.py), slowest first")
        if args.slowed_out is not None:
            victims = why if args.out_dir is not None else [r for r in rows if slowed(r)]
            header = (f"the timed calls that the runs' winners slowed by more than 3 % from {args.before} "
                      "(benchmarks/prune_runs.py), with the kernel that served each before: to tune as entries "
                      "of their own")
            n_slowed = write_slowed(args.slowed_out, victims, header) if victims else 0
    print(f"{len(args.runs)} runs merged into a copy of {args.before}; timings from {len(args.timings)} files"
          + (f", and {guarded} calls from {len(args.guard_logs)} guard logs ({guard_only} timed in no timings "
             "file: only those count)" if args.guard_logs else ""))
    if args.out_dir is not None:
        n = len(left_out)
        print(f"left out: {n} winner{'' if n == 1 else 's'}, whose moves slowed a timed call by more than 3 %")
        for r in why:
            m = r["move"]
            print(f"  {m.family_key} {m.after_shape}: {m.call} {r['before_us']:.1f} -> {r['after_us']:.1f} µs")
        print(f"the runs' DBs less them: {args.out_dir}/<n>-<name>")
    for r in rows:
        if slowed(r):
            m = r["move"]
            print(f"slowed: {m.family_key} {m.call} {r['before_us']:.1f} -> {r['after_us']:.1f} µs "
                  f"(served by the {m.after_shape} entry)")
    untimed = untimed_lines(rows, unpruned)
    if untimed:  # none: no line at all, as before these were listed
        one = len(untimed) == 1
        print("\n".join(untimed))
        print(f"{len(untimed)} moved call{'' if one else 's'} not timed under both kernels: time "
              f"{'it' if one else 'them'} before shipping (benchmarks/bench_moves.py --before {args.before} "
              "--after <the DB with the runs merged>)")
    print("\n".join(summary_lines(rows)))
    # As bench_moves.py --shapes-out: a shapes file lists at least one shape.
    if args.behind_out is not None:
        print(f"{len(behind)} timed calls behind the peer by more than 3 % written to {args.behind_out}" if behind
              else f"no timed call behind the peer: {args.behind_out} not written")
    if args.slowed_out is not None:
        print(f"{n_slowed} slowed call{'' if n_slowed == 1 else 's'} written to {args.slowed_out}" if n_slowed
              else f"no call slowed: {args.slowed_out} not written")
    return 0


if __name__ == "__main__":
    from script_exit import exit_with  # a sibling script
    exit_with(main, "prune_runs.py")
