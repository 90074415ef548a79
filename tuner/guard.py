"""Guarding the calls a run's new winners take over (cc1d-tune --guard DB).

An untuned call runs the winner of the nearest tuned shape (docs/DISPATCH.md), so a new
winner serves the calls around its shape too, and what is fastest at its own shape can be
slower at theirs (H200: session 65's entries took (1, 5120, 2048) from 22.9 to 34.0 µs,
session 66's (1, 4096, 3000) from 28.6 to 31.7). With --guard DB, the DB the run's winners
are to be merged into, the tuner lists the calls of tuner/moves.py's grid whose served
variant the merge would change, times each under the variant DB serves it now and the one
it would serve, and tunes those slowed by more than SLOWER as shapes of their own; their
winners may move other calls, so it checks again, a few rounds at most.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..generator import Variant
from .db import TuningDB, winner_variant
from .evaluate import CandidateError, Evaluator
from .measure import Timing, median_error
from .moves import Move, Rows, moved_calls, short_variant, snapshot
from .shapes import Shape

SLOWER = 1.03  # a call is slowed where its new variant takes more than this times the old one's time
                # (or more than twice the two times' noise, where that is larger)


@dataclass(frozen=True)
class Check:
    move: Move
    before_us: float | None  # None: no variant served it before (the catalog's default did), or it failed
    after_us: float | None   # None: the new variant failed there (an error, below)
    error: str | None = None
    noise: float = 0.0       # relative standard error of the two medians together (measure.median_error)

    @property
    def shape(self) -> Shape:
        return self.move.shape

    @property
    def slowed(self) -> bool:
        """Worse with the new winners: slower beyond SLOWER, or failing where the old ran."""
        if self.after_us is None:
            return self.before_us is not None
        limit = max(SLOWER - 1.0, 2.0 * self.noise)
        return self.before_us is not None and self.after_us > (1.0 + limit) * self.before_us

    def describe(self) -> str:
        fam = self.move.family_key

        def us(t: float | None) -> str:
            return f"{t:.1f} µs" if t is not None else "failed"
        before = f"{short_variant(self.move.before, fam)} {us(self.before_us)}" if self.move.before else "(catalog)"
        note = f" ({self.error})" if self.error else ""
        by = f" (the {self.move.after_shape} entry's)" if self.move.after_shape else ""
        return (f"{fam} {self.shape.key()}: {before} -> {short_variant(self.move.after, fam)}{by} "
                f"{us(self.after_us)}{' SLOWED' if self.slowed else ''}{note}")


def shapes_entry(shape: Shape) -> str:
    """The shape as one entry of a shapes file (tuner/shapes.py load_shapes reads it back)."""
    flags = [f for f in ("seq_idx", "initial_states", "final_states", "state_indices", "width_state")
             if getattr(shape, f)]
    fields = [f"op: {shape.op}", f"layout: {shape.layout}", f"dtypes: {shape.x_dtype}/{shape.w_dtype}",
              f"width: {shape.width}", f"batch: {shape.batch}", f"dim: {shape.dim}", f"seqlen: {shape.seqlen}",
              f"bias: {str(shape.bias).lower()}", f"activation: {shape.activation}", *(f"{f}: true" for f in flags)]
    return "{" + ", ".join(fields) + "}"


def merged_snapshot(guard: Path, run_db: Path) -> Rows:
    """The winners `guard` would hold after `cc1d-tune db merge --db guard run_db`, without
    touching either file (the merge is made on a copy)."""
    with tempfile.TemporaryDirectory(prefix="cc1d-guard-") as tmp:
        with TuningDB(guard, readonly=True) as g:
            copy = g.copy_to(Path(tmp) / "merged.db")
        with TuningDB(copy) as db, TuningDB(run_db, readonly=True) as run:
            db.merge_from(run)
            return snapshot(db)


def pending_moves(guard: Path, run_db: Path, arch: str, families: set[str]) -> tuple[list[Move], dict]:
    """The grid calls of `families` on `arch` that merging the run's winners into `guard`
    moves to another variant, and the variants they name (variants_of)."""
    with TuningDB(guard, readonly=True) as db:
        before = snapshot(db)
    after = merged_snapshot(guard, run_db)
    moves = [m for m in moved_calls(before, after) if m.arch == arch and m.family_key in families]
    return moves, variants_of(before, after)


def variants_of(*snapshots: Rows) -> dict[str, Variant | str]:
    """Every winner variant of the snapshots by key, rebuilt from its row's config (or why
    today's generator cannot rebuild it)."""
    out: dict[str, Variant | str] = {}
    for rows in snapshots:
        for family_rows in rows.values():
            for r in family_rows:
                if r["variant_key"] not in out:
                    try:
                        out[r["variant_key"]] = winner_variant(r)
                    except (KeyError, ValueError) as exc:
                        out[r["variant_key"]] = f"not rebuilt from its config ({exc})"
    return out


def time_at(evaluator: Evaluator, variant: Variant | str) -> tuple[Timing | None, str | None]:
    """The variant's timing at the evaluator's shape (checked against the reference first,
    as every candidate is), or None and why it failed."""
    if isinstance(variant, str):
        return None, variant
    try:
        evaluator.compile(variant)
        evaluator.validate(variant)
        return evaluator.time(variant, None), None
    except CandidateError as exc:
        return None, str(exc)


def check_moves(moves: list[Move], variants: dict[str, Variant | str],
                evaluator_for: Callable[[Shape], Evaluator], known: dict[tuple, Check],
                on_check: Callable[[Check], None] = lambda c: None,
                stop: Callable[[], bool] = lambda: False) -> list[Check]:
    """Each move timed under its old and new variant on the shape's own evaluator; `known`
    keeps the checks of earlier rounds (a call whose two variants did not change is not
    timed again). Once `stop()` is true no further move is timed: the checks of the moves
    before it are returned."""
    out = []
    for m in moves:
        key = (m.arch, m.family_key, m.features, m.call, m.before, m.after)
        if key not in known:
            if stop():
                break
            ev = evaluator_for(m.shape)
            try:
                before, before_err = time_at(ev, variants[m.before]) if m.before else (None, None)
                after, after_err = time_at(ev, variants[m.after])
            finally:
                if hasattr(ev, "close"):  # --isolate's evaluator: its worker process
                    ev.close()
            noise = math.hypot(*(median_error(t) for t in (before, after) if t is not None))
            known[key] = Check(m, before.median_us if before else None, after.median_us if after else None,
                               after_err or before_err, noise)
            on_check(known[key])
        out.append(known[key])
    return out
