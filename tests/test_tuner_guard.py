"""cc1d-tune --guard DB (tuner/guard.py) without a GPU: the calls a run's winners would take
over in DB are timed under the old and the new variant (the tuner's fake evaluator, its
times depending on the call), the slowed ones tuned as shapes of their own, and checked
again; the guard DB is never written."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cc1d.generator import default_variant, variants
from cc1d.tuner import cli, evaluate, measure
from cc1d.tuner.db import TuningDB, family_from_key
from cc1d.tuner.guard import SLOWER, Check, check_moves, merged_snapshot, pending_moves, shapes_entry
from cc1d.tuner.moves import Move
from cc1d.tuner.shapes import Shape, load_shapes
from cc1d.tuner.testing import FakeEvaluator

from test_tuner_cli import H100, _store_winner, run

FAMILY = family_from_key("fwd.cf.bf16wf32.w4")
DEFAULT = default_variant(FAMILY)
OTHERS = [v for v in variants(FAMILY) if v != DEFAULT][:2]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _guard_db(path: Path) -> Path:
    """Two winners of the family, neither the default: at (1, 64, 128) and (1, 64, 16384)."""
    with TuningDB(path) as db:
        for v, n in zip(OTHERS, (128, 16384)):
            _store_winner(db, v, v.source, f"b1.d64.l{n}.bias.silu", 1, 64, n)
    return path


def _move(call=(1, 64, 2048), before="a", after="b") -> Move:
    return Move("sm_90", FAMILY.key(), "bias,silu", call, before, after)


@pytest.mark.parametrize("before, after, slowed", [
    (10.0, 10.3, False), (10.0, 10.0 * SLOWER + 0.01, True), (10.0, 8.0, False),
    (None, 12.0, False),  # nothing served it before (the catalog's default): nothing to compare
    (10.0, None, True),   # the new variant fails where the old one ran
])
def test_a_call_is_slowed_beyond_the_tolerance_or_where_it_now_fails(before, after, slowed):
    assert Check(_move(), before, after).slowed is slowed


def test_noisy_times_need_a_larger_difference():
    assert Check(_move(), 10.0, 10.5, noise=0.01).slowed      # 5 % > 3 %, the floor
    assert not Check(_move(), 10.0, 10.5, noise=0.03).slowed  # 5 % < twice 3 % of noise
    assert Check(_move(), 10.0, 10.7, noise=0.03).slowed


def test_a_shapes_entry_reads_back_as_the_shape(tmp_path):
    shapes = [Shape.of(FAMILY, 3, 64, 2000, ["bias", "silu"]),
              Shape.of(family_from_key("bwd.cl.f16wf16.w3"), 1, 96, 700, ["seqidx"]),
              Shape.of(family_from_key("upd.cl.bf16wbf16.w4"), 16, 5120, 1, ["bias", "pool"])]
    path = tmp_path / "s.yaml"
    path.write_text("shapes:\n" + "".join(f"  - {shapes_entry(s)}\n" for s in shapes))
    assert [s.family().key() + " " + s.key() for s in load_shapes(path)] == \
        [s.family().key() + " " + s.key() for s in shapes]


def test_the_merged_view_leaves_both_files_as_they_were(tmp_path):
    guard = _guard_db(tmp_path / "guard.db")
    run_db = tmp_path / "run.db"
    with TuningDB(run_db) as db:
        _store_winner(db, DEFAULT, DEFAULT.source, "b1.d64.l1024.bias.silu", 1, 64, 1024)
    digests = (_digest(guard), _digest(run_db))
    rows = merged_snapshot(guard, run_db)[("sm_90", FAMILY.key())]
    assert sorted(r["seqlen"] for r in rows) == [128, 1024, 16384]
    assert (_digest(guard), _digest(run_db)) == digests
    moves, found = pending_moves(guard, run_db, "sm_90", {FAMILY.key()})
    assert moves and all(m.after == DEFAULT.key() for m in moves)
    assert all(m.before in found and m.after in found for m in moves)
    assert pending_moves(guard, run_db, "sm_90", {"fwd.cl.bf16wf32.w4"})[0] == []


def test_the_merged_view_holds_what_the_guard_db_holds_in_its_wal(tmp_path):
    """A guard DB another connection holds open keeps its last commits in its -wal file; the
    merged view (made on a copy) must hold them too, as reading the guard DB does."""
    guard = _guard_db(tmp_path / "guard.db")
    run_db = tmp_path / "run.db"
    with TuningDB(run_db) as db:
        _store_winner(db, DEFAULT, DEFAULT.source, "b1.d64.l1024.bias.silu", 1, 64, 1024)
    with TuningDB(guard) as open_db:
        open_db.conn.execute("DELETE FROM winners WHERE seqlen = 16384")
        assert (tmp_path / "guard.db-wal").exists()
        rows = merged_snapshot(guard, run_db)[("sm_90", FAMILY.key())]
    assert sorted(r["seqlen"] for r in rows) == [128, 1024]


def test_checks_are_timed_once_and_failures_kept():
    made = []

    closed = []

    def evaluator_for(shape):
        made.append(shape.key())
        ev = FakeEvaluator(times=lambda v: 10.0 if v == OTHERS[0] else 12.0, launch_fails=lambda v: v == OTHERS[1])
        ev.close = lambda: closed.append(shape.key())
        return ev
    found = {OTHERS[0].key(): OTHERS[0], DEFAULT.key(): DEFAULT, OTHERS[1].key(): OTHERS[1],
             "gone": "not rebuilt from its config (no such tunable)"}
    old = OTHERS[0].key()
    moves = [_move((1, 64, 2048), old, DEFAULT.key()), _move((2, 64, 2048), old, OTHERS[1].key()),
             _move((4, 64, 2048), None, DEFAULT.key()), _move((8, 64, 2048), old, "gone")]
    known: dict = {}
    checks = check_moves(moves, found, evaluator_for, known)
    assert closed == made  # an isolated evaluator's worker is let go after its call
    assert [(c.before_us, c.after_us, c.slowed) for c in checks] == \
        [(10.0, 12.0, True), (10.0, None, True), (None, 12.0, False), (10.0, None, True)]
    assert "launch_error" in checks[1].error and "not rebuilt" in checks[3].error
    again = check_moves(moves, found, evaluator_for, known)
    assert again == checks and len(made) == 4  # nothing timed twice


def _fake_gpu(monkeypatch, slow_seqlen=2048):
    """Evaluators whose times depend on the call: the default variant is fastest everywhere
    (so it wins the tuned shape) but at `slow_seqlen`, where it takes 3x the guard DB's
    winners' time."""
    made = []

    def gpu_evaluator(rt, shape, arch):
        made.append(shape.key())

        def times(v):
            if v == DEFAULT:
                return 30.0 if shape.seqlen == slow_seqlen else 5.0
            return 10.0 if v in OTHERS else 20.0
        return FakeEvaluator(times=times)
    monkeypatch.setattr(evaluate, "GpuEvaluator", gpu_evaluator)
    monkeypatch.setattr(measure, "copy_bandwidth", lambda: 3e12)
    monkeypatch.setattr(cli, "_runtime", lambda: None)
    return made


def test_guard_tunes_the_calls_the_new_winner_slows(tmp_path, capsys, monkeypatch):
    _fake_gpu(monkeypatch)
    guard = _guard_db(tmp_path / "guard.db")
    digest = _digest(guard)
    shapes = tmp_path / "s.yaml"
    shapes.write_text("- {layout: cf, dtypes: bf16/f32, width: 4, batch: 1, dim: 64, seqlen: 1024}\n")
    report, run_db = tmp_path / "r.json", tmp_path / "run.db"
    code, out, err = run(["--shapes", shapes, "--db", run_db, "--trials", "3", "--guard", guard,
                          "--report", report], capsys, probe=lambda: H100)
    assert code == 0, err
    assert _digest(guard) == digest
    assert "guard round 1: the run's winners move" in out and "SLOWED" in out
    with TuningDB(run_db, readonly=True) as db:
        tuned = {(w["batch"], w["seqlen"]): w["variant_key"] for w in db.winners("sm_90")}
    assert tuned[(1, 1024)] == DEFAULT.key()
    added = [k for k in tuned if k != (1, 1024)]
    assert added and all(n == 2048 for _, n in added)  # only the calls the default is slow at
    assert all(tuned[k] in {v.key() for v in OTHERS} for k in added)  # the guard DB's config, tried first
    lines = out.splitlines()
    entries = lines[lines.index("guard: add the tuned calls to the shapes file, so a re-tune keeps them:") + 1:]
    yaml = tmp_path / "added.yaml"
    yaml.write_text("shapes:\n" + "".join(ln + "\n" for ln in entries if ln.startswith("  - {")))
    assert sorted((s.batch, s.seqlen) for s in load_shapes(yaml)) == sorted(added)
    data = json.loads(report.read_text())
    assert data["complete"] and data["shapes"] == 1 + len(added) == len(data["results"])
    assert [r["name"] for r in data["results"]] == [""] + ["guard-round-1"] * len(added)  # the report says why


def test_a_harmless_winner_ends_the_guard_in_one_round(tmp_path, capsys, monkeypatch):
    made = _fake_gpu(monkeypatch, slow_seqlen=-1)  # the default is fastest at every call
    guard = _guard_db(tmp_path / "guard.db")
    shapes = tmp_path / "s.yaml"
    shapes.write_text("- {layout: cf, dtypes: bf16/f32, width: 4, batch: 1, dim: 64, seqlen: 1024}\n")
    code, out, _ = run(["--shapes", shapes, "--db", tmp_path / "run.db", "--trials", "3", "--guard", guard,
                        "--guard-max-calls", "2"], capsys, probe=lambda: H100)
    assert code == 0
    assert "guard round 1: no call slowed by more than 3 %" in out and "guard round 2" not in out
    assert "; timing 2, each family in turn" in out and "not timed (past --guard-max-calls 2): 2 calls, fwd.cf." in out
    assert len(made) == 1 + 2  # the tuned shape, then the two calls timed


@pytest.mark.parametrize("extra, message", [
    (["--guard", "NONE"], "--guard: expected a tuning DB file"),
    (["--guard", "GUARD", "--compile-only"], "--guard times calls on the GPU: not with --compile-only"),
    (["--guard", "GUARD", "--workers", "2"], "--guard runs in one process: not with --workers or --storage"),
    (["--guard", "GUARD", "--db", "GUARD"], "--guard: expected another DB than --db"),
    (["--guard", "GUARD", "--guard-rounds", "0"], "--guard-rounds: expected a positive number, got 0"),
    (["--guard-max-calls", "0"], "--guard-max-calls: expected a positive number, got 0"),
])
def test_guard_options_are_checked(tmp_path, capsys, extra, message):
    guard = _guard_db(tmp_path / "guard.db")
    shapes = tmp_path / "s.yaml"
    shapes.write_text("- {layout: cf, dtypes: bf16/f32, width: 4, batch: 1, dim: 64, seqlen: 1024}\n")
    argv = ["--shapes", shapes, "--arch", "sm_90"] + [
        {"GUARD": guard, "NONE": tmp_path / "none.db"}.get(a, a) for a in extra]
    code, _, err = run(argv, capsys, probe=lambda: H100)
    assert code == 2 and message in err, err


class _Clock:
    """cli's clock for --deadline-s: each evaluator made (one per shape tuned or call timed)
    takes `step` seconds."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def monotonic(self) -> float:
        return self.now


def _clocked_gpu(monkeypatch, step, slow_seqlen=2048):
    clock = _Clock(step)
    monkeypatch.setattr(cli, "time", clock)
    made = _fake_gpu(monkeypatch, slow_seqlen)
    inner = evaluate.GpuEvaluator

    def gpu_evaluator(rt, shape, arch):
        clock.now += clock.step
        return inner(rt, shape, arch)
    monkeypatch.setattr(evaluate, "GpuEvaluator", gpu_evaluator)
    return made


THREE_SHAPES = "".join(f"- {{layout: cf, dtypes: bf16/f32, width: 4, batch: 1, dim: 64, seqlen: {n}}}\n"
                       for n in (256, 1024, 4096))


def test_no_shape_starts_past_the_deadline(tmp_path, capsys, monkeypatch):
    made = _clocked_gpu(monkeypatch, step=6.0)
    shapes = tmp_path / "s.yaml"
    shapes.write_text(THREE_SHAPES)
    report, run_db = tmp_path / "r.json", tmp_path / "run.db"
    code, out, _ = run(["--shapes", shapes, "--db", run_db, "--trials", "3", "--deadline-s", "10",
                        "--report", report], capsys, probe=lambda: H100)
    assert code == 1  # work was left
    assert made == ["b1.d64.l256.bias.silu", "b1.d64.l1024.bias.silu"]  # started at 0 s and 6 s
    assert "stopped by --deadline-s 10: 1 shapes not tuned: fwd.cf.bf16wf32.w4 (1, 64, 4096)" in out
    with TuningDB(run_db, readonly=True) as db:
        assert sorted(w["seqlen"] for w in db.winners("sm_90")) == [256, 1024]
    data = json.loads(report.read_text())
    assert not data["complete"] and len(data["results"]) == 2 and data["shapes"] == 3


def test_a_deadline_that_is_not_reached_changes_nothing(tmp_path, capsys, monkeypatch):
    _clocked_gpu(monkeypatch, step=1.0)
    shapes = tmp_path / "s.yaml"
    shapes.write_text(THREE_SHAPES)
    code, out, _ = run(["--shapes", shapes, "--db", tmp_path / "run.db", "--trials", "3",
                        "--deadline-s", "100"], capsys, probe=lambda: H100)
    assert code == 0 and "--deadline-s" not in out


def test_the_guard_stops_timing_and_tuning_at_the_deadline(tmp_path, capsys, monkeypatch):
    made = _clocked_gpu(monkeypatch, step=5.0)
    guard = _guard_db(tmp_path / "guard.db")
    shapes = tmp_path / "s.yaml"
    shapes.write_text("- {layout: cf, dtypes: bf16/f32, width: 4, batch: 1, dim: 64, seqlen: 1024}\n")
    run_db = tmp_path / "run.db"
    code, out, _ = run(["--shapes", shapes, "--db", run_db, "--trials", "3", "--guard", guard,
                        "--deadline-s", "12"], capsys, probe=lambda: H100)
    assert code == 1
    assert len(made) == 3  # the shape (at 0 s), then two calls timed (5 s, 10 s); none at 15 s
    assert "not timed (past --deadline-s):" in out
    with TuningDB(run_db, readonly=True) as db:
        assert [w["seqlen"] for w in db.winners("sm_90")] == [1024]  # no slowed call tuned past it
    tail = out.splitlines()[-1]
    assert tail.startswith("stopped by --deadline-s 12: ") and "moved calls not timed by the guard" in tail


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_a_deadline_must_be_positive(tmp_path, capsys, value):
    shapes = tmp_path / "s.yaml"
    shapes.write_text(THREE_SHAPES)
    code, _, err = run(["--shapes", shapes, "--arch", "sm_90", "--deadline-s", value], capsys, probe=lambda: H100)
    assert code == 2 and "--deadline-s: expected a positive number of seconds, got" in err, err


def test_a_checked_call_names_the_entry_that_serves_it_after():
    fam = "bwd.cf.bf16wbf16.w4"
    m = Move("sm_90", fam, "bias,silu", (2, 64, 1000), f"{fam}.t64.v16.n4.r1.g128.s2048",
             f"{fam}.t128.v16.n8.r4.g96.s512", after_shape="b1.d64.l512.bias.silu")
    text = Check(m, 10.0, 12.0).describe()
    assert text == (f"{fam} b2.d64.l1000.bias.silu: t64.v16.n4.r1.g128.s2048 10.0 µs -> t128.v16.n8.r4.g96.s512 "
                    "(the b1.d64.l512.bias.silu entry's) 12.0 µs SLOWED")
    assert "entry's" not in Check(Move("sm_90", fam, "bias,silu", (2, 64, 1000), None, m.after), None, 5.0).describe()
