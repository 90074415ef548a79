"""cc1d-tune report: the HTML page and PNG plots from a tuning DB built here with
the tuner's own writer, and from the shipped DB (opened read-only, left unchanged)."""
from __future__ import annotations

import hashlib
import random
import re
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from cc1d.generator import default_variant, families
from cc1d.tuner.cli import main
from cc1d.tuner.db import TuningDB

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _build_db(path: Path) -> dict:
    """Two families: one with trials (convergence), one without. Returns what was written."""
    rng = random.Random(7)
    fam_a, fam_b = families("fwd", "cf")[0], families("fwd", "cl")[1]
    written = {}
    with TuningDB(path) as db:
        for fam, shapes, with_trials in ((fam_a, ["b1.d64.l128.bias.silu", "b2.d96.l1000"], True),
                                         (fam_b, ["b3.d33.l77.silu"], False)):
            v = default_variant(fam)
            for shape in shapes:
                times = [rng.uniform(5, 50) for _ in range(9)]
                best = min(times)
                default_us = best * rng.uniform(1.1, 2.5)
                if with_trials:
                    for i, t in enumerate(times):
                        db.add_trial(run_id="r", arch="sm_90", family_key=fam.key(), shape_key=shape,
                                     variant_key=v.key(), config=v.params, status="ok", time_us=t)
                    db.add_trial(run_id="r", arch="sm_90", family_key=fam.key(), shape_key=shape,
                                 variant_key=v.key(), config=v.params, status="compile_error", error="x")
                db.put_winner(v.source, arch="sm_90", family_key=fam.key(), shape_key=shape, op="fwd", batch=1,
                              dim=64, seqlen=128, features="bias,silu", variant_key=v.key(), config=v.params,
                              **v.geometry(), time_us=best, default_us=default_us, copy_fraction=0.6,
                              speedup=default_us / best, environment={"device": "Test GPU"})
                written[(fam.key(), shape)] = dict(times=times, best=best, default_us=default_us)
    return written


def _check_pngs(out: Path, names) -> None:
    for name in names:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, name


def test_report_from_a_db_built_here(tmp_path, capsys):
    db = tmp_path / "t.db"
    written = _build_db(db)
    out = tmp_path / "report"
    assert main(["report", "--db", str(db), "--out", str(out)]) == 0
    assert f"wrote {out / 'index.html'}" in capsys.readouterr().out
    page = (out / "index.html").read_text()
    imgs = re.findall(r"<img src='([^']+)'", page)
    fa, fb = families("fwd", "cf")[0].key(), families("fwd", "cl")[1].key()
    assert sorted(imgs) == sorted([f"pct_copy_sm_90_{fa}.png", f"speedup_sm_90_{fa}.png",
                                   f"convergence_sm_90_{fa}.png", f"pct_copy_sm_90_{fb}.png",
                                   f"speedup_sm_90_{fb}.png"])
    _check_pngs(out, imgs)
    assert sorted(p.name for p in out.iterdir()) == sorted(imgs + ["index.html"])
    assert "Test GPU" in page and "No trials stored" in page and "Peer kernels" in page
    for (fam, shape), w in written.items():
        row = re.search(rf"<tr><td>{re.escape(shape)}</td>(.*?)</tr>", page).group(1)
        cells = re.findall(r"<td>(.*?)</td>", row)
        assert cells[1] == f"{w['best']:.2f}" and cells[2] == f"{w['default_us']:.2f}"
        assert cells[3] == "60.0 %"
        assert cells[4] == f"{60.0 * w['best'] / w['default_us']:.1f} %"
        assert cells[5] == f"{w['default_us'] / w['best']:.3f}x"
        assert cells[6] == ("9" if fam == fa else "-")  # the compile_error trial is not counted


def test_best_so_far_is_the_running_minimum(tmp_path):
    from cc1d.tuner.report_html import load_problems
    db = tmp_path / "t.db"
    written = _build_db(db)
    with TuningDB(db, create=False, readonly=True) as handle:
        problems = load_problems(handle)
    for p in problems:
        times = written[(p.family, p.shape)]["times"] if p.best_so_far else []
        assert p.best_so_far == [min(times[:i + 1]) for i in range(len(times))]


def test_report_from_the_shipped_db_leaves_it_unchanged(tmp_path):
    shipped = REPO / "tuning_db" / "sm_90.db"
    if not shipped.exists():
        pytest.skip("tuning_db/sm_90.db not in this checkout")
    before = hashlib.sha256(shipped.read_bytes()).hexdigest()
    out = tmp_path / "shipped"
    assert main(["report", "--db", str(shipped), "--out", str(out)]) == 0
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == before
    assert not any(shipped.with_name(shipped.name + s).exists() for s in ("-wal", "-shm", "-journal"))
    page = (out / "index.html").read_text()
    imgs = re.findall(r"<img src='([^']+)'", page)
    con = sqlite3.connect(f"file:{shipped}?mode=ro", uri=True)
    n_winners, n_families = con.execute("SELECT COUNT(*), COUNT(DISTINCT family_key) FROM winners").fetchone()
    con.close()
    assert len(imgs) >= 2 * n_families and all(i.startswith(("pct_copy_", "speedup_")) for i in imgs)
    _check_pngs(out, imgs)
    assert f"{n_winners} tuned shapes" in page


def test_report_errors(tmp_path, capsys):
    assert main(["report", "--db", str(tmp_path / "missing.db"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", "--db", str(tmp_path / "x.db")])  # --out is required
