"""`cc1d-tune db rerender --timed` (tuner/retime.py, TuningDB.rerender's judge): a winner
whose kernel a template change reached is timed as stored and as rendered at its shape, and
takes the render only where it is not slower. Fake evaluators stand in for the GPU."""
from __future__ import annotations

import json

import pytest

from cc1d.generator import default_variant, families
from cc1d.tuner.cli import main
from cc1d.tuner.db import TuningDB
from cc1d.tuner.device import DeviceInfo
from cc1d.tuner.retime import StoredVariant, compare, judge_with, scaled_row
from cc1d.tuner.testing import FakeEvaluator

H100 = DeviceInfo("sm_90", "NVIDIA H100 80GB HBM3")
SHAPE = ("b2.d64.l40.bias.silu", 2, 64, 40)


def _times(stored_us: float, render_us: float):
    return lambda v: stored_us if isinstance(v, StoredVariant) else render_us


def _pair(op: str = "bwd", layout: str = "cf"):
    render = default_variant(families(op, layout)[0])
    return StoredVariant(render.family, render.config, render.source + "\n// older\n"), render


def test_a_stored_variant_is_its_own_kernel_with_the_same_geometry():
    stored, render = _pair()
    assert stored.key() == render.key() and stored.geometry() == render.geometry()
    assert stored.source != render.source and stored.hash() != render.hash()
    assert stored != render and len({stored, render}) == 2


def test_compare_alternates_the_order_and_takes_the_median_ratio():
    stored, render = _pair()
    ev = FakeEvaluator(times=_times(10.0, 9.0))
    c = compare(ev, stored, render, rounds=3)
    assert c.error is None and c.ratio == pytest.approx(0.9)
    assert c.stored_us == (10.0,) * 3 and c.render_us == (9.0,) * 3
    assert ev.timed == [render.key()] * 6  # both are the same key: the order is checked below
    order = []
    ev = FakeEvaluator(times=lambda v: order.append(isinstance(v, StoredVariant)) or 1.0)
    compare(ev, stored, render, rounds=4)
    assert order == [True, False, False, True, True, False, False, True]
    assert c.keeps_render(0.0) and not compare(FakeEvaluator(times=_times(10.0, 10.5)), stored,
                                               render).keeps_render(0.01)
    with pytest.raises(ValueError, match="rounds: expected a positive number, got 0"):
        compare(ev, stored, render, rounds=0)


def test_a_render_that_fails_validation_is_never_timed():
    stored, render = _pair()
    ev = FakeEvaluator(wrong=lambda v: not isinstance(v, StoredVariant))
    c = compare(ev, stored, render)
    assert c.ratio is None and not c.keeps_render(1.0) and ev.timed == []
    assert c.error.startswith("the render failed: wrong_result")


def test_scaled_row_scales_the_times_and_notes_the_comparison():
    row = dict(time_us=10.0, default_us=20.0, copy_fraction=0.8, speedup=2.0, spread=0.01,
               environment=json.dumps({"device": "H200"}), source_hash="abc")
    out = scaled_row(row, 0.9, "2026-12-01T06:00:00")
    assert out["time_us"] == pytest.approx(9.0) and out["default_us"] == 20.0
    assert out["copy_fraction"] == pytest.approx(0.8 / 0.9) and out["speedup"] == pytest.approx(2.0 / 0.9)
    assert out["source_hash"] is None and out["environment"]["device"] == "H200"
    assert out["environment"]["rerendered"] == {"at": "2026-12-01T06:00:00", "ratio": 0.9, "stored_us": 10.0}


def _store(db, v, source, time_us=3.5):
    db.put_winner(source, arch="sm_90", family_key=v.family.key(), shape_key=SHAPE[0], op=v.family.op,
                  batch=SHAPE[1], dim=SHAPE[2], seqlen=SHAPE[3], features="bias,silu", variant_key=v.key(),
                  config=v.params, **v.geometry(), time_us=time_us, copy_fraction=0.5, environment={})


def _db_with_two_changed_winners(path):
    """Two winners whose stored kernels differ from today's render (an extra kernel)."""
    fams = families("bwd", "cf")
    vs = [default_variant(fams[0]), default_variant(fams[1])]
    with TuningDB(path) as db:
        for v in vs:
            _store(db, v, v.source + '\nextern "C" __global__ void cc1d_old() {}\n')
    return vs


def _by_bytes(src, arch, opts):  # a fake compiler: another source is another binary
    return (src + arch + " ".join(opts)).encode()


def test_rerender_stores_each_render_its_judge_keeps_and_leaves_the_rest(tmp_path):
    path = tmp_path / "r.db"
    keep, slow = _db_with_two_changed_winners(path)
    seen = []

    def judge(w, stored, render):
        seen.append((w["family_key"], stored != render.source))
        if w["family_key"] == keep.family.key():
            return scaled_row(w, 0.95, "now"), "0.950x"
        return None, "1.100x, slower than 1 + 0.01"

    with TuningDB(path) as db:
        done, left = db.rerender(_by_bytes, judge=judge, workers=2)
        rows = {w["family_key"]: w for w in db.winners()}
        problems = db.validate()
    assert seen == sorted(seen) and {k for k, _ in seen} == {keep.family.key(), slow.family.key()}
    assert all(differs for _, differs in seen)
    assert len(done) == 1 and keep.family.key() in done[0] and done[0].endswith(": 0.950x")
    assert len(left) == 1 and slow.family.key() in left[0] and "1.100x, slower than 1 + 0.01: re-tune it" in left[0]
    assert rows[keep.family.key()]["source_hash"] == keep.hash()
    assert rows[keep.family.key()]["time_us"] == pytest.approx(3.5 * 0.95)
    assert rows[slow.family.key()]["source_hash"] != slow.hash()
    assert len(problems) == 1 and slow.family.key() in problems[0]


def test_rerender_judges_nothing_once_stopped_and_keeps_what_it_stored(tmp_path):
    path = tmp_path / "r.db"
    vs = _db_with_two_changed_winners(path)
    judged = []

    def judge(w, stored, render):
        judged.append(w["family_key"])
        return scaled_row(w, 1.0, "now"), "1.000x"

    with TuningDB(path) as db:
        done, left = db.rerender(_by_bytes, judge=judge, stop=lambda: bool(judged))
        rows = {w["family_key"]: w["source_hash"] for w in db.winners()}
    assert len(judged) == 1 and len(done) == 1 and len(left) == 1
    assert "not timed (stopped: past the deadline)" in left[0]
    assert sum(rows[v.family.key()] == v.hash() for v in vs) == 1


def run(argv, capsys, probe=lambda: None):
    code = main([str(a) for a in argv], probe=probe)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_timed_rerender_checks_its_options_and_needs_a_gpu(nvrtc_rt, tmp_path, capsys):
    path = tmp_path / "r.db"
    _db_with_two_changed_winners(path)
    for flags, msg in ((["--rounds", "0"], "--rounds: expected a positive number, got 0"),
                       (["--tolerance", "-1"], "--tolerance: expected 0 or a positive fraction"),
                       (["--deadline-s", "0"], "--deadline-s: expected a positive number of seconds, got 0.0"),
                       ([], "rerender --timed: no GPU is visible")):
        code, _, err = run(["db", "rerender", "--db", path, "--timed", *flags], capsys)
        assert code == 2 and msg in err, err


def test_timed_rerender_on_a_fake_gpu(nvrtc_rt, tmp_path, capsys, monkeypatch):
    """The render of one winner times 0.9x its stored kernel, the other's 1.1x: the first
    is stored with its time scaled, the second left; each render validated first."""
    from cc1d.tuner import evaluate
    path = tmp_path / "r.db"
    fast, slow = _db_with_two_changed_winners(path)
    made = []

    def evaluator(rt, shape, arch):
        assert arch == "sm_90" and (shape.batch, shape.dim, shape.seqlen) == SHAPE[1:]
        render_factor = 0.9 if len(made) == 0 else 1.1  # winners are judged in family order
        made.append(FakeEvaluator(times=lambda v: 10.0 if isinstance(v, StoredVariant) else 10.0 * render_factor))
        return made[-1]

    monkeypatch.setattr(evaluate, "GpuEvaluator", evaluator)
    code, out, _ = run(["db", "rerender", "--db", path, "--timed", "--rounds", "2"], capsys, probe=lambda: H100)
    assert code == 1 and "1 winners re-rendered" in out and "1 left" in out, out
    assert "10.00 µs stored, 9.00 µs rendered: 0.900x over 2 rounds" in out
    assert "11.00 µs rendered: 1.100x over 2 rounds, slower than 1 + 0.01: re-tune it" in out
    assert all(len(e.validated) == 1 and len(e.timed) == 4 for e in made)
    with TuningDB(path, readonly=True) as db:
        rows = {w["family_key"]: w for w in db.winners()}
    first = min(rows)
    assert rows[first]["time_us"] == pytest.approx(3.5 * 0.9)
    assert json.loads(rows[first]["environment"])["rerendered"]["ratio"] == 0.9


def test_judge_with_leaves_a_winner_whose_render_fails(tmp_path):
    stored, render = _pair()
    judge = judge_with(lambda w: FakeEvaluator(launch_fails=lambda v: not isinstance(v, StoredVariant)))
    row, what = judge({"time_us": 1.0}, stored.source, render)
    assert row is None and what.startswith("the render failed: launch_error")


def test_judge_with_leaves_a_winner_the_device_cannot_time_and_goes_on():
    stored, render = _pair()

    def evaluator_for(w):
        if w["n"] == 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 4.00 GiB\nmore")
        return FakeEvaluator(times=_times(10.0, 9.0))

    judge = judge_with(evaluator_for)
    row, what = judge({"n": 1, "time_us": 1.0}, stored.source, render)
    assert row is None and what == "not timed: CUDA out of memory. Tried to allocate 4.00 GiB"
    row, what = judge({"n": 2, "time_us": 1.0, "environment": "{}"}, stored.source, render)
    assert row["time_us"] == pytest.approx(0.9) and what.endswith("0.900x over 3 rounds")
