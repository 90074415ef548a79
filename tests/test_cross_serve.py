"""benchmarks/cross_serve.py and serving_rules.py: its options are checked before a GPU is
touched; `pick` under the current rule is the dispatcher's choice (tuner/serving.py served_winner, which
test_shipped_db.py holds to the runtime's); `score` computes each rule's regret from a
matrix, and counts the calls where the picked variant failed to run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cc1d.tuner.db import TuningDB, family_from_key
from cc1d.tuner.serving import served_winner
from conftest import benchmark_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "cross_serve.py"
cross = benchmark_script("cross_serve")
import serving_rules as rules  # noqa: E402  (its sibling: benchmark_script put benchmarks/ on sys.path)

FAMILY = "bwd.cf.bf16wbf16.w4"


@pytest.mark.parametrize("argv, message", [
    (["--lengths", "2048,0"], "--lengths expects positive integers separated by commas, got '2048,0'"),
    (["--batches", "two"], "--batches expects positive integers separated by commas, got 'two'"),
    (["--family", "bwd.cf.bf16"], "--family: not a family key"),
    (["--family", "upd.cl.bf16wbf16.w4"], "--family: forward and backward families are timed, got op 'upd'"),
    (["--features", "bias,seqidx"], "--features expects some of bias, silu separated by commas, got ['seqidx']"),
    (["--db", "/nonexistent/x.db"], "--db: no such file '/nonexistent/x.db'"),
    (["--score", "/nonexistent/m.json"], "--score: no such file '/nonexistent/m.json'"),
    (["--weights", "/nonexistent/m.json"], "--weights: no such file '/nonexistent/m.json'"),
    (["--weights", __file__, "--top", "0"], "--top expects a positive integer, got 0"),
    (["--weights", __file__, "--score", __file__], "--score and --weights: one at a time"),
])
def test_bad_options_are_refused_before_the_gpu(argv, message):
    res = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr


def _shipped_rows(features="bias,silu") -> list[dict]:
    with TuningDB(REPO / "tuning_db" / "sm_90.db", readonly=True) as db:
        return [{c: r[c] for c in cross.ROW_COLUMNS} for r in db.winners("sm_90")
                if r["family_key"] == FAMILY and r["features"] == features]


CALLS = [(b, d, n) for b in (1, 3, 16) for d in (1024, 4096, 5120) for n in (300, 1000, 2047, 2048, 3000, 6000)]


def test_pick_under_the_current_rule_is_the_dispatchers_choice():
    """Both are serving.serve_from; what can differ is the rows: the matrix keeps only
    ROW_COLUMNS of each winner, which must be all the dispatcher's rule reads."""
    rows = _shipped_rows()
    family = family_from_key(FAMILY)
    assert len({r["variant_key"] for r in rows}) > 3
    with TuningDB(REPO / "tuning_db" / "sm_90.db", readonly=True) as db:
        for b, d, n in CALLS + [(r["batch"], r["dim"], r["seqlen"]) for r in rows]:
            shape = rules.call_shape(family, b, d, n, ["bias", "silu"])
            want = served_winner(db, "sm_90", shape)
            assert rules.pick(rows, shape, rules.current_rank, "sm_90")["shape_key"] == want["shape_key"], shape.key()


@pytest.mark.parametrize("op, same_as", [("bwd", "weighted-1/2/0.5"), ("fwd", "product")])
def test_the_current_rule_is_the_backwards_weighted_one_and_the_forwards_product(op, same_as):
    """Session 68 moved the backward to the weighted rule (docs/DISPATCH.md); the forward kept
    batch x seqlen as one axis. Each op's current distance is that rule's, at every row."""
    family = family_from_key(FAMILY.replace("bwd.", f"{op}.", 1))
    rows = _shipped_rows()
    moved = 0
    for b, d, n in CALLS:
        shape = rules.call_shape(family, b, d, n, ["bias", "silu"])
        for r in rows:
            assert rules.current_rank(shape, r, "sm_90")[2] == pytest.approx(rules.RULES[same_as](shape, r, "sm_90")[2])
        other = "product" if same_as != "product" else "weighted-1/2/0.5"
        moved += rules.pick(rows, shape, rules.current_rank, "sm_90") != rules.pick(rows, shape, rules.RULES[other], "sm_90")
    assert moved > 0  # the two rules differ on this grid: the check above tells them apart


def _matrix(rows, slow_pick_of: str, fail_first: bool = False) -> dict:
    """Every variant 10 µs at every call but the one `slow_pick_of`'s rule picks, 12 µs (or,
    at the first call with fail_first, failed)."""
    family = family_from_key(FAMILY)
    calls = []
    for i, (b, d, n) in enumerate(CALLS):
        shape = rules.call_shape(family, b, d, n, ["bias", "silu"])
        slow = rules.pick(rows, shape, rules.RULES[slow_pick_of], "sm_90")["variant_key"]
        times = {r["variant_key"]: 10.0 for r in rows}
        times[slow] = None if (fail_first and i == 0) else 12.0
        calls.append(dict(batch=b, dim=d, seqlen=n, times=times, errors={}, served=slow))
    return dict(device="test", arch="sm_90", family=FAMILY, features=["bias", "silu"], rows=rows, calls=calls)


def test_score_gives_each_rule_its_regret():
    rows = _shipped_rows()
    got = {s["rule"]: s for s in rules.score(_matrix(rows, "current"))}
    assert set(got) == set(rules.RULES) == {"current", "product", "seqlen-apart", "weighted-1/2/0.5",
                                            "weighted-0.5/4/0"}
    cur = got["current"]
    assert (cur["calls"], cur["failed"], cur["within_5pct"]) == (len(CALLS), 0, 0)
    assert cur["mean"] == pytest.approx(0.2) and cur["worst"] == pytest.approx(0.2)
    # the other rule is slowed only where it picks what the current one picks
    family = family_from_key(FAMILY)
    same = sum(rules.pick(rows, s, rules.current_rank, "sm_90")["variant_key"] ==
               rules.pick(rows, s, rules.RULES["seqlen-apart"], "sm_90")["variant_key"]
               for s in (rules.call_shape(family, b, d, n, ["bias", "silu"]) for b, d, n in CALLS))
    assert 0 < same < len(CALLS)  # the rules differ somewhere on this grid, and agree somewhere
    other = got["seqlen-apart"]
    assert other["mean"] == pytest.approx(0.2 * same / len(CALLS))
    assert other["within_5pct"] == len(CALLS) - same


def test_the_current_rule_ranks_a_channel_last_tile_over_twice_the_sequence_behind_those_that_fit():
    """Since session 73 (the candidate cl-tile-misfit, timed and adopted), a channel-last
    forward or backward row whose tile is more than twice the call's sequence is a misfit,
    ranked behind every row that fits, whatever the distance; a tile up to twice the
    sequence is not (the shipped DB's channel-last forward rows)."""
    with TuningDB(REPO / "tuning_db" / "sm_90.db", readonly=True) as db:
        rows = [r for r in db.winners("sm_90") if r["family_key"] == "fwd.cl.bf16wbf16.w4"]
    family = family_from_key("fwd.cl.bf16wbf16.w4")
    long_tile = next(r for r in rows if r["tile_l"] == 512)
    call = rules.call_shape(family, 16, 2048, 128, ["bias", "silu"])
    assert rules.current_rank(call, long_tile, "sm_90")[1] is True
    assert all(rules.current_rank(call, r, "sm_90")[1] is False for r in rows if r["tile_l"] <= 256)
    longer = rules.call_shape(family, 16, 2048, 256, ["bias", "silu"])  # 512 is not more than twice 256
    assert rules.current_rank(longer, long_tile, "sm_90")[1] is False
    picked = rules.pick(rows, call, rules.current_rank, "sm_90")
    assert picked["tile_l"] <= 2 * call.seqlen


def test_a_picked_variant_that_failed_is_counted_not_timed():
    rows = _shipped_rows()
    cur = {s["rule"]: s for s in rules.score(_matrix(rows, "current", fail_first=True))}["current"]
    assert (cur["calls"], cur["failed"]) == (len(CALLS) - 1, 1)
    assert cur["mean"] == pytest.approx(0.2)


def test_score_option_prints_the_table(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(_matrix(_shipped_rows(), "seqlen-apart")))
    res = subprocess.run([sys.executable, str(SCRIPT), "--score", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("| seqlen-apart")]
    assert len(lines) == 1 and "| 20.0 % | 20.0 % |" in lines[0], res.stdout


def test_weight_search_scores_every_triple_of_the_grid():
    rows = _shipped_rows()
    matrices = [_matrix(rows, "weighted-1/2/0.5"), _matrix(rows, "product")]
    found = rules.weight_search(matrices)
    assert len(found) == 3 * 5 * 5 and len({r["weights"] for r in found}) == len(found)
    assert [r["total"] for r in found] == sorted(r["total"] for r in found)
    mine = next(r for r in found if r["weights"] == (1, 2, 0.5))  # the backward's rule: slow where it picks
    assert mine["means"] == pytest.approx([0.2, [s for s in rules.score(matrices[1])
                                                 if s["rule"] == "weighted-1/2/0.5"][0]["mean"]])
    assert found[0]["total"] < mine["total"]  # other triples pick otherwise somewhere


def test_weights_option_prints_the_best_sets_and_the_rules(tmp_path):
    paths = []
    for i, slow in enumerate(("weighted-1/2/0.5", "seqlen-apart")):
        paths.append(tmp_path / f"m{i}.json")
        paths[-1].write_text(json.dumps(_matrix(_shipped_rows(), slow)))
    res = subprocess.run([sys.executable, str(SCRIPT), "--weights", *map(str, paths), "--top", "3"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert f"75 weight sets on {2 * len(CALLS)} calls: the best is a lead to time (bench_rule.py), not a result" in lines
    table = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| weights")]
    assert len(table) == 3 + len(rules.RULES)
    cells = next(ln for ln in table if ln.startswith("| rule seqlen-apart |")).strip("| ").split(" | ")
    assert cells[2] == "20.0 %"  # matrix 2: slow wherever seqlen-apart picks
    assert next(ln for ln in table if ln.startswith("| rule weighted-1/2/0.5 |")).split(" | ")[1] == "20.0 %"


def test_ranking_needs_no_optuna(tmp_path):
    """The device has no Optuna unless it is carried: ranking rows (the dispatcher's rule,
    tuner/serving.py) must not import the tuner's search stack."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps(_matrix(_shipped_rows(), "current")))
    run = ("import runpy, sys; sys.modules['optuna'] = None; sys.path.insert(0, sys.argv[1]); "
           "sys.argv = [sys.argv[2], '--score', sys.argv[3]]; runpy.run_path(sys.argv[0], run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", run, str(SCRIPT.parent), str(SCRIPT), str(path)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)  # not the source tree
    assert res.returncode == 0, res.stderr
    assert any(ln.startswith("| current") for ln in res.stdout.splitlines()), res.stdout


def test_score_refuses_a_file_it_did_not_write(tmp_path):
    path = tmp_path / "m.json"
    path.write_text('{"calls": []}')
    res = subprocess.run([sys.executable, str(SCRIPT), "--score", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and f"--score {path}: not a matrix that cross_serve.py wrote (KeyError" in res.stderr


def test_measure_times_every_variant_at_every_call_and_keeps_failures(tmp_path, monkeypatch, capsys):
    """The measuring loop with the tuner's fake evaluator (no GPU): every distinct variant of
    the family's rows at every call, a variant that fails to launch kept as None with its
    reason, the dispatcher's pick named, and the JSON written whole."""
    from cc1d import _runtime
    from cc1d.tuner import device, evaluate
    from cc1d.tuner.testing import FakeEvaluator
    rows = _shipped_rows()
    broken = sorted({r["variant_key"] for r in rows})[0]
    monkeypatch.setattr(device, "probe_device", lambda: device.DeviceInfo("sm_90", "fake H100"))
    monkeypatch.setattr(_runtime, "runtime", lambda: None)
    monkeypatch.setattr(evaluate, "GpuEvaluator", lambda rt, shape, arch: FakeEvaluator(
        times=lambda v: 10.0 + shape.seqlen / 1000 + len(v.key()) / 100, launch_fails=lambda v: v.key() == broken))
    out = tmp_path / "m.json"
    assert cross.main(["--batches", "2", "--dims", "4096", "--lengths", "1000,2047", "--out", str(out),
                       "--db", str(REPO / "tuning_db" / "sm_90.db")]) == 0
    m = json.loads(out.read_text())
    assert not (tmp_path / "m.json.tmp").exists()
    assert (m["device"], m["arch"], m["family"], m["features"]) == ("fake H100", "sm_90", FAMILY, ["bias", "silu"])
    assert m["rows"] == rows
    assert [(c["batch"], c["dim"], c["seqlen"]) for c in m["calls"]] == [(2, 4096, 1000), (2, 4096, 2047)]
    for c in m["calls"]:
        assert set(c["times"]) == {r["variant_key"] for r in rows}
        assert c["times"][broken] is None and "launch_error" in c["errors"][broken]
        assert all(t == pytest.approx(10.0 + c["seqlen"] / 1000 + len(k) / 100)
                   for k, t in c["times"].items() if k != broken)
        assert c["served"] in {r["variant_key"] for r in rows}
    own = next(r["variant_key"] for r in rows if r["shape_key"] == "b2.d4096.l1000.bias.silu")
    assert m["calls"][0]["served"] == own  # a tuned call gets its own winner
    assert "| current |" in capsys.readouterr().out


def test_a_stopped_run_keeps_the_calls_it_finished(tmp_path, monkeypatch):
    from cc1d import _runtime
    from cc1d.tuner import device, evaluate
    from cc1d.tuner.testing import FakeEvaluator
    made = []

    def evaluator(rt, shape, arch):
        made.append(shape)
        if len(made) == 2:
            raise KeyboardInterrupt  # stands for Ctrl-C during the second call
        return FakeEvaluator()

    monkeypatch.setattr(device, "probe_device", lambda: device.DeviceInfo("sm_90", "fake H100"))
    monkeypatch.setattr(_runtime, "runtime", lambda: None)
    monkeypatch.setattr(evaluate, "GpuEvaluator", evaluator)
    out = tmp_path / "m.json"
    with pytest.raises(KeyboardInterrupt):
        cross.main(["--batches", "2", "--dims", "4096", "--lengths", "1000,3000", "--out", str(out)])
    m = json.loads(out.read_text())
    assert [c["seqlen"] for c in m["calls"]] == [1000] and not (tmp_path / "m.json.tmp").exists()


# ---- --loo: leave-one-out regret from tuning trials ----------------------------------

def _loo_rows() -> list[dict]:
    with TuningDB(REPO / "tuning_db" / "sm_90.db", readonly=True) as db:
        return [{c: r[c] for c in (*cross.ROW_COLUMNS, "arch", "epoch")} for r in db.winners("sm_90")
                if r["family_key"] == FAMILY]


def _loo_pick(rows, entry, rank):
    family = family_from_key(FAMILY)
    shape = rules.call_shape(family, entry["batch"], entry["dim"], entry["seqlen"], entry["features"].split(","))
    return rules.pick([r for r in rows if r["shape_key"] != entry["shape_key"]], shape, rank, "sm_90")["variant_key"]


def _trials_db(path, rows, entries, epoch_of=lambda r: r["epoch"], missing=None):
    """Trials of each entry's shape: every variant of the family's winners 10 µs, the one the
    current rule picks with the entry left out 13 µs (or no trial of it, for `missing`)."""
    with TuningDB(path) as db:
        for e in entries:
            slow = _loo_pick(rows, e, rules.current_rank)
            for v in {r["variant_key"] for r in rows}:
                if e is missing and v == slow:
                    continue
                db.add_trial(run_id="t", arch="sm_90", family_key=FAMILY, shape_key=e["shape_key"], variant_key=v,
                             config={}, status="ok" if v != slow else "slow", time_us=13.0 if v == slow else 10.0,
                             epoch=epoch_of(e))
    return path


def test_loo_scores_each_rule_where_the_trials_time_its_pick(tmp_path):
    rows = _loo_rows()
    entries = [r for r in rows if r["features"] == "bias,silu"][:6]
    times = rules.trial_times([_trials_db(tmp_path / "t.db", rows, entries, missing=entries[0])], "sm_90", FAMILY,
                              {r["shape_key"]: r["epoch"] for r in rows})
    assert rules.trial_times([tmp_path / "t.db"], "gfx942", FAMILY, {r["shape_key"]: r["epoch"] for r in rows}) == {}
    assert set(times) == {e["shape_key"] for e in entries}
    got = {s["rule"]: s for s in rules.loo_score(rows, times, "sm_90")}
    cur = got["current"]
    assert (cur["calls"], cur["unknown"], cur["within_5pct"]) == (5, 1, 0)  # the first one's pick: no trial
    assert cur["mean"] == pytest.approx(0.3) and cur["worst"] == pytest.approx(0.3)
    for name in ("product", "seqlen-apart", "weighted-1/2/0.5", "weighted-0.5/4/0"):
        rank = rules.RULES[name]
        same = [_loo_pick(rows, e, rank) == _loo_pick(rows, e, rules.current_rank) for e in entries]
        other = got[name]
        assert (other["calls"], other["unknown"]) == (6 - same[0], int(same[0]))  # unknown: the same missing pick
        assert other["mean"] * other["calls"] == pytest.approx(0.3 * sum(same[1:]))


def test_loo_leaves_out_trials_of_another_epoch(tmp_path):
    rows = _loo_rows()
    entries = [r for r in rows if r["features"] == "bias,silu"][:2]
    path = _trials_db(tmp_path / "t.db", rows, entries, epoch_of=lambda r: r["epoch"] - 1)
    assert rules.trial_times([path], "sm_90", FAMILY, {r["shape_key"]: r["epoch"] for r in rows}) == {}


def test_loo_option_prints_the_table(tmp_path):
    rows = _loo_rows()
    path = _trials_db(tmp_path / "t.db", rows, [r for r in rows if r["features"] == "bias,silu"][:4])
    res = subprocess.run([sys.executable, str(SCRIPT), "--loo", str(path)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"{FAMILY} in " in res.stdout and "4 with trials in 1 DBs" in res.stdout
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("| current"))
    assert line.startswith("| current | 30.0 % | 30.0 % | 30.0 % |") and line.endswith("| 0 / 4 | 0 |"), line


@pytest.mark.parametrize("argv, message", [
    (["--loo", "/nonexistent/t.db"], "--loo: no such file '/nonexistent/t.db'"),
    (["--loo", "SHIPPED", "--db", "/nonexistent/x.db"], "--db: no such file '/nonexistent/x.db'"),
    (["--loo", "SHIPPED", "--score", "SHIPPED"], "--score and --loo: one at a time"),
])
def test_loo_options_are_checked(argv, message):
    shipped = str(REPO / "tuning_db" / "sm_90.db")
    res = subprocess.run([sys.executable, str(SCRIPT), *[shipped if a == "SHIPPED" else a for a in argv]],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and message in res.stderr, res.stderr


def test_a_midway_call_goes_to_the_first_entry_in_the_runtimes_order():
    """(8, 5120, 8192) is as far from (4, 5120, 8192), (16, 5120, 2048) and (16, 5120, 8192):
    batch x seqlen a factor of 2 from each, one float. The runtime keeps a family's entries by
    features, batch, dim and seqlen (tuning_db.cpp) and serves the first of those alike, so
    the tuner must too, in whatever order the rows come (session 73: it took the first by
    shape key, (16, 5120, 2048), while the runtime ran (4, 5120, 8192)'s kernel)."""
    from cc1d.tuner.serving import entry_order, runtime_rank, serve_from
    family = family_from_key("fwd.cf.bf16wbf16.w4")

    def row(b, d, n, features="bias,silu"):
        return dict(shape_key=f"b{b}.d{d}.l{n}." + features.replace(",", "."), batch=b, dim=d, seqlen=n,
                    features=features, tile_l=2048, tile_d=1, threads=64, align_bytes=16)
    rows = [row(16, 5120, 2048), row(16, 5120, 8192), row(4, 5120, 8192), row(2, 5120, 8192, "bias")]
    call = rules.call_shape(family, 8, 5120, 8192, ["bias", "silu"])
    assert len({runtime_rank(call, r, "sm_90") for r in rows[:3]}) == 1  # exactly alike
    assert runtime_rank(call, rows[3], "sm_90") > runtime_rank(call, rows[0], "sm_90")  # a feature apart
    for order in (rows, rows[::-1], sorted(rows, key=lambda r: r["shape_key"])):
        assert serve_from(order, "sm_90", call)["shape_key"] == "b4.d5120.l8192.bias.silu"
    assert sorted(rows, key=entry_order)[0]["shape_key"] == "b2.d5120.l8192.bias"  # fewer feature bits first
