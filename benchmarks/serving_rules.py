"""The serving rules benchmarks/cross_serve.py and bench_rule.py compare, and how they are
scored offline (no GPU): a rule ranks a family's winners rows for a call, as the dispatcher
does (tuner/serving.py dispatch_rank: features, then tiling misfit, then a shape distance);
its regret at a call is the time of the variant it picks over the fastest one's, less one,
on a matrix cross_serve.py measured (score, weight_search) or on tuning runs' trials, each
entry left out in turn (trial_times, loo_score).
"""
from __future__ import annotations

import math
from collections import defaultdict
from itertools import product
from pathlib import Path
from typing import Callable


def _log_apart(a: float, b: float) -> float:
    return abs(math.log(a) - math.log(b))


def current_rank(shape, row: dict, arch: str) -> tuple:
    """The dispatcher's rule (tuner/serving.py dispatch_rank): since session 68 the backward's
    is weighted-1/2/0.5's, the other ops' is product's."""
    from cc1d.tuner.serving import dispatch_rank
    return dispatch_rank(shape, row, arch)


def product_rank(shape, row: dict, arch: str) -> tuple:
    """The dispatcher's rule for every op until session 68: batch x seqlen as one axis, and dim."""
    features, misfit, _ = current_rank(shape, row, arch)
    return features, misfit, _log_apart(shape.batch * shape.seqlen, row["batch"] * row["seqlen"]) + \
        _log_apart(shape.dim, row["dim"])


def weights_rank(batch: float, seqlen: float, dim: float) -> Callable:
    """A rule like the dispatcher's (features, then tiling misfit) whose distance counts batch,
    seqlen and dim apart, each |log| weighted: the backward's rule is (1, 2, 0.5)."""
    def rank(shape, row: dict, arch: str) -> tuple:
        features, misfit, _ = current_rank(shape, row, arch)
        return features, misfit, batch * _log_apart(shape.batch, row["batch"]) + \
            seqlen * _log_apart(shape.seqlen, row["seqlen"]) + dim * _log_apart(shape.dim, row["dim"])
    return rank


# The rules cross_serve.py's --score and --loo and bench_rule.py compare. seqlen-apart: a kernel's fit to its
# sequence (segments, tiles) does not carry over to a batch of the same work. weighted-1/2/0.5:
# the best of 27 weight sets on session 66's matrix (7.1 % against product's 8.6 %); 7.0 %
# against 19.8 % on session 67's leave-one-out trials, 16.6 % against 21.2 % on session 68's
# fresh grid; the dispatcher's backward rule since session 68 (moved forward calls lost).
# weighted-0.5/4/0: the best sum of cross_serve.py --weights' 75 sets on sessions 66's and
# 68's matrices (7.0 / 11.5 %; left one out, 7.3 % against 7.0 %), 48 calls for 75 sets: a
# lead, which bench_rule.py then timed against weighted-1/2/0.5 (session 69, H200: 96 backward
# calls, 23 faster, 22 slower, 1.02x): not adopted. cl-tile-misfit (a channel-last tile over twice
# the sequence a misfit): session 72's candidate, timed in session 73 (11 forward calls of length
# 128 moved, all faster, 2.86x), then the dispatcher's (tuner/serving.py tiling_misfits).
RULES: dict[str, Callable] = {"current": current_rank, "product": product_rank,
                              "seqlen-apart": weights_rank(1, 2, 1), "weighted-1/2/0.5": weights_rank(1, 2, 0.5),
                              "weighted-0.5/4/0": weights_rank(0.5, 4, 0)}
# cross_serve.py --weights' grid: every (batch, seqlen, dim) weight triple of these.
WEIGHT_GRID = ((0.5, 1, 2), (0.5, 1, 2, 3, 4), (0, 0.25, 0.5, 1, 2))


def pick(rows: list[dict], shape, rank: Callable, arch: str) -> dict:
    """The row a rule serves the shape's calls from: the shape's own, else the lowest rank."""
    from cc1d.tuner.serving import serve_from
    return serve_from(rows, arch, shape, rank)


def call_shape(family, batch: int, dim: int, seqlen: int, features: list[str]):
    """The tuner's Shape of a call of the family with these features (bias, silu)."""
    from cc1d.tuner.shapes import Shape
    return Shape(family.op, family.layout, family.x_dtype, family.w_dtype, family.width, batch, dim, seqlen,
                 bias="bias" in features, activation="silu" if "silu" in features else "none")


def regret_summary(rule: str, picks: list[tuple[dict[str, float], str, str]], missed: str) -> dict:
    """One rule's regret over its picks, each (the times measured at a call, the call's shape
    key, the variant the rule chose): mean, median and worst of (chosen / fastest - 1), the
    calls within 5 % of the fastest, and under `missed` the calls whose choice has no time."""
    regrets, worst, lost = [], None, 0
    for times, call, chosen in picks:
        if chosen not in times:
            lost += 1
            continue
        r = times[chosen] / min(times.values()) - 1
        regrets.append(r)
        if worst is None or r > worst[0]:
            worst = (r, call, chosen)
    ordered = sorted(regrets)
    return {"rule": rule, "calls": len(regrets), missed: lost,
            "mean": sum(regrets) / len(regrets) if regrets else math.nan,
            "median": ordered[len(ordered) // 2] if ordered else math.nan,
            "worst": worst[0] if worst else math.nan, "worst_call": worst[1] if worst else None,
            "within_5pct": sum(r <= 0.05 for r in regrets)}


def score(matrix: dict, rules: dict[str, Callable] = RULES) -> list[dict]:
    """Each rule's regret over the matrix's calls (regret_summary; `failed`: the calls where
    the pick failed to run)."""
    from cc1d.tuner.db import family_from_key
    family = family_from_key(matrix["family"])
    out = []
    for name, rank in rules.items():
        picks = []
        for call in matrix["calls"]:
            times = {k: t for k, t in call["times"].items() if t is not None}
            shape = call_shape(family, call["batch"], call["dim"], call["seqlen"], matrix["features"])
            picks.append((times, shape.key(), pick(matrix["rows"], shape, rank, matrix["arch"])["variant_key"]))
        out.append(regret_summary(name, picks, "failed"))
    return out


def weight_search(matrices: list[dict], grid: tuple = WEIGHT_GRID) -> list[dict]:
    """Every weight triple of the grid scored on each matrix (score's mean regret), best
    summed regret first; a triple whose picks all failed on a matrix sorts last."""
    out = []
    for weights in product(*grid):
        rank = weights_rank(*weights)
        means = [score(m, {"w": rank})[0]["mean"] for m in matrices]
        out.append(dict(weights=weights, means=means, total=math.fsum(means)))
    return sorted(out, key=lambda r: (math.isnan(r["total"]), r["total"]))


def trial_times(paths: list[Path], arch: str, family_key: str, epochs: dict[str, int]) -> dict[str, dict[str, float]]:
    """Shape key -> variant key -> its fastest trial on `arch` in the DBs (timed in full, or
    stopped early as slower: both are measured medians), for the shapes of `epochs` (shape
    key -> the entry's epoch) and the trials of that epoch only: an older template's kernel
    is another kernel."""
    from cc1d.tuner.db import TuningDB
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for path in paths:
        with TuningDB(path, readonly=True) as db:
            for key, epoch in epochs.items():
                for t in db.trials(arch, family_key, key):
                    us = t["time_us"]
                    if t["status"] in ("ok", "slow") and t["epoch"] == epoch and us is not None and us > 0:
                        if us < out[key].get(t["variant_key"], math.inf):
                            out[key][t["variant_key"]] = us
    return dict(out)


def loo_score(rows: list[dict], times: dict[str, dict[str, float]], arch: str,
              rules: dict[str, Callable] = RULES) -> list[dict]:
    """Each rule's leave-one-out regret over the entries (rows) with trials: the entry left
    out, the rule's pick among the others, its variant's trial time over the fastest
    (regret_summary; `unknown`: the picks never timed at the entry's shape)."""
    from cc1d.tuner.db import winner_shape
    out = []
    for name, rank in rules.items():
        picks = []
        for r in rows:
            if r["shape_key"] not in times:
                continue
            shape = winner_shape(r)
            others = [o for o in rows if o["shape_key"] != r["shape_key"]]
            picks.append((times[r["shape_key"]], shape.key(), pick(others, shape, rank, arch)["variant_key"]))
        out.append(regret_summary(name, picks, "unknown"))
    return out
