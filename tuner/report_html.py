"""``cc1d-tune report``: an HTML page with PNG plots of what tuning bought.

Reads a tuning DB (read-only) and writes ``index.html`` plus, per kernel family,
``pct_copy_<family>.png`` (% of a device copy's bandwidth, default vs tuned, per
shape), ``speedup_<family>.png`` (default time / tuned time) and, where the DB
kept its trials, ``convergence_<family>.png`` (best time so far vs trial number,
per shape). Peers' numbers are not in the DB schema (v1), so no peer column is
drawn; the page says so.
"""
from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .db import TuningDB


@dataclass
class Problem:
    """One tuned (arch, family, shape) and its numbers."""
    arch: str
    family: str
    shape: str
    variant: str
    time_us: float
    default_us: float | None
    copy_fraction: float | None
    device: str
    best_so_far: list[float] = field(default_factory=list)  # per ok trial, in the order they ran

    @property
    def speedup(self) -> float | None:
        return self.default_us / self.time_us if self.default_us else None

    @property
    def default_copy_fraction(self) -> float | None:
        # both kernels move the same bytes, so % of copy scales with 1 / time
        if self.copy_fraction is None or not self.default_us:
            return None
        return self.copy_fraction * self.time_us / self.default_us


def load_problems(db: TuningDB) -> list[Problem]:
    problems = []
    for w in db.winners():
        env = json.loads(w["environment"] or "{}")
        p = Problem(w["arch"], w["family_key"], w["shape_key"], w["variant_key"], w["time_us"], w["default_us"],
                    w["copy_fraction"], str(env.get("device", "")))
        best = float("inf")
        for t in db.trials(w["arch"], w["family_key"], w["shape_key"]):
            if t["status"] == "ok" and t["time_us"] is not None:
                best = min(best, t["time_us"])
                p.best_so_far.append(best)
        problems.append(p)
    return problems


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _pyplot() -> Any:
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def _bar_figure(plt: Any, labels: list[str], series: list[tuple[str, list[float | None]]], ylabel: str,
                title: str, path: Path, hline: float | None = None) -> None:
    n = len(labels)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * n + 2), 4.2))
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(n)]
        ax.bar(xs, [v if v is not None else 0.0 for v in values], width, label=name)
    if hline is not None:
        ax.axhline(hline, color="black", linewidth=0.8)
    ax.set_xticks(range(n))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _convergence_figure(plt: Any, problems: list[Problem], title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for p in problems:
        ax.plot(range(1, len(p.best_so_far) + 1), p.best_so_far, marker=".", markersize=3, linewidth=1,
                label=p.shape)
    ax.set_xlabel("trial (ok candidates, in the order timed)")
    ax.set_ylabel("best time so far (us)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    if len(problems) <= 12:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def write_html_report(db_path: str | Path, out_dir: str | Path) -> Path:
    """Write index.html and the PNGs into out_dir; returns the index.html path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with TuningDB(db_path, create=False, readonly=True) as db:
        problems = load_problems(db)
    plt = _pyplot()
    families: dict[tuple[str, str], list[Problem]] = {}
    for p in problems:
        families.setdefault((p.arch, p.family), []).append(p)

    sections = []
    for (arch, family), probs in sorted(families.items()):
        slug = _slug(f"{arch}_{family}")
        labels = [p.shape for p in probs]
        figs = []
        pct = f"pct_copy_{slug}.png"
        _bar_figure(plt, labels, [("default", [None if p.default_copy_fraction is None else
                                               100 * p.default_copy_fraction for p in probs]),
                                  ("tuned", [None if p.copy_fraction is None else 100 * p.copy_fraction
                                             for p in probs])],
                    "% of copy bandwidth", f"{arch} {family}: % of a device copy", out / pct, hline=100.0)
        figs.append(pct)
        spd = f"speedup_{slug}.png"
        _bar_figure(plt, labels, [("tuned vs default", [p.speedup for p in probs])], "speedup (default / tuned)",
                    f"{arch} {family}: speedup over the default variant", out / spd, hline=1.0)
        figs.append(spd)
        with_trials = [p for p in probs if p.best_so_far]
        if with_trials:
            conv = f"convergence_{slug}.png"
            _convergence_figure(plt, with_trials, f"{arch} {family}: search convergence", out / conv)
            figs.append(conv)
        rows = "".join(
            f"<tr><td>{html.escape(p.shape)}</td><td><code>{html.escape(p.variant[len(family) + 1:])}</code></td>"
            f"<td>{_fmt(p.time_us, '.2f')}</td><td>{_fmt(p.default_us, '.2f')}</td>"
            f"<td>{_fmt(None if p.copy_fraction is None else 100 * p.copy_fraction, '.1f', ' %')}</td>"
            f"<td>{_fmt(None if p.default_copy_fraction is None else 100 * p.default_copy_fraction, '.1f', ' %')}</td>"
            f"<td>{_fmt(p.speedup, '.3f', 'x')}</td><td>{len(p.best_so_far) or '-'}</td></tr>" for p in probs)
        note = "" if with_trials else "<p class=note>No trials stored for this family (a finalized DB may " \
                                      "have dropped them): no convergence plot.</p>"
        sections.append(
            f"<h2 id='{slug}'>{html.escape(arch)} · {html.escape(family)}</h2>\n"
            + "".join(f"<img src='{f}' alt='{f}'>\n" for f in figs) + note
            + "<table><tr><th>shape</th><th>tuned config</th><th>tuned µs</th><th>default µs</th>"
              "<th>tuned % copy</th><th>default % copy</th><th>speedup</th><th>ok trials</th></tr>"
            + rows + "</table>\n")

    devices = sorted({p.device for p in problems if p.device})
    speedups = [p.speedup for p in problems if p.speedup]
    summary = (f"{len(problems)} tuned shapes in {len(families)} families"
               + (f"; speedup over the default: median {sorted(speedups)[len(speedups) // 2]:.2f}x, "
                  f"max {max(speedups):.2f}x" if speedups else ""))
    toc = "".join(f"<li><a href='#{_slug(f'{a}_{f}')}'>{html.escape(a)} · {html.escape(f)}</a></li>"
                  for a, f in sorted(families))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>cc1d tuning report</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:2em auto}} img{{max-width:100%;margin:.5em 0}}
table{{border-collapse:collapse;font-size:13px}} td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}
.note{{color:#555}}</style></head><body>
<h1>cc1d tuning report</h1>
<p>DB: <code>{html.escape(str(db_path))}</code>; device(s): {html.escape(', '.join(devices) or 'not recorded')}.<br>
{html.escape(summary)}.</p>
<p class=note>% of copy: bytes the kernel must move / its time, as a fraction of a device-to-device copy's
bandwidth measured in the same tuning run (the default's from the default variant re-timed beside the winner).
Peer kernels' numbers are not stored in tuning DBs (schema v{db_schema_version(db_path)}), so none are drawn.</p>
<ul>{toc}</ul>
{''.join(sections) if sections else '<p>No winners in this DB.</p>'}
</body></html>
"""
    index = out / "index.html"
    index.write_text(page)
    return index


def db_schema_version(db_path: str | Path) -> str:
    with TuningDB(db_path, create=False, readonly=True) as db:
        return db.meta().get("schema_version", "?")
