"""Variant sets the tests parametrize over, taken from the generator's and the shipped
DB's own lists (so a new covering variant or winner is tested the moment it exists)."""
from __future__ import annotations

from pathlib import Path

from cc1d.generator.covering import all_covering
from cc1d.tuner.db import TuningDB, winner_variant

SHIPPED_DB = Path(__file__).resolve().parent.parent / "tuning_db" / "sm_90.db"


def covering_and_shipped(op: str, layout: str) -> list:
    """Every sm_90 variant of `op` in `layout` of the covering set and of the shipped DB's
    winners, once each, sorted by key."""
    chosen = {v.key(): v for v in all_covering("sm_90") if (v.family.op, v.family.layout) == (op, layout)}
    with TuningDB(SHIPPED_DB, readonly=True) as db:
        for w in db.winners("sm_90"):
            if w["op"] == op and w["family_key"].split(".")[1] == layout:
                v = winner_variant(w)
                chosen.setdefault(v.key(), v)
    return sorted(chosen.values(), key=lambda v: v.key())
