"""benchmarks/bench_vs_peer.py: its options are checked before a GPU is touched; --list names
each chosen family's grid calls with the variant the DB serves them; the calls it times are
spread over each family and reach every family; the calls behind the peer are counted and
written as a shapes file; on a GPU with the peer (`gpu`), calls are timed against it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cc1d.tuner.db import TuningDB
from cc1d.tuner.moves import Move, snapshot
from cc1d.tuner.serving import serve_from
from conftest import benchmark_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_vs_peer.py"
SHIPPED = REPO / "tuning_db" / "sm_90.db"
sweep = benchmark_script("bench_vs_peer")


def _run(*argv, env=None, cwd=None):
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=300,
                          env=env, cwd=cwd)


@pytest.mark.parametrize("argv, message", [
    (["--db", "/nonexistent/a.db"], "--db: no such file '/nonexistent/a.db'"),
    (["--families", ","], "--families expects family-key prefixes separated by commas, got ''"),
    (["--batches", "1,0"], "--batches expects positive integers separated by commas, got '1,0'"),
    (["--lengths", "x"], "--lengths expects positive integers separated by commas, got 'x'"),
    (["--max-calls", "0"], "--max-calls expects a positive integer, got 0"),
    (["--deadline-s", "-5"], "--deadline-s expects a positive number of seconds, got -5"),
])
def test_bad_options_are_refused_before_the_gpu(argv, message):
    res = _run(*argv)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr


def test_a_family_prefix_that_names_nothing_is_refused_with_the_dbs_families():
    res = _run("--families", "bwd.cf.f32,fwd.xx", "--list")
    assert res.returncode == 2 and res.stdout == ""
    assert "--families: no forward or backward family of" in res.stderr and "starts with 'fwd.xx'" in res.stderr
    assert "(its families start with bwd.cf, bwd.cl, fwd.cf, fwd.cl)" in res.stderr


def test_shapes_out_must_be_a_new_file_and_not_with_list(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("shapes: []\n")
    res = _run("--shapes-out", str(old))
    assert res.returncode == 2 and "(exists)" in res.stderr and old.read_text() == "shapes: []\n"
    res = _run("--shapes-out", str(tmp_path / "no" / "s.yaml"))
    assert res.returncode == 2 and "(is in no folder)" in res.stderr
    res = _run("--shapes-out", str(tmp_path / "s.yaml"), "--list")
    assert res.returncode == 2 and "not with --list" in res.stderr


def test_a_set_tuning_db_variable_is_refused(tmp_path):
    res = _run("--list", env=dict(os.environ, CC1D_TUNING_DB=str(tmp_path / "mine.db")))
    assert res.returncode == 2 and "CC1D_TUNING_DB is set" in res.stderr


def test_an_unreadable_db_ends_with_its_message_not_a_traceback(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite")
    res = _run("--db", str(junk), "--list")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith(f"bench_vs_peer.py: tuning DB {junk}"), res.stderr


def _shipped_rows() -> dict:
    with TuningDB(SHIPPED, readonly=True) as db:
        return snapshot(db)


def test_the_grid_holds_every_call_with_the_variant_the_db_serves_it():
    calls = sweep.grid(_shipped_rows(), ["bwd.cf.f32wf32"], [1, 16], [128, 3000])
    rows = _shipped_rows()[("sm_90", "bwd.cf.f32wf32.w4")]
    dims = sorted({r["dim"] for r in rows})
    feats = sorted({r["features"] for r in rows})
    assert len(calls) == len(feats) * 2 * len(dims) * 2 and len(set(calls)) == len(calls)
    assert {c.family_key for c in calls} == {"bwd.cf.f32wf32.w4"}
    for c in calls:
        served = serve_from(rows, "sm_90", c.shape)
        assert c.before == c.after == served["variant_key"]
        assert c.after_shape == served["shape_key"] and c.entry == (served["shape_key"] == c.shape.key())
    assert any(c.entry for c in calls) and not all(c.entry for c in calls)  # (16, 5120, 128) is tuned


def test_list_prints_each_call_and_why_the_rest_are_not_timed():
    res = _run("--families", "fwd.cf.bf16wbf16.w8,fwd.cf.f32", "--batches", "2", "--lengths", "1000",
               "--max-calls", "1", "--list")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].endswith("; 1 would be timed")
    body = lines[1:]
    assert int(lines[0].split()[0]) == len(body) > 2
    assert sum("not timed" not in ln for ln in body) == 1
    assert all("(not timed: width 8: the peer takes widths 2-4)" in ln for ln in body if ".w8 " in ln)
    assert sum("(not timed: past --max-calls 1)" in ln for ln in body) == len(body) - 1 - \
        sum(".w8 " in ln for ln in body)


def _call(family, call, features="bias,silu"):
    return Move("sm_90", family, features, call, f"{family}.tA", f"{family}.tA")


def test_the_peer_makes_widths_2_to_4_and_backward_calls_without_states():
    assert sweep.why_no_peer(_call("fwd.cl.bf16wbf16.w4", (1, 64, 128), "bias,silu,init,final")) is None
    assert sweep.why_no_peer(_call("bwd.cf.f32wf32.w2", (1, 64, 128))) is None
    assert "width 5" in sweep.why_no_peer(_call("fwd.cf.bf16wbf16.w5", (1, 64, 128)))
    assert "with states" in sweep.why_no_peer(_call("bwd.cl.bf16wbf16.w4", (1, 64, 128), "silu,init"))


def test_the_timed_calls_reach_every_family_and_spread_over_its_grid():
    calls = sweep.grid(_shipped_rows(), ["bwd"], [1, 2, 4, 8, 16], [128, 512, 1000, 2048, 3000, 4096, 8192, 16384])
    families = {c.family_key for c in calls}
    timed, rest = sweep.plan(calls, 4 * len(families))
    assert len(timed) == 4 * len(families) and len(rest) == len(calls) - len(timed)
    assert {c.family_key for c in timed} == families
    assert len({c.call[0] for c in timed}) > 1 and len({c.call[2] for c in timed}) > 3  # not the grid's first
    assert sweep.plan(calls, 24)[0] == sweep.plan(calls, 24)[0] != sweep.plan(calls, 24, seed=1)[0]


def _row(call, ours, peer, family="bwd.cf.f32wf32.w4"):
    r = dict(family=family, features="bias,silu", call=call, variant=f"{family}.t128.v16.n4.r1.g128.s2048",
             served_by="b2.d5120.l3000.bias.silu", entry=False, copy_frac=0.9)
    if ours is None:
        r["cc1d_error"] = "launch failed"
    else:
        r["cc1d_us"] = ours
    if peer is None:
        r["peer_error"] = "the peer refused it"
    else:
        r["peer_us"] = peer
    r["vs_peer"] = sweep.ratio(peer, ours)
    return r


def test_behind_means_slower_than_the_peer_by_more_than_3_percent_or_failing_where_it_ran():
    rows = [_row([1, 64, 128], 10.2, 10.0), _row([2, 64, 128], 10.4, 10.0), _row([4, 64, 128], None, 10.0),
            _row([8, 64, 128], None, None), _row([16, 64, 128], 7.0, 10.0)]
    assert [r["call"][0] for r in sweep.behind_rows(dict(rows=rows))] == [2, 4]


def test_the_table_puts_the_calls_most_behind_first_and_counts_them(capsys):
    doc = dict(device="GPU A", copy_gbps=4000.0, peer_version="1.7.0", db="a.db",
               rows=[_row([1, 64, 128], 8.0, 10.0), _row([2, 64, 3000], 12.0, 10.0),
                     _row([2, 64, 512], 12.0, 10.0, family="bwd.cl.f16wf16.w4")],
               not_timed=[dict(family="fwd.cf.bf16wbf16.w8", features="", call=[1, 64, 128], reason="width 8")])
    sweep.print_table(doc)
    out = capsys.readouterr().out.splitlines()
    body = [ln for ln in out if ln.startswith("| bwd") and "x |" in ln and "s2048" in ln]
    assert body[0].startswith("| bwd.cf.f32wf32.w4 | bias,silu | (2, 64, 3000) | t128.v16.n4.r1.g128.s2048 | 12.0 |")
    assert body[-1].endswith("| 8.0 | 90 % | 10.0 | 1.25x |")
    summary = [ln for ln in out if ln.startswith("| bwd") and ln.count("|") == 5]
    assert summary == ["| bwd.cl.f16wf16.w4 | 1 | 1 | 0.83x |", "| bwd.cf.f32wf32.w4 | 2 | 1 | 1.02x |"]
    assert out[-1] == "3 calls timed, 2 behind the peer (by more than 3 %, or failing where it ran); 1 not timed"


def test_the_calls_behind_are_written_as_a_shapes_file_to_tune(tmp_path):
    from cc1d.tuner.shapes import load_shapes
    doc = dict(arch="sm_90", device="GPU A", db="a.db", peer_version="1.7.0",
               rows=[_row([2, 5120, 3000], 12.0, 10.0), _row([16, 2048, 128], 9.0, 10.0),
                     _row([1, 2048, 512], None, 4.0, family="fwd.cl.f16wf16.w3")])
    path = tmp_path / "behind.yaml"
    assert sweep.write_behind(path, doc) == 2
    assert path.read_text().startswith("# calls behind causal-conv1d 1.7.0 through a.db on GPU A")
    shapes = load_shapes(path)
    assert [(s.family().key(), s.batch, s.dim, s.seqlen) for s in shapes] == \
        [("bwd.cf.f32wf32.w4", 2, 5120, 3000), ("fwd.cl.f16wf16.w3", 1, 2048, 512)]
    assert (shapes[0].bias, shapes[0].activation) == (True, "silu")
    none = tmp_path / "none.yaml"
    assert sweep.write_behind(none, dict(doc, rows=doc["rows"][1:2])) == 0 and not none.exists()


@pytest.mark.gpu
def test_calls_are_timed_against_the_peer_and_those_behind_written_to_tune(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    pytest.importorskip("causal_conv1d")
    out, shapes = tmp_path / "p.json", tmp_path / "behind.yaml"
    res = _run("--families", "bwd.cf.f32wf32,fwd.cl.bf16wbf16.w4", "--batches", "2", "--lengths", "1000,3000",
               "--max-calls", "2", "--out", str(out), "--shapes-out", str(shapes), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == 2 and {r["family"].split(".")[0] for r in doc["rows"]} == {"bwd", "fwd"}
    for row in doc["rows"]:
        assert row["cc1d_us"] > 0 and row["peer_us"] > 0, row
        assert row["vs_peer"] == pytest.approx(row["peer_us"] / row["cc1d_us"])
        assert 0 < row["copy_frac"] < 1.5
        assert row["labels_hold"] is True, row  # the runtime ran the kernel the row names
    behind = sweep.behind_rows(doc)
    assert shapes.exists() == bool(behind)
    if behind:
        from cc1d.tuner.shapes import load_shapes
        assert len(load_shapes(shapes)) == len(behind)
