"""benchmarks/bench_rule.py: its options are checked before a GPU is touched; --list names
the grid calls a candidate serving rule moves (tuner/moves.py rule_moves); the sample takes
every family in turn; the calls are timed under both rules' winners (the tuner's fake
evaluator here) and summed up per family."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from cc1d.tuner.db import TuningDB
from cc1d.tuner.moves import rule_moves, snapshot
from cc1d.tuner.serving import dispatch_rank, serve_from
from conftest import benchmark_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_rule.py"
SHIPPED = REPO / "tuning_db" / "sm_90.db"
rule_script = benchmark_script("bench_rule")
RULE = "weighted-1/2/0.5"


def _run(*argv):
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: --rule"),
    (["--rule", "nearest"], "--rule: expected one of product, seqlen-apart, weighted-1/2/0.5, weighted-0.5/4/0, got 'nearest'"),
    (["--rule", "current"], "--rule: expected one of product, seqlen-apart, weighted-1/2/0.5, weighted-0.5/4/0, got 'current'"),
    (["--rule", RULE, "--db", "/nonexistent/x.db"], "--db: no such file '/nonexistent/x.db'"),
    (["--rule", RULE, "--max-calls", "0"], "--max-calls expects a positive integer, got 0"),
    (["--rule", RULE, "--ops", "upd"], "--ops: expected a comma-separated list of fwd, bwd, got 'upd'"),
    (["--rule", RULE, "--ops", "bwd,"], "--ops: expected a comma-separated list of fwd, bwd, got 'bwd,'"),
])
def test_bad_options_are_refused_before_the_gpu(argv, message):
    res = _run(*argv)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr


@pytest.fixture(scope="module")
def shipped():
    with TuningDB(SHIPPED, readonly=True) as db:
        return snapshot(db)


def test_rule_moves_are_the_calls_the_two_rules_serve_apart(shipped):
    assert rule_moves(shipped, dispatch_rank, dispatch_rank) == []  # a rule against itself moves nothing
    moves = rule_moves(shipped, dispatch_rank, rule_script.RULES[RULE])
    assert len({m.family_key for m in moves}) > 3
    for m in moves[::25]:
        rows = shipped[(m.arch, m.family_key)]
        shape = m.shape
        assert shape.key() not in {r["shape_key"] for r in rows}  # tuned shapes serve themselves
        assert serve_from(rows, m.arch, shape)["variant_key"] == m.before
        assert serve_from(rows, m.arch, shape, rule_script.RULES[RULE])["variant_key"] == m.after != m.before


def test_list_counts_the_moves_per_family(shipped):
    res = _run("--rule", RULE, "--list")
    assert res.returncode == 0, res.stderr
    moves = rule_moves(shipped, dispatch_rank, rule_script.RULES[RULE])
    families = sorted({m.family_key for m in moves})
    lines = res.stdout.splitlines()
    assert lines[0] == f"{len(moves)} grid calls served another winner under {RULE}, in {len(families)} families"
    assert lines[1:1 + len(families)] == [f"  {f}: {sum(m.family_key == f for m in moves)}" for f in families]
    assert len(lines) == 1 + len(families) + len(moves)


def test_list_with_ops_keeps_that_ops_calls():
    rule = "weighted-0.5/4/0"  # moves calls of both ops (weighted-1/2/0.5 is the backward's own)
    both, bwd = _run("--rule", rule, "--list"), _run("--rule", rule, "--list", "--ops", "bwd")
    assert both.returncode == bwd.returncode == 0, both.stderr + bwd.stderr
    calls = [ln for ln in bwd.stdout.splitlines() if ln.startswith("sm_90 ")]
    assert calls and all(ln.startswith("sm_90 bwd.") for ln in calls)
    assert calls == [ln for ln in both.stdout.splitlines() if ln.startswith("sm_90 bwd.")]


def test_a_reader_leaving_early_ends_the_listing_without_a_traceback():
    """`bench_rule.py --list | head` (and bench_moves', cross_serve's: benchmarks/script_exit.py)."""
    # a listing longer than a pipe's buffer (64 KiB), so that the script is still writing when the reader leaves
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--rule", "weighted-0.5/4/0", "--list"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader leaves with most of the listing unread
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1 and "grid calls served another winner" in first
    assert err.strip() == "bench_rule.py: output closed before the end (a pipe's reader left)", err


def test_an_unreadable_db_ends_with_its_message_not_a_traceback(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite")
    res = _run("--rule", "product", "--db", str(junk), "--list")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith(f"bench_rule.py: tuning DB {junk} is not a readable SQLite DB"), res.stderr


def test_the_summary_counts_per_family_and_overall():
    def row(family, cur, cand):
        return dict(family=family, current_us=cur, candidate_us=cand)
    rows = [row("f1", 10.0, 8.0), row("f1", 10.0, 12.5), row("f1", 10.0, 10.1), row("f2", 10.0, None)]
    got = {s["family"]: s for s in rule_script.summary(rows)}
    f1 = got["f1"]
    assert (f1["calls"], f1["faster"], f1["slower"], f1["failed"]) == (3, 1, 1, 0)
    assert f1["geomean"] == pytest.approx((1.25 * 0.8 * 10 / 10.1) ** (1 / 3))
    assert (got["f2"]["failed"], math.isnan(got["f2"]["geomean"])) == (1, True)
    assert got["all"]["calls"] == 4 and got["all"]["geomean"] == pytest.approx(f1["geomean"])


def test_the_moved_calls_are_timed_under_both_rules_winners(tmp_path, monkeypatch, capsys, shipped):
    """The whole GPU path with the tuner's fake evaluator: each variant takes a time of its
    own, the same at every call, so each row's two times say which variants were timed."""
    from cc1d import _runtime
    from cc1d.tuner import device, evaluate
    from cc1d.tuner.testing import FakeEvaluator
    keys = sorted({r["variant_key"] for rows in shipped.values() for r in rows})
    fake_us = {k: 5.0 + i for i, k in enumerate(keys)}
    made = []

    def gpu_evaluator(rt, shape, arch):
        made.append(shape.key())
        return FakeEvaluator(times=lambda v: fake_us[v.key()])
    monkeypatch.setattr(device, "probe_device", lambda: device.DeviceInfo("sm_90", "NVIDIA H100 80GB HBM3"))
    monkeypatch.setattr(_runtime, "runtime", lambda: None)
    monkeypatch.setattr(evaluate, "GpuEvaluator", gpu_evaluator)
    out = tmp_path / "r.json"
    assert rule_script.main(["--rule", RULE, "--db", str(SHIPPED), "--max-calls", "7", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == len(made) == 7 and doc["moved"] > 7
    for row in doc["rows"]:
        assert (row["current_us"], row["candidate_us"]) == pytest.approx(
            (fake_us[row["current"]], fake_us[row["candidate"]]))
    assert len({r["family"] for r in doc["rows"]}) == 7  # one call of each of seven families first
    printed = capsys.readouterr().out
    assert f"rule {RULE}: {doc['moved']} grid calls move, 7 timed" in printed
    assert "| all | 7 |" in printed
