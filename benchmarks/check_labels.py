"""A moves benchmark's rows whose kernel names hold: a copy of bench_moves.py's JSON less the
rows whose variants before and after are not the ones tuner/serving.py says the two DBs
serve (bench_vs_peer.py's JSON: its one variant a row, against --after, the DB it ran). No
GPU needed.

bench_moves.py times each call through the runtime but names its kernels from the tuner's
model of the dispatcher. Until session 73 that model broke exact ties (calls midway between
tuned shapes) by shape key, the runtime by batch, dim and seqlen: at such calls the rows
named one kernel and timed another (session 73, H200: forward bf16 (8, 5120, 8192) named
`...hshfl.g64`, ran `...hshfl.g96`, 362 µs). A rule change since (the channel-last tile
misfit) moves some calls too. prune_runs.py keys times by kernel name, so its timings
should be the checked copies. Since session 73 bench_moves.py and bench_vs_peer.py record the
runtime's own kernels in each row (labels_hold), which prune_runs.py heeds: this is for files
older than that.

    python benchmarks/check_labels.py MOVES.json --before BEFORE.db --after AFTER.db --out CHECKED.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench_moves import kernel_key, new_file_error  # a sibling script: run as benchmarks/check_labels.py


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("moves", type=Path, help="bench_moves.py's JSON (--out)")
    ap.add_argument("--before", type=Path, required=True, help="the tuning DB the rows' calls ran before")
    ap.add_argument("--after", type=Path, required=True, help="the tuning DB they ran after")
    ap.add_argument("--out", type=Path, required=True, help="the checked copy (a new file)")
    args = ap.parse_args(argv)
    for name, path in (("moves", args.moves), ("--before", args.before), ("--after", args.after)):
        if not path.is_file():
            ap.error(f"{name}: no such file '{path}'")
    if new_file_error(args.out):
        ap.error(f"--out: expected a new file, got '{args.out}', which {new_file_error(args.out)}")
    return args


def served_key(db, arch: str, row: dict) -> str | None:
    """The variant `db` serves the row's call from (None: no winner of its family)."""
    from cc1d.tuner.db import family_from_key
    from cc1d.tuner.serving import served_winner
    from cc1d.tuner.shapes import Shape
    shape = Shape.of(family_from_key(row["family"]), *row["call"], [f for f in row["features"].split(",") if f])
    winner = served_winner(db, arch, shape)
    return winner["variant_key"] if winner else None


def check(doc: dict, before: Path, after: Path) -> tuple[list[dict], list[dict]]:
    """The rows whose before and after variants (a sweep's row: its variant, after) are what
    the DBs serve, and the others."""
    from cc1d.tuner.db import TuningDB
    kept, wrong = [], []
    with TuningDB(before, readonly=True) as b, TuningDB(after, readonly=True) as a:
        for row in doc["rows"]:
            if "variant" in row:  # bench_vs_peer.py names the catalog's default where no winner serves
                holds = kernel_key(row["family"], served_key(a, doc["arch"], row)) == row["variant"]
            else:
                holds = (served_key(b, doc["arch"], row), served_key(a, doc["arch"], row)) == \
                    (row["before_variant"], row["after_variant"])
            (kept if holds else wrong).append(row)
    return kept, wrong


def main(argv: list[str] | None = None) -> int:
    from timing import write_json
    args = parse_args(argv)
    try:
        doc = json.loads(args.moves.read_text())
        kept, wrong = check(doc, args.before, args.after)
    except (ValueError, KeyError, TypeError) as exc:
        print(f"check_labels.py: {args.moves} is not the JSON of bench_moves.py or bench_vs_peer.py "
              f"({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    write_json(args.out, {**doc, "rows": kept, "labels_checked": dict(before=str(args.before), after=str(args.after),
                                                                      left_out=len(wrong))})
    print(f"{args.moves}: {len(kept)} rows kept, {len(wrong)} left out (their kernels are not what the DBs serve)")
    for r in wrong:
        named = r["variant"] if "variant" in r else f"{r['before_variant']} -> {r['after_variant']}"
        print(f"  {r['family']} {tuple(r['call'])}: named {named}")
    return 0


if __name__ == "__main__":
    from script_exit import exit_with  # a sibling script
    exit_with(main, "check_labels.py")
