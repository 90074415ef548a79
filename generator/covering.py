"""Covering sets of variants, for tests and the sanitizer where every variant is
too many (about 100,000 for sm_90): pairwise per op and layout (every value of
every axis, and every pair of values of two axes, appears in at least one chosen
variant, among the pairs some valid variant has), and per family (every value of
each tunable at least once)."""
from __future__ import annotations

import itertools
from functools import lru_cache

from .space import families
from .variant import Variant, variants


def _axes(v: Variant) -> tuple:
    f = v.family
    return (("dtypes", (f.x_dtype, f.w_dtype)), ("width", f.width), *v.config)


def _pairs(v: Variant) -> frozenset:
    ax = _axes(v)
    return frozenset(itertools.combinations(ax, 2)) | frozenset((a,) for a in ax)


@lru_cache(maxsize=None)
def covering_variants(op: str, layout: str, arch: str = "sm_90") -> tuple[Variant, ...]:
    candidates = [v for f in families(op, layout) for v in variants(f, arch)]
    return _greedy_cover(candidates, [_pairs(v) for v in candidates])


def _greedy_cover(candidates: list[Variant], covers: list[frozenset]) -> tuple[Variant, ...]:
    """Candidates until the union of their `covers` is everyone's: each time the one covering
    most of what is still uncovered (the first of equals)."""
    uncovered = set().union(*covers)
    chosen: list[Variant] = []
    while uncovered:
        best = max(range(len(candidates)), key=lambda i: len(covers[i] & uncovered))
        chosen.append(candidates[best])
        uncovered -= covers[best]
    return tuple(chosen)


def all_covering(arch: str = "sm_90") -> list[Variant]:
    ops_layouts = sorted({(f.op, f.layout) for f in families()})
    return [v for op, lay in ops_layouts for v in covering_variants(op, lay, arch)]


def axis_values(op: str, layout: str, arch: str = "sm_90") -> dict:
    """Every value each axis takes in some valid variant (for the coverage test)."""
    seen: dict = {}
    for f in families(op, layout):
        for v in variants(f, arch):
            for name, value in _axes(v):
                seen.setdefault(name, set()).add(value)
    return seen


def family_cover(family, arch: str = "sm_90") -> tuple[Variant, ...]:
    """Variants of one family such that every value each tunable takes in its valid
    space appears in at least one (greedy: the variant covering most unseen values first)."""
    candidates = list(variants(family, arch))
    return _greedy_cover(candidates, [frozenset(v.config) for v in candidates])
