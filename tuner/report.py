"""The final per-shape table and the JSON report."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from ..generator import EPOCH
from .search import ShapeResult


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(results: Iterable[ShapeResult]) -> str:
    rows = [("family", "shape", "winner config", "time us", "% copy", "vs default")]
    for r in results:
        family = r.shape.family().key()
        config = r.winner.key()[len(family) + 1:] if r.winner else f"none: {r.note}"
        pct = None if r.copy_fraction is None else 100 * r.copy_fraction
        speed = None if r.speedup is None else r.speedup
        rows.append((family, r.shape.key(), config + (" (stored)" if r.resumed else ""),
                     _fmt(r.time_us, ".2f"), _fmt(pct, ".1f"), _fmt(speed, ".3f") + ("x" if speed else "")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def result_dict(r: ShapeResult) -> dict[str, Any]:
    # The winner's source hash and generator epoch make the report a record one can check a
    # DB against, or store the winners from where the run's DB was lost (the source renders
    # from the config by templates whose output has that hash).
    return dict(family=r.shape.family().key(), shape=r.shape.key(), name=r.shape.name, arch=r.arch,
                winner=r.winner.key() if r.winner else None, config=r.winner.params if r.winner else None,
                source_hash=r.winner.hash() if r.winner else None, epoch=EPOCH,
                time_us=r.time_us, spread=r.spread, default_us=r.default_us, speedup=r.speedup,
                copy_fraction=r.copy_fraction, counts=r.counts, resumed=r.resumed, note=r.note)


def write_report(path: str | Path, results: list[ShapeResult], **extra: Any) -> None:
    Path(path).write_text(json.dumps(dict(**extra, results=[result_dict(r) for r in results]),
                                     indent=2, sort_keys=True) + "\n")
