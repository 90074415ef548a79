"""A winner's stored source timed against today's render of its config (`cc1d-tune db
rerender --timed`).

A template change that reaches the kernels (a shorter walk loop, say) leaves each winner
it touches with a stored source unlike today's render, which `db validate` refuses: that
winner was timed as the old kernel. Instead of a re-tune, the two kernels are compared
where the winner was tuned: the render validated against the reference on fresh data, both
timed at the winner's own shape on the tuner's evaluator (the build the dispatcher serves
there), in alternating order over several rounds so that a drifting clock favours
neither. The render replaces the stored source where the median of the rounds' ratios
(render / stored) is at most 1 + tolerance; the row's times are then the stored ones
scaled by that ratio, so they stay comparable with the run that tuned it (its default's
time, its copy ceiling). A winner the render slows keeps its row: a re-tune's business.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Callable

from ..generator import Variant
from .db import now
from .evaluate import CandidateError, Evaluator

DEFAULT_ROUNDS = 3
DEFAULT_TOLERANCE = 0.01  # a render up to 1 % slower is still stored: within timing noise (--tolerance)


@dataclass(frozen=True)
class StoredVariant(Variant):
    """A winner's variant built from the source its DB row stores (older templates'
    render of the same config) in place of today's render: its own key in an
    evaluator's caches, the same geometry and builds."""
    stored_source: str = ""

    @property
    def source(self) -> str:  # type: ignore[override]
        return self.stored_source


@dataclass(frozen=True)
class Comparison:
    stored_us: tuple[float, ...]  # one time per round, each kernel's
    render_us: tuple[float, ...]
    error: str | None = None      # why the two were not timed (a compile or validation failure)

    @property
    def ratio(self) -> float | None:
        """The median over rounds of render / stored (None where not timed)."""
        if self.error or not self.stored_us:
            return None
        return statistics.median(r / s for r, s in zip(self.render_us, self.stored_us))

    def keeps_render(self, tolerance: float) -> bool:
        return self.ratio is not None and self.ratio <= 1.0 + tolerance

    def describe(self) -> str:
        if self.error:
            return self.error
        med = statistics.median
        return (f"{med(self.stored_us):.2f} µs stored, {med(self.render_us):.2f} µs rendered: "
                f"{self.ratio:.3f}x over {len(self.stored_us)} rounds")


def compare(evaluator: Evaluator, stored: Variant, render: Variant, rounds: int = DEFAULT_ROUNDS) -> Comparison:
    """Both kernels compiled, the render validated (the stored kernel was when it was
    tuned, and the gpu tests run it), then each timed `rounds` times, the order swapped
    every round."""
    if rounds < 1:
        raise ValueError(f"rounds: expected a positive number, got {rounds}")
    for name, v in (("stored source", stored), ("render", render)):
        try:
            evaluator.compile(v)
            if v is render:
                evaluator.validate(v)
        except CandidateError as exc:
            return Comparison((), (), f"the {name} failed: {exc}")
    times: dict[int, list[float]] = {0: [], 1: []}
    pair = (stored, render)
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            try:
                times[i].append(evaluator.time(pair[i], None).median_us)
            except CandidateError as exc:
                return Comparison((), (), f"timing the {('stored source', 'render')[i]} failed: {exc}")
    return Comparison(tuple(times[0]), tuple(times[1]))


def scaled_row(row: dict, ratio: float, at: str) -> dict:
    """A winner row for the render: its time, copy fraction and speedup over the default
    scaled by the measured ratio, the comparison noted in its environment."""
    env = row.get("environment") or {}
    env = json.loads(env) if isinstance(env, str) else dict(env)
    env["rerendered"] = {"at": at, "ratio": round(ratio, 4), "stored_us": row["time_us"]}
    out = {**row, "time_us": row["time_us"] * ratio, "environment": env, "source_hash": None}
    for k in ("copy_fraction", "speedup"):
        if out.get(k):
            out[k] = out[k] / ratio
    return out


def judge_with(evaluator_for: Callable[[dict], Evaluator], rounds: int = DEFAULT_ROUNDS,
               tolerance: float = DEFAULT_TOLERANCE) -> Callable[[dict, str, Variant], tuple[dict | None, str]]:
    """`TuningDB.rerender`'s judge: for a winner, its stored source and today's render,
    (the row to store the render with where it is not slower, else None; a line saying
    what was measured). `evaluator_for(winner)` makes the evaluator of its shape."""
    def judge(winner: dict, stored_source: str, render: Variant) -> tuple[dict | None, str]:
        stored = StoredVariant(render.family, render.config, stored_source)
        try:
            ev = evaluator_for(winner)
            try:
                c = compare(ev, stored, render, rounds)
            finally:
                if hasattr(ev, "close"):
                    ev.close()
        except RuntimeError as exc:  # the device's (out of memory, say): this winner left, the run goes on
            return None, f"not timed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        if c.keeps_render(tolerance):
            return scaled_row(winner, c.ratio, now()), c.describe()
        if c.ratio is None:
            return None, c.describe()
        return None, f"{c.describe()}, slower than 1 + {tolerance:g}"
    return judge
