"""Which tuned winner serves a call: the runtime dispatcher's rule (runtime/src/dispatch.cpp,
docs/DISPATCH.md) written in Python, for the tuner (start points, served winners), the DB
commands that report moved calls, and benchmarks/cross_serve.py. No Optuna here: the
benchmarks rank rows on a machine without the tuner's search stack.
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable

from ..generator.space import bwd_cf_walked
from ..generator.variant import cf_segment_positions
from .db import TuningDB
from .shapes import FEATURES, Shape

# runtime/src/dispatch.cpp's rank terms: each differing feature, and a tiling misfit.
FEATURE_MISMATCH_RANK = 1000.0
MISFIT_RANK = 500.0


def dispatch_rank(shape: Shape, row: dict, arch: str) -> tuple[int, bool, float]:
    """How the dispatcher ranks a winners-table row of the shape's family for the shape's
    calls (docs/DISPATCH.md), lowest first: differing features, then whether the row's
    kernel fits the shape's sequence poorly (tiling_misfits), then the distance."""
    theirs = set(filter(None, row["features"].split(",")))
    return len(set(shape.features()) ^ theirs), tiling_misfits(shape, row, arch), shape_distance(shape, row)


def runtime_rank(shape: Shape, row: dict, arch: str) -> float:
    """dispatch_rank as the one double the runtime compares (dispatch.cpp: the distance, plus
    1000 for each differing feature, plus 500 for a misfit, summed in that order), so that
    near-ties round alike in both."""
    differing, misfit, distance = dispatch_rank(shape, row, arch)
    return distance + FEATURE_MISMATCH_RANK * differing + (MISFIT_RANK if misfit else 0.0)


def entry_order(row: dict) -> tuple[int, int, int, int]:
    """Where the runtime keeps a row among its family's entries (runtime/src/tuning_db.cpp
    sorts them by features as bits, batch, dim, seqlen); of rows that rank alike, the first
    serves. A call midway between tuned shapes ranks them exactly alike (batch 8 at seqlen
    8192: batch x seqlen 4 x 8192 and 16 x 2048 are one product), so this order, not the
    shape key's text, decides which kernel it runs."""
    bits = sum(1 << i for i, (name, _) in enumerate(FEATURES) if name in row["features"].split(","))
    return bits, row["batch"], row["dim"], row["seqlen"]


def shape_distance(shape: Shape, row: dict) -> float:
    """runtime/src/dispatch.cpp shape_distance: log-space distance, backward with batch, seqlen
    and dim apart (weighted 1 / 2 / 0.5), the other ops with batch x seqlen as one axis."""
    if shape.op == "bwd":
        return _apart(shape.batch, row["batch"]) + 2 * _apart(shape.seqlen, row["seqlen"]) + \
            0.5 * _apart(shape.dim, row["dim"])
    return _apart(shape.batch * shape.seqlen, row["batch"] * row["seqlen"]) + _apart(shape.dim, row["dim"])


def _apart(a: float, b: float) -> float:
    return abs(math.log(a) - math.log(b))


def tiling_misfits(shape: Shape, row: dict, arch: str) -> bool:
    """Whether the row's kernel fits the shape's sequence poorly (runtime/src/dispatch.cpp
    tiling_misfit). Channel-first: its segment is longer than the sequence (no row runs a
    whole segment on the fast path; but for a backward's walked segments in their plain
    build, where the rows meet the vectors), or, backward, its tile of several segments side
    by side is more than twice the sequence (most of each block's warps idle). Channel-last
    (session 73): its tile is more than twice the sequence."""
    if shape.op not in ("fwd", "bwd"):
        return False
    if shape.layout == "cl":
        return row["tile_l"] > 2 * shape.seqlen
    seg = cf_segment_positions(row, arch)
    if seg <= 0:
        return False  # a geometry no kernel has (the runtime's rule alike)
    if shape.op == "bwd" and row["tile_l"] // seg > 1 and 2 * shape.seqlen < row["tile_l"]:
        return True
    if shape.seqlen >= seg:
        return False
    if shape.op == "fwd":
        return True
    rows_off_vectors = shape.seqlen * shape.family().x_bytes % row["align_bytes"] != 0  # served by the twin
    return not bwd_cf_walked(json.loads(row["config"])) or rows_off_vectors


def served_winner(db: TuningDB, arch: str, shape: Shape) -> dict | None:
    """The winner of `db` that the dispatcher would serve the shape's calls from it: the
    exact one, else the lowest runtime_rank of the family, the first in entry_order of those
    alike (alignment aside: the tuner's inputs are fresh, 256-byte aligned allocations)."""
    return serve_from([r for r in db.winners(arch) if r["family_key"] == shape.family().key()], arch, shape)


def serve_from(rows: list[dict], arch: str, shape: Shape,
               rank: Callable[[Shape, dict, str], Any] = runtime_rank) -> dict | None:
    """served_winner among `rows`, the winners rows of the shape's family and arch (`rank`:
    another ranking rule to try in its place, benchmarks/cross_serve.py; ties go as the
    runtime's, to the first in entry_order)."""
    key = shape.key()
    exact = next((r for r in rows if r["shape_key"] == key), None)
    if exact is not None:
        return exact
    return min(sorted(rows, key=entry_order), key=lambda r: rank(shape, r, arch)) if rows else None
