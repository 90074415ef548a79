"""cc1d-tune's command line: --arch checks with an injected device probe,
--compile-only through the real runtime (NVRTC, sm_90), and the db subcommands."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cc1d.generator import default_variant, families
from cc1d.tuner.cli import main, resolve_arch, UsageError
from cc1d.tuner.db import TuningDB, default_db_path
from cc1d.tuner.device import DeviceInfo

H100 = DeviceInfo("sm_90", "NVIDIA H100 80GB HBM3")
SHAPES = "- {layout: cf, dtypes: bf16/f32, width: 4, batch: 1, dim: 64, seqlen: 256}\n"


@pytest.fixture
def shapes(tmp_path):
    p = tmp_path / "shapes.yaml"
    p.write_text(SHAPES)
    return p


def run(argv, capsys, probe=lambda: None):
    code = main([str(a) for a in argv], probe=probe)
    out = capsys.readouterr()
    return code, out.out, out.err


def _fake_gpu(monkeypatch, evaluator) -> None:
    """A tuning run without a GPU: each shape's evaluator from `evaluator(rt, shape, arch)`,
    a fixed copy bandwidth, no runtime."""
    from cc1d.tuner import cli, evaluate, measure
    monkeypatch.setattr(evaluate, "GpuEvaluator", evaluator)
    monkeypatch.setattr(measure, "copy_bandwidth", lambda: 3e12)
    monkeypatch.setattr(cli, "_runtime", lambda: None)


def _recorded_evaluators(monkeypatch) -> list:
    """_fake_gpu with a FakeEvaluator per shape, each kept (in order) in the list returned."""
    from cc1d.tuner.testing import FakeEvaluator
    made = []
    _fake_gpu(monkeypatch, lambda rt, shape, arch: made.append(FakeEvaluator()) or made[-1])
    return made


def test_arch_mismatch_says_what_is_present_and_what_to_do(shapes, capsys):
    code, _, err = run(["--arch", "gfx942", "--shapes", shapes], capsys, probe=lambda: H100)
    assert code == 2
    assert "--arch gfx942: the visible device is NVIDIA H100 80GB HBM3 (sm_90)" in err
    assert "run cc1d-tune on a gfx942 machine or --arch auto (= sm_90 here)" in err
    assert "add --compile-only" in err


def test_start_from_names_a_missing_db(shapes, tmp_path, capsys):
    code, _, err = run(["--arch", "sm_90", "--shapes", shapes, "--start-from", tmp_path / "none.db"], capsys,
                       probe=lambda: H100)
    assert code == 2 and "--start-from: expected tuning DB files" in err and "none.db" in err


def test_family_starts_is_checked(shapes, tmp_path, capsys):
    code, _, err = run(["--arch", "sm_90", "--shapes", shapes, "--family-starts", "3"], capsys, probe=lambda: H100)
    assert code == 2 and "--family-starts: needs --start-from" in err
    old = tmp_path / "old.db"
    TuningDB(old).close()
    code, _, err = run(["--arch", "sm_90", "--shapes", shapes, "--start-from", old, "--family-starts", "-1"], capsys,
                       probe=lambda: H100)
    assert code == 2 and "--family-starts: expected 0 or a positive number, got -1" in err


def test_width_and_dtype_starts_are_checked_and_try_a_kin_familys_winner(shapes, tmp_path, capsys, monkeypatch):
    """--width-starts and --dtype-starts need --start-from and a count; with them, the first
    trials of a bf16 width-3 shape (--width-starts) and of an fp16 width-4 shape
    (--dtype-starts) include the config a bf16 width-4 shape won in the start DB."""
    from cc1d.generator import Family, Variant, arch_info, variants
    for flag in ("--width-starts", "--dtype-starts"):
        code, _, err = run(["--arch", "sm_90", "--shapes", shapes, flag, "2"], capsys, probe=lambda: H100)
        assert code == 2 and f"{flag}: needs --start-from" in err
    old = tmp_path / "old.db"
    w4 = Family("fwd", "cf", "bf16", "bf16", 4)
    picked = [v for v in variants(w4, arch_info("sm_90"))][7]
    with TuningDB(old) as db:
        _store_winner(db, picked, picked.source, "b2.d256.l1000.bias.silu", 2, 256, 1000)
    for flag in ("--width-starts", "--dtype-starts"):
        code, _, err = run(["--arch", "sm_90", "--shapes", shapes, "--start-from", old, flag, "-1"], capsys,
                           probe=lambda: H100)
        assert code == 2 and f"{flag}: expected 0 or a positive number, got -1" in err
    made = _recorded_evaluators(monkeypatch)
    for run_no, (dtypes, width, flag, tried) in enumerate([("bf16", 3, [], False),
                                                           ("bf16", 3, ["--width-starts", "1"], True),
                                                           ("f16", 4, [], False),
                                                           ("f16", 4, ["--dtype-starts", "1"], True)]):
        path = tmp_path / f"s{run_no}.yaml"
        path.write_text(f"shapes:\n  - {{op: fwd, layout: cf, dtypes: {dtypes}, width: {width}, batch: 2, "
                        "dim: 256, seqlen: 1024}\n")
        wanted = Variant.of(Family("fwd", "cf", dtypes, dtypes, width), **picked.params).key()
        made.clear()
        code, _, _ = run(["--shapes", path, "--db", tmp_path / f"run{run_no}.db", "--trials", "3",
                          "--compile-workers", "1", "--start-from", old, *flag], capsys, probe=lambda: H100)
        assert code == 0 and (wanted in made[0].compiled[:3]) is tried, (dtypes, width, flag)


def test_fit_starts_is_checked_and_reaches_the_search(tmp_path, capsys, monkeypatch):
    """--fit-starts takes 0 or more; with it, the second trial of a shape whose default tiles
    a 3000 row fills poorly (2048 positions, 73 %) is the default with half its vectors
    (1024, 98 %), which a run without it does not try second."""
    from cc1d.generator import default_variant
    from cc1d.tuner.shapes import load_shapes
    path = tmp_path / "s.yaml"
    path.write_text("shapes:\n  - {op: fwd, layout: cf, dtypes: bf16/f32, batch: 2, dim: 256, seqlen: 3000}\n")
    code, _, err = run(["--arch", "sm_90", "--shapes", path, "--fit-starts", "-1"], capsys, probe=lambda: H100)
    assert code == 2 and "--fit-starts: expected 0 or a positive number, got -1" in err
    made = _recorded_evaluators(monkeypatch)
    halved = default_variant(load_shapes(path)[0].family(), nvec=2).key()
    for run_no, (flag, tried) in enumerate([([], False), (["--fit-starts", "1"], True)]):
        made.clear()
        code, _, _ = run(["--shapes", path, "--db", tmp_path / f"run{run_no}.db", "--trials", "2",
                          "--compile-workers", "1", *flag], capsys, probe=lambda: H100)
        assert code == 0 and (made[0].compiled[1] == halved) is tried, flag


def test_no_gpu_errors(shapes, capsys):
    code, _, err = run(["--arch", "sm_90", "--shapes", shapes], capsys)
    assert code == 2 and "--arch sm_90: no GPU is visible here" in err and "--compile-only" in err
    code, _, err = run(["--shapes", shapes], capsys)
    assert code == 2 and "--arch auto: no GPU is visible" in err


def test_argument_errors(shapes, tmp_path, capsys):
    assert "expected an NVIDIA target" in run(["--arch", "h100", "--shapes", shapes], capsys)[2]
    assert "--trials: expected a positive number" in run(["--trials", "0", "--shapes", shapes], capsys)[2]
    assert "--compile-workers: expected a positive number, got 0" in \
        run(["--compile-workers", "0", "--shapes", shapes], capsys)[2]
    assert "cannot read the shapes file" in run(["--shapes", tmp_path / "none.yaml"], capsys)[2]
    code, _, err = run(["--ops", "bwd", "--shapes", shapes, "--arch", "sm_90", "--compile-only"], capsys)
    assert code == 2 and "--ops bwd: no shape" in err
    with pytest.raises(SystemExit):
        main(["--workers", "2", "--storage", "x", "--shapes", str(shapes)])


def test_default_compile_workers_share_half_the_cpus(monkeypatch):
    from cc1d.tuner.cli import default_compile_workers
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert (default_compile_workers(1), default_compile_workers(2), default_compile_workers(8)) == (8, 4, 1)
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    assert default_compile_workers(1) == 8
    monkeypatch.setattr("os.cpu_count", lambda: None)
    assert default_compile_workers(1) == 1


def test_resolve_arch():
    assert resolve_arch("auto", H100, False) == "sm_90"
    assert resolve_arch("sm_90", H100, False) == "sm_90"
    assert resolve_arch("gfx942", None, True) == "gfx942"
    with pytest.raises(UsageError):
        resolve_arch("sm_80", H100, False)


def test_default_db_path(monkeypatch, tmp_path):
    monkeypatch.setenv("CC1D_CACHE_DIR", str(tmp_path))
    assert default_db_path() == tmp_path / "tuning.db"
    monkeypatch.delenv("CC1D_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_db_path() == tmp_path / "cc1d" / "tuning.db"


def test_compile_only_sm90_through_the_runtime(nvrtc_rt, shapes, tmp_path, capsys):
    report = tmp_path / "r.json"
    code, out, err = run(["--arch", "sm_90", "--compile-only", "--trials", "4", "--shapes", shapes,
                          "--report", report], capsys)
    assert code == 0, out + err
    assert "compiled 4 variants of 1 families for sm_90: 4 ok, 0 failed" in out
    assert json.loads(report.read_text())["failures"] == []


def test_compile_only_reports_failures(nvrtc_rt, shapes, capsys, monkeypatch):
    from cc1d.generator import Variant
    real = Variant.source.func
    monkeypatch.setattr(Variant, "source", property(lambda v: real(v) + "\n#error injected\n"))
    code, out, _ = run(["--arch", "sm_90", "--compile-only", "--trials", "2", "--shapes", shapes], capsys)
    assert code == 1 and out.count("FAILED fwd.cf.bf16wf32.w4.") == 2 and "2 failed" in out


def test_db_subcommands(tmp_path, capsys):
    v = default_variant(families("fwd", "cf")[0])
    a = tmp_path / "a.db"
    with TuningDB(a) as db:
        db.put_winner(v.source, arch="sm_90", family_key=v.family.key(), shape_key="b1.d64.l8.bias.silu",
                      op="fwd", batch=1, dim=64, seqlen=8, features="bias,silu", variant_key=v.key(),
                      config=v.params, **v.geometry(), time_us=3.5, copy_fraction=0.5, speedup=1.0,
                      environment={})
    code, out, _ = run(["db", "show", "--db", a], capsys)
    assert code == 0 and v.key() in out and "1 winners" in out
    exported = tmp_path / "a.jsonl"
    assert run(["db", "export", "--db", a, "-o", exported], capsys)[0] == 0
    b = tmp_path / "b.db"
    code, out, _ = run(["db", "import", "--db", b, exported], capsys)
    assert code == 0 and "imported 1 winners" in out
    code, out, _ = run(["db", "merge", "--db", tmp_path / "c.db", a, b], capsys)
    assert code == 0 and "merged 1 winners" in out
    code, out, _ = run(["db", "merge", "--db", tmp_path / "c.db", b], capsys)
    assert code == 0 and "merged 0 winners" in out          # same time: the one there stays
    code, out, _ = run(["db", "merge", "--replace", "--db", tmp_path / "c.db", b], capsys)
    assert code == 0 and "merged 1 winners" in out
    assert run(["db", "validate", "--db", b], capsys)[0] == 0
    with TuningDB(b) as db:
        db.conn.execute("UPDATE sources SET source = 'evil'")
    code, out, _ = run(["db", "validate", "--db", b], capsys)
    assert code == 1 and "INVALID" in out and "does not match its hash" in out
    code, _, err = run(["db", "show", "--db", tmp_path / "none.db"], capsys)
    assert code == 2 and "does not exist" in err


def _one_winner_db(path, arch="sm_90"):
    v = default_variant(families("fwd", "cf")[0])
    with TuningDB(path) as db:
        db.put_winner(v.source, arch=arch, family_key=v.family.key(), shape_key="b1.d64.l8.bias.silu",
                      op="fwd", batch=1, dim=64, seqlen=8, features="bias,silu", variant_key=v.key(),
                      config=v.params, **v.geometry(), time_us=3.5, environment={})
        db.add_trial(run_id="r", arch=arch, family_key=v.family.key(), shape_key="b1.d64.l8.bias.silu",
                     variant_key=v.key(), config=v.params, status="ok", time_us=3.5)
    return path


def test_db_finalize_for_shipping(tmp_path, capsys):
    import sqlite3
    path = _one_winner_db(tmp_path / "sm_90.db")
    code, out, err = run(["db", "finalize", "--db", path, "--drop-trials"], capsys)
    assert code == 0, out + err
    assert f"finalized {path}: 1 winners, journal_mode=delete" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sm_90.db"]
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert con.execute("SELECT count(*) FROM trials").fetchone()[0] == 0
    con.close()
    # the readers (show, export, validate) leave it as it is
    for cmd in (["show"], ["export", "-o", tmp_path / "x.jsonl"], ["validate"]):
        assert run(["db", *cmd, "--db", path], capsys)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sm_90.db", "x.jsonl"]


def test_db_finalize_says_when_it_keeps_trials(tmp_path, capsys):
    path = _one_winner_db(tmp_path / "sm_90.db")
    code, out, err = run(["db", "finalize", "--db", path], capsys)
    assert code == 0, out + err
    assert "kept 1 trials (for reports); to ship this DB, finalize it with --drop-trials" in out
    code, out, err = run(["db", "finalize", "--db", path, "--drop-trials"], capsys)
    assert code == 0 and "kept" not in out, out + err


def test_db_finalize_refuses_an_invalid_db(tmp_path, capsys):
    path = _one_winner_db(tmp_path / "bad.db")
    with TuningDB(path) as db:
        db.conn.execute("UPDATE sources SET source = 'evil'")
    code, out, _ = run(["db", "finalize", "--db", path], capsys)
    assert code == 1 and "INVALID" in out and "not finalized: 2 problems" in out
    code, _, err = run(["db", "finalize", "--db", tmp_path / "none.db"], capsys)
    assert code == 2 and "does not exist" in err


def test_db_validate_compile(nvrtc_rt, tmp_path, capsys):
    path = _one_winner_db(tmp_path / "t.db")
    code, out, err = run(["db", "validate", "--compile", "--db", path], capsys)
    assert code == 0 and "1 winners checked in" in out and "(and compiled): 0 problems" in out, out + err
    path = _one_winner_db(tmp_path / "bad_arch.db", arch="sm_9")  # no such GPU: NVRTC refuses it
    code, out, _ = run(["db", "validate", "--compile", "--db", path], capsys)
    assert code == 1 and "does not compile for sm_9" in out, out


def test_python_dash_m_entry_point():
    proc = subprocess.run([sys.executable, "-P", "-m", "cc1d.tuner", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "--compile-only" in proc.stdout


def test_compile_only_backward_shapes(nvrtc_rt, tmp_path, capsys):
    shapes = tmp_path / "bwd.yaml"
    shapes.write_text("shapes:\n  - {op: bwd, layout: cl, dtypes: bf16, width: 4, batch: 2, dim: 256, "
                      "seqlen: 1000}\n")
    code, out, err = run(["--arch", "sm_90", "--compile-only", "--trials", "2", "--shapes", shapes], capsys)
    assert code == 0, out + err
    assert "compiled 2 variants of 1 families for sm_90: 2 ok, 0 failed" in out


def test_compile_only_varlen_shapes(nvrtc_rt, tmp_path, capsys):
    shapes = tmp_path / "vfwd.yaml"
    shapes.write_text("shapes:\n  - {op: vfwd, layout: [cf, cl], dtypes: bf16, width: 4, batch: 8, dim: 256, "
                      "seqlen: 3000, initial_states: true, final_states: true}\n")
    code, out, err = run(["--arch", "sm_90", "--compile-only", "--trials", "2", "--shapes", shapes], capsys)
    assert code == 0, out + err
    assert "compiled 4 variants of 2 families for sm_90: 4 ok, 0 failed" in out


def test_varlen_shapes_are_checked(tmp_path):
    from cc1d.tuner.shapes import ShapesError, parse_shapes
    with pytest.raises(ShapesError, match="op vfwd: seq_idx is not a feature of the varlen prefill"):
        parse_shapes([{"op": "vfwd", "batch": 2, "dim": 8, "seqlen": 9, "seq_idx": True}])
    with pytest.raises(ShapesError, match="op vfwd: initial_states needs final_states"):
        parse_shapes([{"op": "vfwd", "batch": 2, "dim": 8, "seqlen": 9, "initial_states": True}])


def test_varlen_lengths_pack_the_tokens():
    from cc1d.tuner.problems import varlen_lengths
    for n, total in ((1, 5), (8, 16384), (64, 65536), (9, 9)):
        lens = varlen_lengths(n, total)
        assert len(lens) == n and sum(lens) == total and min(lens) >= 0
        assert lens == varlen_lengths(n, total)  # a function of the shape


def _report_of_a_run(shapes, tmp_path):
    """A tuner run (fake evaluator) over `shapes` into run.db, and its --report JSON."""
    from cc1d.tuner.report import write_report
    from cc1d.tuner.search import SearchConfig, tune_shape
    from cc1d.tuner.shapes import load_shapes
    from cc1d.tuner.testing import FakeEvaluator
    with TuningDB(tmp_path / "run.db") as db:
        results = [tune_shape(s, "sm_90", FakeEvaluator(), db, SearchConfig(trials=4), environment={"device": "x"})
                   for s in load_shapes(shapes)]
        stored = db.winners()
    write_report(tmp_path / "r.json", results, arch="sm_90", environment={"device": "x"})
    return tmp_path / "r.json", stored


def test_import_report_stores_the_runs_winners_with_their_sources(shapes, tmp_path, capsys):
    report, stored = _report_of_a_run(shapes, tmp_path)
    code, out, _ = run(["db", "import-report", report, "--shapes", shapes, "--db", tmp_path / "new.db"], capsys)
    assert code == 0 and "stored 1 winners" in out
    with TuningDB(tmp_path / "new.db", readonly=True) as db:
        (got,), (want,) = db.winners(), stored
        for k in ("variant_key", "config", "source_hash", "time_us", "default_us", "spread", "features", "batch"):
            assert got[k] == want[k], k
        assert db.source(got["source_hash"]) is not None and db.validate() == []


@pytest.mark.parametrize("tamper, words", [
    (lambda e: e.update(source_hash="0" * 64), "the templates changed since the run"),
    (lambda e: e.pop("source_hash"), "cannot be checked"),
    (lambda e: e.update(epoch=-1), "generator epoch -1"),
    (lambda e: e.update(shape="b9.d9.l9.bias.silu"), "not a shape of the given shapes file"),
    (lambda e: e["config"].update(no_such_param=1), "is not in the space"),
    (lambda e: e["config"].update(threads=7), "is not valid for sm_90"),
    (lambda e: e.update(winner="fwd.cf.other"), "its winner is fwd.cf.other"),
])
def test_import_report_refuses_what_it_cannot_check_and_writes_nothing(shapes, tmp_path, capsys, tamper, words):
    report, _ = _report_of_a_run(shapes, tmp_path)
    data = json.loads(report.read_text())
    tamper(data["results"][0])
    report.write_text(json.dumps(data))
    code, _, err = run(["db", "import-report", report, "--shapes", shapes, "--db", tmp_path / "new.db"], capsys)
    assert code == 2 and words in err and "result 0" in err, err
    assert not (tmp_path / "new.db").exists()


def test_a_stopped_run_keeps_the_report_of_the_shapes_it_finished(tmp_path, capsys, monkeypatch):
    """--report is rewritten after every shape: a run stopped during its second shape
    leaves a whole report of the first (complete: false) that import-report can store;
    a run to the end says complete: true."""
    from cc1d.tuner.testing import FakeEvaluator
    shapes = tmp_path / "two.yaml"
    shapes.write_text(SHAPES + SHAPES.replace("layout: cf", "layout: cl"))
    made = []

    def evaluator(rt, shape, arch):
        made.append(shape)
        if len(made) == 2 and stop:
            raise KeyboardInterrupt  # stands for Ctrl-C or a kill during the second shape
        return FakeEvaluator()

    _fake_gpu(monkeypatch, evaluator)
    report = tmp_path / "r.json"
    argv = ["--shapes", shapes, "--db", tmp_path / "run.db", "--trials", "3", "--report", report]
    stop = True
    code, _, err = run(argv, capsys, probe=lambda: H100)
    assert code == 130 and "interrupted" in err
    data = json.loads(report.read_text())
    assert (data["complete"], data["shapes"], len(data["results"])) == (False, 2, 1)
    assert data["results"][0]["winner"].startswith("fwd.cf.") and not (tmp_path / "r.json.tmp").exists()
    code, out, _ = run(["db", "import-report", report, "--shapes", shapes, "--db", tmp_path / "new.db"], capsys)
    assert code == 0 and "stored 1 winners" in out

    stop, made[:] = False, []
    code, _, _ = run(argv + ["--db", tmp_path / "run2.db"], capsys, probe=lambda: H100)
    data = json.loads(report.read_text())
    assert code == 0 and (data["complete"], data["shapes"], len(data["results"])) == (True, 2, 2)


def _store_winner(db, v, source, shape_key, batch, dim, seqlen, features="bias,silu"):
    """Store variant v with this source as the winner of its family at a shape (3.5 µs)."""
    db.put_winner(source, arch="sm_90", family_key=v.family.key(), shape_key=shape_key, op=v.family.op,
                  batch=batch, dim=dim, seqlen=seqlen, features=features, variant_key=v.key(), config=v.params,
                  **v.geometry(), time_us=3.5, environment={})


def _behind(macro):
    """Source text that only a build defining `macro` compiles: an extra kernel."""
    return f'\n#ifdef {macro}\nextern "C" __global__ void cc1d_extra() {{}}\n#endif\n'


def test_db_rerender_keeps_winners_whose_kernel_is_unchanged(nvrtc_rt, tmp_path, capsys):
    """A winner stored with a source that differs from today's render only in a comment gets
    the render (same config, time and date); one whose kernel differs is left and named;
    validate then finds only that one."""
    fams = families("fwd", "cf")
    same, other = default_variant(fams[0]), default_variant(fams[1])
    path = tmp_path / "r.db"
    with TuningDB(path) as db:
        for v, source in ((same, same.source + "\n// a comment the compiler drops\n"),
                          (other, other.source + '\nextern "C" __global__ void cc1d_extra() {}\n')):
            _store_winner(db, v, source, "b1.d64.l8.bias.silu", 1, 64, 8)
        before = {w["family_key"]: w for w in db.winners()}
    code, out, _ = run(["db", "rerender", "--db", path], capsys)
    assert code == 1 and "1 winners re-rendered" in out and "1 left" in out
    assert f"LEFT sm_90 {other.family.key()}" in out and "its kernel (plain build) changed" in out
    with TuningDB(path, readonly=True) as db:
        after = {w["family_key"]: w for w in db.winners()}
        problems = db.validate()
    assert after[same.family.key()]["source_hash"] == same.hash()
    for k in ("time_us", "created_at", "config", "variant_key"):
        assert after[same.family.key()][k] == before[same.family.key()][k], k
    assert after[other.family.key()] == before[other.family.key()]
    assert len(problems) == 1 and other.family.key() in problems[0]
    code, out, _ = run(["db", "rerender", "--db", path, "--ops", "bwd"], capsys)
    assert code == 0 and "0 winners re-rendered" in out and "0 left" in out
    with TuningDB(path) as db:
        db.conn.execute("UPDATE winners SET config = ? WHERE family_key = ?",
                        (json.dumps({"no_such_param": 1}), same.family.key()))
    code, out, _ = run(["db", "rerender", "--db", path], capsys)
    assert code == 1 and "config does not fit the generator's space" in out and "2 left" in out


def test_db_rerender_compares_the_seq_idx_build_of_shapes_with_seq_idx(nvrtc_rt, tmp_path, capsys):
    """A backward winner's time for a shape with seq_idx is its seq_idx build's: a template
    change that only that build sees (code behind CC1D_BWD_SEQ_TILES) leaves such a winner
    for a re-tune, and re-renders the same variant stored for a shape without seq_idx."""
    v = default_variant(families("bwd", "cf")[0])
    seq_only = v.source + _behind("CC1D_BWD_SEQ_TILES")
    path = tmp_path / "r.db"
    with TuningDB(path) as db:
        for shape_key, features in (("b1.d64.l8.bias.silu", "bias,silu"),
                                    ("b1.d64.l8.bias.silu.seqidx", "bias,silu,seqidx")):
            _store_winner(db, v, seq_only, shape_key, 1, 64, 8, features)
    code, out, _ = run(["db", "rerender", "--db", path], capsys)
    assert code == 1 and "1 winners re-rendered" in out and "1 left" in out, out
    assert f"re-rendered sm_90 {v.family.key()} b1.d64.l8.bias.silu (" in out
    assert f"LEFT sm_90 {v.family.key()} b1.d64.l8.bias.silu.seqidx" in out
    assert "(seq_idx build) changed" in out
    with TuningDB(path, readonly=True) as db:
        hashes = {w["shape_key"]: w["source_hash"] for w in db.winners()}
    assert hashes["b1.d64.l8.bias.silu"] == v.hash() and hashes["b1.d64.l8.bias.silu.seqidx"] != v.hash()


@pytest.mark.parametrize("op,macro", [("fwd", "CC1D_FWD_FIXED"), ("bwd", "CC1D_BWD_FIXED")])
def test_db_rerender_compares_the_fixed_kernel_a_winner_was_timed_with(nvrtc_rt, tmp_path, capsys, op, macro):
    """Channel-last forward and backward plans launch a fixed kernel (the source compiled
    with the call's sizes and strides as constants), and the tuner timed that: a change
    behind CC1D_FWD_FIXED / CC1D_BWD_FIXED leaves such a winner for a re-tune, and
    re-renders a channel-first width-4 winner, whose plans run the generic kernel."""
    cf, cl = (default_variant(next(f for f in families(op, lay) if f.width == 4)) for lay in ("cf", "cl"))
    path = tmp_path / "r.db"
    with TuningDB(path) as db:
        for v in (cf, cl):
            _store_winner(db, v, v.source + _behind(macro), "b2.d64.l40.bias.silu", 2, 64, 40)
    code, out, _ = run(["db", "rerender", "--db", path], capsys)
    assert code == 1 and "1 winners re-rendered" in out and "1 left" in out, out
    assert f"re-rendered sm_90 {cf.family.key()} " in out
    assert f"LEFT sm_90 {cl.family.key()} b2.d64.l40.bias.silu ({cl.key()}): its kernel (fixed build) changed" in out
    with TuningDB(path, readonly=True) as db:
        hashes = {w["family_key"]: w["source_hash"] for w in db.winners()}
    assert hashes[cf.family.key()] == cf.hash() and hashes[cl.family.key()] != cl.hash()


def test_db_rerender_compares_the_fixed_kernel_an_update_winner_was_timed_with(nvrtc_rt, tmp_path, capsys):
    """Update plans always launch a fixed kernel: a change behind CC1D_UPD_FIXED alone
    leaves an update winner for a re-tune."""
    v = default_variant(next(f for f in families("upd", "cl") if f.width == 4))
    path = tmp_path / "r.db"
    with TuningDB(path) as db:
        _store_winner(db, v, v.source + _behind("CC1D_UPD_FIXED"), "b5.d1000.l1.bias.silu", 5, 1000, 1)
    code, out, _ = run(["db", "rerender", "--db", path], capsys)
    assert code == 1 and "0 winners re-rendered" in out and "1 left" in out, out
    assert f"LEFT sm_90 {v.family.key()} b5.d1000.l1.bias.silu ({v.key()}): its kernel (fixed build) changed" in out


def test_a_closed_output_pipe_is_one_line_not_a_traceback(tmp_path):
    """`cc1d-tune db show ... | head -1`: the reader leaves before the listing ends."""
    from pathlib import Path
    db = Path(__file__).resolve().parent.parent / "tuning_db" / "sm_90.db"
    p = subprocess.Popen([sys.executable, "-P", "-m", "cc1d.tuner", "db", "show", "--db", str(db)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    p.stdout.close()  # before the child writes a line
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 1
    assert "Traceback" not in err and "output closed before the end" in err, err


def test_a_run_names_the_shapes_its_budget_left_unsearched(tmp_path, capsys, monkeypatch):
    """The final table counts each shape's timed candidates, and a shape whose --budget-s
    ended after one of them is named in a warning after it (its winner is the start config
    or the default, not a search's); a run whose budget let several be timed warns of none."""
    from cc1d.tuner.testing import FakeEvaluator
    path = tmp_path / "s.yaml"
    path.write_text("shapes:\n  - {op: fwd, layout: cf, dtypes: bf16/f32, batch: 2, dim: 256, seqlen: 3000}\n")
    for run_no, (sleep_s, budget, named) in enumerate([(0.2, "0.05", True), (0.02, "0.3", False)]):
        _fake_gpu(monkeypatch, lambda rt, shape, arch, s=sleep_s: FakeEvaluator(sleep_s=s))
        code, out, _ = run(["--shapes", path, "--db", tmp_path / f"run{run_no}.db", "--trials", "200",
                            "--budget-s", budget, "--compile-workers", "1"], capsys, probe=lambda: H100)
        header, row = out.splitlines()[:2]
        assert code == 0 and header.split()[-1] == "timed"
        assert row.endswith(" 1 (budget)") is named and "(budget)" in row
        assert ("1 shape not searched: --budget-s ended the search after one candidate timed" in out) is named
        assert ("fwd.cf.bf16wf32.w4 (2, 256, 3000)" in out) is named
