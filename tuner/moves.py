"""Which untuned calls a change of a DB's winners hands to another kernel.

The dispatcher serves a call without a winner of its own from the nearest tuned shape of
its family (docs/DISPATCH.md), so a new winner also takes over calls far from its own
shape, for better or worse. Session 65's backward entries moved 226 of 630 calls of a grid;
of 17 timed, 10 got faster and 2 clearly slower ((1, 5120, 2048) 22.9 -> 34.0 µs).
`cc1d-tune db merge / import / import-report` print what they moved (moved_calls over a
grid of each changed forward or backward family), so those calls can be timed
(benchmarks/cross_serve.py, bench_near.py) before the DB ships.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import product, zip_longest
from typing import Any, Callable, Iterable, Iterator

from .db import TuningDB, family_from_key, winner_shape
from .serving import serve_from
from .shapes import Shape

GRID_BATCHES = (1, 2, 4, 8, 16)
GRID_LENGTHS = (128, 512, 1000, 2048, 3000, 4096, 8192, 16384)
_ROW_KEYS = ("shape_key", "variant_key", "features", "batch", "dim", "seqlen")

Rows = dict[tuple[str, str], list[dict]]  # (arch, family key) -> its winners rows


@dataclass(frozen=True)
class Move:
    arch: str
    family_key: str
    features: str
    call: tuple[int, int, int]  # (batch, dim, seqlen)
    before: str | None          # the variant served before (None: no winner of the family)
    after: str
    entry: bool = False         # the call is a tuned shape after (its own winner serves it)
    # the tuned shape whose winner serves the call after (not part of the move's identity)
    after_shape: str = field(default="", compare=False)

    def text(self) -> str:
        """One line naming the call and its two variants (the listings of benchmarks/bench_moves.py
        and bench_rule.py)."""
        return (f"{self.arch} {self.family_key} ({self.features or 'no features'}) {self.call}"
                f"{' entry' if self.entry else ''}: {short_variant(self.before, self.family_key)} -> "
                f"{short_variant(self.after, self.family_key)}")

    @property
    def shape(self) -> Shape:
        """The moved call as a shape to time or tune."""
        b, d, n = self.call
        return Shape.of(family_from_key(self.family_key), b, d, n, [f for f in self.features.split(",") if f])


def snapshot(db: TuningDB) -> Rows:
    """The forward and backward winners rows of each (arch, family) of the DB."""
    rows: Rows = defaultdict(list)
    for w in db.winners():
        if w["op"] in ("fwd", "bwd"):
            rows[(w["arch"], w["family_key"])].append(dict(w))
    return dict(rows)


def _signature(rows: list[dict]) -> list[tuple]:
    return sorted(tuple(r[k] for k in _ROW_KEYS) for r in rows)


def grid_calls(family_key: str, rows: list[dict], batches: Iterable[int] = GRID_BATCHES,
               lengths: Iterable[int] = GRID_LENGTHS,
               with_tuned: bool = False) -> Iterator[tuple[str, tuple[int, int, int], Shape]]:
    """The untuned calls of a family's grid, as (features, call, shape): `batches`, the
    family's tuned dims, `lengths`, each feature set the family was tuned with; a tuned shape
    of `rows` is left out (its own winner serves it) unless `with_tuned` (the peer sweep,
    benchmarks/bench_vs_peer.py, times those too)."""
    family = family_from_key(family_key)
    tuned = set() if with_tuned else {r["shape_key"] for r in rows}
    dims = sorted({r["dim"] for r in rows})
    for feats, b, d, n in product(sorted({r["features"] for r in rows}), batches, dims, lengths):
        shape = Shape.of(family, b, d, n, [f for f in feats.split(",") if f])
        if shape.key() not in tuned:
            yield feats, (b, d, n), shape


def moved_calls(before: Rows, after: Rows) -> list[Move]:
    """The calls of the grid (grid_calls) whose served variant differs between two
    snapshots, in each family whose winners changed. A call that is now a tuned shape of
    its own is left out: serving it its own winner is the point."""
    moves = []
    for (arch, fkey), rows in sorted(after.items()):
        old = before.get((arch, fkey), [])
        if _signature(old) == _signature(rows):
            continue
        moves += _grid_moves(arch, fkey, rows, lambda s: serve_from(old, arch, s)["variant_key"] if old else None,
                             lambda s: serve_from(rows, arch, s))
    return moves


def rule_moves(rows: Rows, rank_before: Callable, rank_after: Callable) -> list[Move]:
    """The calls of each family's grid (grid_calls) that two ranking rules (serving.py's
    dispatch_rank and a candidate) serve from winners of different variants: what changing
    the dispatcher's rule would move, the winners unchanged."""
    moves = []
    for (arch, fkey), family_rows in sorted(rows.items()):
        moves += _grid_moves(arch, fkey, family_rows,
                             lambda s: serve_from(family_rows, arch, s, rank_before)["variant_key"],
                             lambda s: serve_from(family_rows, arch, s, rank_after))
    return moves


def _grid_moves(arch: str, fkey: str, rows: list[dict], was: Callable[[Shape], str | None],
                now: Callable[[Shape], dict]) -> list[Move]:
    """The calls of the family's grid (grid_calls of `rows`) whose variant before, `was(shape)`
    (None: none served it), differs from the one of the row `now(shape)` serves them from."""
    moves = []
    for feats, call, shape in grid_calls(fkey, rows):
        before, served = was(shape), now(shape)
        if before != served["variant_key"]:
            moves.append(Move(arch, fkey, feats, call, before, served["variant_key"], after_shape=served["shape_key"]))
    return moves


def round_robin(moves: list[Move], n: int) -> tuple[list[Move], list[Move]]:
    """At most n of the moves, taken from each (arch, family) in turn, each family's in their
    order, so that a cap still reaches every family (in grid order it would spend itself on
    the first families); and the rest, in their order."""
    by_family: dict[tuple[str, str], list[Move]] = defaultdict(list)
    for m in moves:
        by_family[(m.arch, m.family_key)].append(m)
    turns = zip_longest(*(by_family[k] for k in sorted(by_family)))
    taken = [m for turn in turns for m in turn if m is not None][:max(n, 0)]
    chosen = set(taken)
    return taken, [m for m in moves if m not in chosen]


def changed_entries(before: Rows, after: Rows) -> list[Move]:
    """The tuned shapes of `after` whose call was served another variant in `before` (a new
    entry, or a re-tuned one whose winner changed), as moves with entry=True."""
    moves = []
    for (arch, fkey), rows in sorted(after.items()):
        old = before.get((arch, fkey), [])
        for r in sorted(rows, key=lambda r: (r["features"], r["batch"], r["dim"], r["seqlen"])):
            shape = winner_shape(r)
            was = serve_from(old, arch, shape)["variant_key"] if old else None
            if was != r["variant_key"]:
                moves.append(Move(arch, fkey, r["features"], (r["batch"], r["dim"], r["seqlen"]), was,
                                  r["variant_key"], entry=True, after_shape=r["shape_key"]))
    return moves


def describe(moves: list[Move], examples: int = 3, lead: str = "the new winners take") -> list[str]:
    """Lines for the CLI: per family and feature set, how many calls moved and a few of them
    (`lead`: what moved them, "the new winners take" N calls...)."""
    if not moves:
        return []
    groups: dict[tuple[str, str, str], list[Move]] = defaultdict(list)
    for m in moves:
        groups[(m.arch, m.family_key, m.features)].append(m)
    lines = [f"{lead} {len(moves)} untuned calls of a grid (batch {GRID_BATCHES[0]}-"
             f"{GRID_BATCHES[-1]}, the tuned dims, seqlen {GRID_LENGTHS[0]}-{GRID_LENGTHS[-1]}) from the kernel "
             f"that served them: time them before shipping (benchmarks/bench_moves.py --before <a copy of the DB "
             f"from before> --after <this DB>)"]
    for (arch, fkey, feats), ms in groups.items():
        shown = "; ".join(f"{m.call} {short_variant(m.before, fkey)} -> {short_variant(m.after, fkey)}"
                          for m in ms[:examples])
        lines.append(f"  {arch} {fkey} ({feats or 'no features'}): {len(ms)}, e.g. {shown}")
    return lines


def short_variant(variant_key: str | None, family_key: str) -> str:
    """A variant key without its family's prefix (None: no winner served it)."""
    if variant_key is None:
        return "the catalog's default"
    return variant_key[len(family_key) + 1:] if variant_key.startswith(family_key + ".") else variant_key


def report_moves(db: TuningDB, before: Rows, out: Any, lead: str = "the new winners take") -> None:
    """Print (to `out`, a file) what the change since `before` moved."""
    for line in describe(moved_calls(before, snapshot(db)), lead=lead):
        print(line, file=out)
