"""The final per-shape table and the JSON report."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from ..generator import EPOCH, Variant
from .search import ShapeResult, winner_row
from .shapes import Shape


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(results: Iterable[ShapeResult]) -> str:
    rows = [("family", "shape", "winner config", "time us", "% copy", "vs default", "vs start", "timed")]
    for r in results:
        family = r.shape.family().key()
        config = r.winner.key()[len(family) + 1:] if r.winner else f"none: {r.note}"
        pct = None if r.copy_fraction is None else 100 * r.copy_fraction
        speed = None if r.speedup is None else r.speedup
        vs_start = r.start_us / r.time_us if r.start_us and r.time_us else None
        rows.append((family, r.shape.key(), config + (" (stored)" if r.resumed else ""),
                     _fmt(r.time_us, ".2f"), _fmt(pct, ".1f"), _fmt(speed, ".3f") + ("x" if speed else ""),
                     _fmt(vs_start, ".3f") + ("x" if vs_start else ""),
                     _fmt(r.timed(), "d") + (" (budget)" if r.budget_spent else "")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def unsearched(results: Iterable[ShapeResult]) -> str | None:
    """A warning naming the shapes where --budget-s ended the search after one candidate
    timed (the start config, or the default): the winner is that kernel, not a search's
    (sessions 72-76: a 6-second budget at a call of 1.2 ms timed only the start at bf16/f32
    (16, 8192, 8192) in four runs). None where there is none."""
    alone = [r for r in results if r.budget_spent and (r.timed() or 0) <= 1]
    if not alone:
        return None
    return (f"{len(alone)} shape{'s' if len(alone) > 1 else ''} not searched: --budget-s ended the search after "
            "one candidate timed, which is the winner (a longer --budget-s searches them): "
            + ", ".join(f"{r.shape.family().key()} ({r.shape.batch}, {r.shape.dim}, {r.shape.seqlen})" for r in alone))


def result_dict(r: ShapeResult) -> dict[str, Any]:
    # The winner's source hash and generator epoch make the report a record one can check a
    # DB against, or store the winners from where the run's DB was lost (the source renders
    # from the config by templates whose output has that hash).
    return dict(family=r.shape.family().key(), shape=r.shape.key(), name=r.shape.name, arch=r.arch,
                winner=r.winner.key() if r.winner else None, config=r.winner.params if r.winner else None,
                source_hash=r.winner.hash() if r.winner else None, epoch=EPOCH,
                time_us=r.time_us, spread=r.spread, default_us=r.default_us, speedup=r.speedup,
                start=r.start.key() if r.start else None, start_us=r.start_us,
                copy_fraction=r.copy_fraction, counts=r.counts, timed=r.timed(), budget_spent=r.budget_spent,
                resumed=r.resumed, note=r.note)


def write_report(path: str | Path, results: list[ShapeResult], **extra: Any) -> None:
    """The JSON report of `results`, whole: written beside `path`, then renamed over it,
    so a reader, or a run killed while writing, never meets half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(dict(**extra, results=[result_dict(r) for r in results]),
                              indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def winners_from_report(report: Any, shapes: Iterable[Shape], where: str = "report") -> list[tuple[str, dict]]:
    """(source, winner row) for each result of a --report JSON that has a winner, for a run
    whose DB was lost. Every entry is checked first: its shape is in `shapes` (the run's
    shapes file), and its config renders with this cc1d's templates to the source hash the
    run timed, under the same generator epoch. ValueError names the first entry that fails."""
    results = report.get("results") if isinstance(report, dict) else None
    if not isinstance(results, list):
        raise ValueError(f"{where}: expected a cc1d-tune --report JSON object with a 'results' list")
    by_key = {(s.family().key(), s.key()): s for s in shapes}
    out = []
    for n, e in enumerate(results):
        if not isinstance(e, dict) or e.get("winner") is None:
            continue  # a shape without a winner stores nothing
        name = f"{where}: result {n} ({e.get('family')} {e.get('shape')})"
        if "source_hash" not in e or "epoch" not in e:
            raise ValueError(f"{name}: no source_hash/epoch (a report from before they were recorded): "
                             "its sources cannot be checked")
        if e["epoch"] != EPOCH:
            raise ValueError(f"{name}: generator epoch {e['epoch']}, this cc1d's is {EPOCH}")
        shape = by_key.get((e["family"], e["shape"]))
        if shape is None:
            raise ValueError(f"{name}: not a shape of the given shapes file (pass the file the run used)")
        try:
            v = Variant.of(shape.family(), **e["config"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name}: config {e['config']} is not in the space: {exc}") from None
        reason = v.why_invalid(e["arch"])
        if reason is not None:
            raise ValueError(f"{name}: {v.key()} is not valid for {e['arch']}: {reason}")
        if v.key() != e["winner"]:
            raise ValueError(f"{name}: its config names {v.key()}, its winner is {e['winner']}")
        if v.hash() != e["source_hash"]:
            raise ValueError(f"{name}: {v.key()} renders to source {v.hash()[:12]}, the run timed "
                             f"{str(e['source_hash'])[:12]} (the templates changed since the run)")
        out.append((v.source, winner_row(
            shape, e["arch"], v, time_us=e["time_us"], default_us=e.get("default_us"),
            copy_fraction=e.get("copy_fraction"), spread=e.get("spread"), speedup=e.get("speedup"),
            environment=report.get("environment", {}))))
    return out
