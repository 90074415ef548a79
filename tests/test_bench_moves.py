"""benchmarks/bench_moves.py: its options are checked before a GPU is touched; --list names
every call of tuner/moves.py's grid that a DB change moves, and which of them it times; on
a GPU (`gpu`), a moved call is timed through each DB, the dispatcher pointed at each in turn."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from cc1d.tuner.db import TuningDB, family_from_key
from cc1d.tuner.moves import Move, moved_calls, snapshot
from cc1d.tuner.shapes import Shape
from conftest import benchmark_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_moves.py"
SHIPPED = REPO / "tuning_db" / "sm_90.db"
moves_script = benchmark_script("bench_moves")

DROPPED = "b8.d5120.l4096.bias.silu"  # a bwd.cf.bf16wbf16.w4 entry serving many neighbours (13 grid calls)


def _run(*argv, env=None, cwd=None):
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd)


def _without(tmp_path, shape_key=DROPPED) -> Path:
    """The shipped DB less one winner: the DB before that entry was added."""
    path = tmp_path / "before.db"
    shutil.copyfile(SHIPPED, path)
    with closing(sqlite3.connect(path)) as con, con:
        gone = con.execute("DELETE FROM winners WHERE shape_key = ? AND family_key = 'bwd.cf.bf16wbf16.w4'",
                           (shape_key,)).rowcount
    assert gone == 1
    return path


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: --before"),
    (["--before", "/nonexistent/a.db"], "--before: no such file '/nonexistent/a.db'"),
    (["--before", str(SHIPPED), "--after", "/nonexistent/b.db"], "--after: no such file '/nonexistent/b.db'"),
    (["--before", str(SHIPPED), "--max-calls", "0"], "--max-calls expects a positive integer, got 0"),
    (["--before", str(SHIPPED), "--deadline-s", "0"], "--deadline-s expects a positive number of seconds, got 0"),
    (["--before", str(SHIPPED), "--deadline-s", "nan"], "--deadline-s expects a positive number of seconds, got nan"),
])
def test_bad_options_are_refused_before_the_gpu(argv, message):
    res = _run(*argv)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr


@pytest.mark.parametrize("which", ["--before", "--after"])
def test_an_unreadable_db_ends_with_its_message_not_a_traceback(tmp_path, which):
    junk = tmp_path / "junk.db"
    junk.write_text("not sqlite")
    dbs = {"--before": str(SHIPPED), "--after": str(SHIPPED), which: str(junk)}
    res = _run(*(a for kv in dbs.items() for a in kv), "--list")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.startswith(f"bench_moves.py: tuning DB {junk} is not a readable SQLite DB"), res.stderr


def test_a_set_tuning_db_variable_is_refused(tmp_path):
    env = dict(os.environ, CC1D_TUNING_DB=str(tmp_path / "mine.db"))
    res = _run("--before", str(SHIPPED), "--list", env=env)
    assert res.returncode == 2 and "CC1D_TUNING_DB is set" in res.stderr


def test_list_names_every_moved_call(tmp_path):
    before = _without(tmp_path)
    with TuningDB(before, readonly=True) as a, TuningDB(SHIPPED, readonly=True) as b:
        want = moved_calls(snapshot(a), snapshot(b))
    assert len(want) > 3  # the entry serves calls around it
    res = _run("--before", str(before), "--after", str(SHIPPED), "--list", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"{len(want)} moved calls"
    assert len(lines) == len(want) + 1
    for m, ln in zip(want, lines[1:]):
        assert ln.startswith(f"sm_90 {m.family_key} ({m.features}) {m.call}: ")
        assert ln.endswith(m.after[len(m.family_key) + 1:])  # all timed: bwd with bias and SiLU


def test_entries_adds_the_dropped_entrys_own_call_last(tmp_path):
    before = _without(tmp_path)
    plain = _run("--before", str(before), "--after", str(SHIPPED), "--list", cwd=tmp_path)
    res = _run("--before", str(before), "--after", str(SHIPPED), "--list", "--entries", cwd=tmp_path)
    assert plain.returncode == res.returncode == 0, plain.stderr + res.stderr
    lines, plain_lines = res.stdout.splitlines(), plain.stdout.splitlines()
    n = len(plain_lines) - 1
    assert lines[0] == f"{n + 1} moved calls, 1 of them entries"
    assert lines[1:-1] == plain_lines[1:]
    assert lines[-1].startswith("sm_90 bwd.cf.bf16wbf16.w4 (bias,silu) (8, 5120, 4096) entry: ")


def test_an_unchanged_db_moves_nothing(tmp_path):
    res = _run("--before", str(SHIPPED), "--after", str(SHIPPED), "--list", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.splitlines() == ["0 moved calls"]


@pytest.mark.parametrize("family, features, why", [
    ("bwd.cf.bf16wbf16.w4", "bias,silu", None),
    ("fwd.cl.f16wf16.w3", "", None),
    ("fwd.cf.bf16wbf16.w4", "silu", None),
    ("upd.cl.bf16wbf16.w4", "bias,silu", "op upd"),
    ("bwd.cf.bf16wbf16.w4", "bias,silu,seqidx", None),
    ("fwd.cl.bf16wbf16.w4", "bias,silu,init,final", None),
    ("vfwd.cl.bf16wbf16.w4", "bias,silu,init,final", "op vfwd"),
])
def test_which_calls_are_timed(family, features, why):
    m = Move("sm_90", family, features, (1, 64, 128), None, family + ".x")
    assert moves_script.why_untimed(m) == why


def test_plan_times_the_first_calls_it_can_and_says_why_not_the_rest():
    fam = "bwd.cf.bf16wbf16.w4"
    moves = [Move("sm_90", fam, "bias,silu", (1, 64, n), None, fam + ".x") for n in (128, 512, 1000)]
    upd = "upd.cl.bf16wbf16.w4"
    moves.insert(1, Move("sm_90", upd, "bias,silu,pool", (16, 64, 1), None, upd + ".x"))
    timed, rest = moves_script.plan(moves, max_calls=2)
    assert [m.call for m in timed] == [(1, 64, 128), (1, 64, 512)] and timed[0].family_key == fam
    assert rest == [dict(family=upd, features="bias,silu,pool", call=[16, 64, 1], reason="op upd"),
                    dict(family=fam, features="bias,silu", call=[1, 64, 1000], reason="past --max-calls 2")]


def test_plan_times_the_entries_first_then_each_family_in_turn():
    def mv(fam, n, entry=False):
        return Move("sm_90", fam, "bias,silu", (1, 64, n), "a", fam + ".x", entry)
    cf, cl = "bwd.cf.bf16wbf16.w4", "bwd.cl.bf16wbf16.w4"
    moves = [mv(cf, 128), mv(cf, 512), mv(cf, 1000), mv(cl, 128), mv(cl, 512), mv(cf, 2048, entry=True)]
    timed, rest = moves_script.plan(moves, max_calls=3)
    assert [(m.family_key, m.call[2], m.entry) for m in timed] == [(cf, 2048, True), (cf, 128, False), (cl, 128, False)]
    assert [r["call"][2] for r in rest] == [512, 1000, 512]
    timed, rest = moves_script.plan(moves, max_calls=1)
    assert [m.entry for m in timed] == [True] and len(rest) == 5


def test_the_timed_calls_are_grouped_by_the_entry_serving_them_after():
    def row(shape, before, after, family="bwd.cf.bf16wbf16.w4"):
        return dict(family=family, after_shape=shape, before_us=before, after_us=after,
                    after_vs_before=moves_script.ratio(before, after))
    rows = [row("b1.d64.l512", 10.0, 8.0), row("b1.d64.l512", 10.0, 12.5), row("b4.d64.l128", 10.0, 10.1),
            row("b4.d64.l128", 10.0, None), row("b4.d64.l128", 10.0, 9.0, family="fwd.cf.bf16wbf16.w4")]
    got = moves_script.by_entry(rows)
    # most slowed first, then the slowest geometric mean
    assert [(g["family"][:3], g["shape"], g["calls"], g["slowed"]) for g in got] == [
        ("bwd", "b4.d64.l128", 2, 1), ("bwd", "b1.d64.l512", 2, 1), ("fwd", "b4.d64.l128", 1, 0)]
    assert got[0]["geomean"] == pytest.approx(10 / 10.1)  # the failed call is counted slowed, not timed
    assert got[1]["geomean"] == pytest.approx((1.25 * 0.8) ** 0.5)
    assert moves_script.by_entry([row("x", None, 5.0)])[0]["geomean"] is None


def test_ratio_is_none_where_a_time_is_missing():
    assert moves_script.ratio(30.0, 20.0) == 1.5
    assert moves_script.ratio(None, 20.0) is None and moves_script.ratio(30.0, float("nan")) is None


def test_the_dispatchers_folder_holds_what_the_db_holds_in_its_wal(tmp_path):
    """A DB still open in WAL mode (a merge not yet finalized) keeps its last commits in its
    -wal file: the folder's copy holds them too, as one file."""
    live = tmp_path / "live.db"
    shutil.copyfile(SHIPPED, live)
    with TuningDB(live) as db:  # opened for writing: WAL mode
        db.conn.execute("DELETE FROM winners WHERE shape_key = ?", (DROPPED,))
        assert (tmp_path / "live.db-wal").exists()
        folder = moves_script.package_dir_with(live, "sm_90", tmp_path, "pkg")
    copy = folder / "tuning_db" / "sm_90.db"
    with TuningDB(copy, readonly=True) as db:
        assert DROPPED not in {w["shape_key"] for w in db.winners()}
    assert sorted(p.name for p in copy.parent.iterdir()) == ["sm_90.db"]


@pytest.mark.gpu
def test_a_moved_call_is_timed_through_each_db(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    before = _without(tmp_path)
    out = tmp_path / "m.json"
    res = _run("--before", str(before), "--after", str(SHIPPED), "--max-calls", "2", "--out", str(out),
               cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == 2 and doc["not_timed"]
    for row in doc["rows"]:
        assert row["before_us"] > 0 and row["after_us"] > 0, row
        assert row["after_vs_before"] == pytest.approx(row["before_us"] / row["after_us"])
        assert row["labels_hold"] is True, row  # the runtime ran the kernels the row names


@pytest.mark.gpu
def test_the_dispatcher_serves_each_db_in_turn(tmp_path):
    """What bench_moves.py relies on: pointing the dispatcher at a folder with one DB makes
    the next call's decision come from it, and nothing else is in the chain."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import cc1d
    from cc1d import backward
    from cc1d._runtime import runtime
    before = _without(tmp_path)
    with TuningDB(before, readonly=True) as a, TuningDB(SHIPPED, readonly=True) as b:
        m = next(m for m in moved_calls(snapshot(a), snapshot(b)) if m.before)
    dirs = {name: moves_script.package_dir_with(db, "sm_90", tmp_path, name)
            for name, db in (("before", before), ("after", SHIPPED))}
    bsz, d, n = m.call
    x, dout = (torch.randn(bsz, d, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(d, 4, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(d, device="cuda", dtype=torch.bfloat16)
    args = backward._bwd_call_args(x, w, bias, None, None, dout, None, torch.empty_like(x), None,
                                   torch.empty_like(w), torch.empty_like(bias), None, True)
    try:
        for name, want in (("before", m.before), ("after", m.after), ("before", m.before)):
            runtime().set_package_dir(str(dirs[name]))
            got = runtime().explain_bwd(*args)
            assert got["source"].startswith(str(dirs[name])), got
            assert got["key"].split(".realign")[0] == want, (name, got)
    finally:
        runtime().set_package_dir(str(Path(cc1d.__file__).resolve().parent))


def test_the_table_puts_the_slowed_calls_first_and_counts_them(capsys):
    def row(call, before, after, peer=None):
        r = dict(family="bwd.cf.bf16wbf16.w4", features="bias,silu", call=call,
                 before_variant="bwd.cf.bf16wbf16.w4.tA", after_variant="bwd.cf.bf16wbf16.w4.tB",
                 before_us=before, after_us=after, copy_frac_after=0.5)
        if peer:
            r["peer_us"] = peer
        else:
            r["peer_error"] = "width 4 refused"
        r["after_vs_before"] = moves_script.ratio(before, after)
        r["after_vs_peer"] = moves_script.ratio(peer, after)
        return r
    doc = dict(device="GPU A", copy_gbps=4000.0, peer_version="1.7.0", before="a.db", after="b.db",
               rows=[dict(row([1, 64, 128], 10.0, 8.0, 9.0), entry=True), row([2, 64, 128], 10.0, 12.0)],
               not_timed=[dict(family="upd.cl.bf16wbf16.w4", features="bias,silu", call=[1, 64, 1], reason="op upd")])
    moves_script.print_table(doc)
    out = capsys.readouterr().out.splitlines()
    body = [ln for ln in out if ln.startswith("| bwd")]
    assert body[0] == "| bwd.cf.bf16wbf16.w4 | bias,silu | (2, 64, 128) | tA -> tB | 10.0 | 12.0 | 50 % | 0.83x | " \
                      "failed: width 4 refused | - |"
    assert body[1].endswith("| 10.0 | 8.0 | 50 % | 1.25x | 9.0 | 1.12x |")
    assert "(2, 64, 128) |" in body[0] and "(1, 64, 128) entry |" in body[1]
    assert out[-1] == "2 calls timed, 1 slowed after (more than 3 %, or failing); 1 not timed"


def _timed(call, before, after, family="bwd.cf.bf16wbf16.w4", features="bias,silu"):
    return dict(family=family, features=features, call=call, before_variant=f"{family}.tA",
                after_variant=f"{family}.tB", before_us=before, after_us=after)


def test_slowed_calls_are_those_beyond_the_guards_tolerance_or_failing_after():
    rows = [_timed([1, 64, 128], 10.0, 10.2), _timed([2, 64, 128], 10.0, 10.4),
            _timed([4, 64, 128], 10.0, None), _timed([8, 64, 128], None, 30.0), _timed([16, 64, 128], 10.0, 7.0)]
    assert [r["call"][0] for r in moves_script.slowed_rows(dict(rows=rows))] == [2, 4]


def test_the_slowed_calls_are_written_as_a_shapes_file_to_tune(tmp_path):
    from cc1d.tuner.shapes import load_shapes
    rows = [_timed([2, 2560, 3000], 10.0, 12.0), _timed([1, 96, 700], 5.0, None, "fwd.cl.f16wf16.w3", "seqidx")]
    doc = dict(arch="sm_90", device="GPU A", before="a.db", after="b.db", rows=rows)
    path = tmp_path / "slowed.yaml"
    moves_script.write_shapes(path, doc, rows)
    shapes = load_shapes(path)
    assert [(s.family().key(), s.batch, s.dim, s.seqlen) for s in shapes] == \
        [("bwd.cf.bf16wbf16.w4", 2, 2560, 3000), ("fwd.cl.f16wf16.w3", 1, 96, 700)]
    assert (shapes[0].bias, shapes[0].activation, shapes[1].seq_idx, shapes[1].bias) == (True, "silu", True, False)
    assert [p.name for p in tmp_path.iterdir()] == ["slowed.yaml"]  # no temporary file left


def test_shapes_out_must_be_a_new_file(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("shapes: []\n")
    res = _run("--before", str(SHIPPED), "--shapes-out", str(old))
    assert res.returncode == 2 and "--shapes-out: expected a new file in an existing folder" in res.stderr
    assert "(exists)" in res.stderr and old.read_text() == "shapes: []\n"
    res = _run("--before", str(SHIPPED), "--shapes-out", str(tmp_path / "no" / "s.yaml"))
    assert res.returncode == 2 and "(is in no folder)" in res.stderr
    res = _run("--before", str(SHIPPED), "--shapes-out", str(tmp_path / "s.yaml"), "--list")
    assert res.returncode == 2 and "--shapes-out writes the calls timed slower: not with --list" in res.stderr


@pytest.mark.parametrize("family, features", [
    ("fwd.cf.bf16wbf16.w4", ["bias", "silu"]), ("fwd.cl.f16wf16.w3", ["seqidx"]),
    ("fwd.cl.bf16wbf16.w4", ["bias", "silu", "init", "final"]), ("bwd.cf.bf16wbf16.w4", ["bias", "silu", "seqidx"]),
    ("bwd.cl.bf16wf32.w4", ["silu", "init", "final"]),
])
def test_the_calls_pass_every_input_the_tuner_makes(monkeypatch, family, features):
    """calls_of on CPU tensors from tuner/problems.py, cc1d's functions and the peer replaced
    by recorders: each input of the shape reaches them, the states only where the call has them."""
    pytest.importorskip("torch")
    import cc1d
    from cc1d.tuner.problems import problem_for
    seen = {}
    monkeypatch.setattr(cc1d, "causal_conv1d_fn", lambda *a, **k: seen.update(ours=(a, k)))
    monkeypatch.setattr(cc1d, "causal_conv1d_bwd", lambda *a, **k: seen.update(ours=(a, k)))
    shape = Shape.of(family_from_key(family), 2, 16, 40, features)
    sets = [problem_for(shape.op).make_inputs(shape, seed=k, device="cpu") for k in range(2)]
    ours, theirs = moves_script.calls_of(shape, sets, lambda *a, **k: seen.update(peer=(a, k)))
    assert len(ours) == 2
    ours[1]()
    args, kw = seen["ours"]
    s = sets[1]
    assert args[0] is s["x"] and args[1] is s["weight"] and args[2] is s["bias"]
    assert kw["activation"] == ("silu" if "silu" in features else None)
    if shape.op == "fwd":
        assert kw["seq_idx"] is s["seq_idx"] and kw["initial_states"] is s["initial_states"]
        assert kw["return_final_states"] == ("final" in features)
    else:
        assert args[3] is s["dout"] and args[4] is s["seq_idx"] and args[5] is s["initial_states"]
        assert args[6] is s["dfinal_states"] and kw["return_dinitial_states"] == ("init" in features)
    assert ("seqidx" in features) == (s["seq_idx"] is not None)
    if shape.op == "bwd" and "init" in features:
        assert theirs is None  # the peer's backward wrapper takes no states
    else:
        theirs[0]()
        assert seen["peer"][0][0] is sets[0]["x"]


@pytest.mark.parametrize("with_peer", [True, False])
def test_a_call_is_timed_under_each_name_and_the_peer_on_the_same_inputs(monkeypatch, with_peer):
    """time_call (bench_moves.py's and bench_vs_peer.py's timing of one call) on CPU tensors,
    cc1d, the peer and the graph timing replaced by recorders."""
    pytest.importorskip("torch")
    import timing

    import cc1d
    from cc1d.tuner.problems import problem_for
    seen: dict = {"ours": [], "peer": []}
    monkeypatch.setattr(cc1d, "causal_conv1d_bwd", lambda *a, **k: seen["ours"].append(a[0]))

    def graph_times(cands, setup=None):
        seen.update(names=list(cands), setup=setup)
        for fns in cands.values():
            for fn in fns:
                fn()
        return {"after": 10.0, "before": 12.5, "peer": "refused"} if with_peer else {"after": 10.0, "before": 12.5}
    monkeypatch.setattr(timing, "graph_times_us", graph_times)
    shape = Shape.of(family_from_key("bwd.cf.bf16wbf16.w4"), 2, 16, 40, ["bias", "silu"])
    peer = (lambda *a, **k: seen["peer"].append(a[0])) if with_peer else None
    times, nbytes = moves_script.time_call(shape, peer, ("after", "before"), setup={"after": print}, device="cpu")
    assert nbytes == problem_for("bwd").bytes_moved(shape)
    assert seen["names"] == (["after", "before", "peer"] if with_peer else ["after", "before"])
    assert seen["setup"] == {"after": print}
    want = {"after_us": 10.0, "before_us": 12.5}
    assert times == (dict(want, peer_error="refused") if with_peer else want)
    sets = len(seen["ours"]) // 2
    assert sets >= 1 and all(a is b for a, b in zip(seen["ours"][:sets], seen["ours"][sets:]))  # same inputs
    if with_peer:
        assert all(a is b for a, b in zip(seen["peer"], seen["ours"][:sets], strict=True))


@pytest.mark.parametrize("fails_at", [None, 1])
def test_rows_are_written_after_every_call_and_the_package_dbs_restored_however_it_ends(tmp_path, monkeypatch,
                                                                                         fails_at):
    """collect_rows (bench_moves.py's and bench_vs_peer.py's loop over the calls they time),
    the runtime replaced by a recorder."""
    import cc1d
    import cc1d._runtime as rt_module
    dirs = []
    monkeypatch.setattr(rt_module, "runtime", lambda: type("R", (), {"set_package_dir": lambda self, d: dirs.append(d)})())
    out = tmp_path / "rows.json"
    seen_on_disk = []

    def row_of(call):
        if out.exists():
            seen_on_disk.append(len(json.loads(out.read_text())["rows"]))
        if call == fails_at:
            raise RuntimeError("a call failed")
        return dict(call=call)
    doc = dict(rows=[])
    shown = []
    try:
        moves_script.collect_rows([0, 1, 2], row_of, lambda r: shown.append(r["call"]) or str(r["call"]), doc, out,
                                  "calls")
    except RuntimeError:
        assert fails_at == 1
    want = [0, 1, 2] if fails_at is None else [0]
    assert [r["call"] for r in doc["rows"]] == shown == want
    assert json.loads(out.read_text())["rows"] == doc["rows"] and seen_on_disk == want[1:] + ([1] if fails_at else [])
    assert dirs == [str(Path(cc1d.__file__).resolve().parent)]


def test_past_the_deadline_no_call_starts_and_the_rest_are_listed_not_timed(tmp_path, monkeypatch):
    """collect_rows' deadline_s (--deadline-s): a call that started before it is finished; the
    calls after it are added to not_timed with the reason, and the JSON says so."""
    import types

    import cc1d._runtime as rt_module
    monkeypatch.setattr(rt_module, "runtime", lambda: type("R", (), {"set_package_dir": lambda self, d: None})())
    clock = [100.0]
    monkeypatch.setattr(moves_script.time, "monotonic", lambda: clock[0])

    def row_of(call):
        clock[0] += 6.0  # each call takes 6 s
        return dict(call=list(call.call))
    calls = [types.SimpleNamespace(family_key="bwd.cf.bf16wbf16.w3", features="bias,silu", call=(1, 2048, n))
             for n in (128, 512, 1000, 2048)]
    out = tmp_path / "rows.json"
    doc = dict(rows=[], not_timed=[dict(family="x", features="", call=[1, 1, 1], reason="op upd")])
    moves_script.collect_rows(calls, row_of, str, doc, out, "calls", deadline_s=10)
    assert [r["call"][2] for r in doc["rows"]] == [128, 512]  # the second started at 6 s, before 10
    assert doc["not_timed"][1:] == [dict(family="bwd.cf.bf16wbf16.w3", features="bias,silu", call=[1, 2048, n],
                                         reason="past --deadline-s 10") for n in (1000, 2048)]
    assert json.loads(out.read_text()) == doc
    doc = dict(rows=[], not_timed=[])
    moves_script.collect_rows(calls, row_of, str, doc, None, "calls")  # no deadline: every call
    assert len(doc["rows"]) == 4 and doc["not_timed"] == []


@pytest.mark.parametrize("family_key", ["fwd.cf.bf16wbf16.w4", "bwd.cl.bf16wf32.w4"])
def test_with_arch_the_runtimes_own_kernel_is_named_under_each_db(monkeypatch, tmp_path, family_key):
    """time_call(arch=...) asks cc1d.explain (explain_bwd) which kernel the runtime launches
    for the call under each name, its setup run first: a package dir holding one DB, then
    another (CPU tensors: explain needs no GPU with an arch; the timing is replaced)."""
    pytest.importorskip("torch")
    import timing

    from cc1d._runtime import runtime
    from cc1d.generator import default_variant, variants
    family = family_from_key(family_key)
    monkeypatch.setattr(timing, "graph_times_us", lambda cands, setup=None: {n: 1.0 for n in cands})
    shape = Shape.of(family, 2, 64, 200, ["bias", "silu"])
    other = next(v for v in variants(family) if v.key() != default_variant(family).key()
                 and v.geometry()["align_bytes"] <= 16)
    db = tmp_path / "one.db"
    with TuningDB(db) as t:
        t.put_winner(other.source, arch="sm_90", family_key=family.key(), shape_key=shape.key(), op=family.op,
                     batch=2, dim=64, seqlen=200, features="bias,silu", variant_key=other.key(), config=other.params,
                     **other.geometry(), time_us=1.0, environment={"device": "test"})
    empty = tmp_path / "empty.db"
    TuningDB(empty).close()
    dirs = {"after": moves_script.package_dir_with(db, "sm_90", tmp_path, "after"),
            "before": moves_script.package_dir_with(empty, "sm_90", tmp_path, "before")}
    rt = runtime()
    setup = {name: (lambda d=d: rt.set_package_dir(str(d))) for name, d in dirs.items()}
    try:
        times, _ = moves_script.time_call(shape, None, ("after", "before"), setup, device="cpu", arch="sm_90")
    finally:
        import cc1d
        rt.set_package_dir(str(Path(cc1d.__file__).resolve().parent))
    assert times["after_kernel"].removesuffix(".realign") == other.key()
    assert times["before_kernel"].removesuffix(".realign") == default_variant(family).key()
    row = dict(family=family.key(), before_variant=None, after_variant=other.key(), **times)
    assert moves_script.labels_hold(row) is True
    assert moves_script.labels_hold(dict(row, after_variant=default_variant(family).key())) is False


def test_labels_hold_compares_the_runtimes_kernels_with_the_names():
    fam = "fwd.cf.bf16wbf16.w4"
    from cc1d.generator import default_variant
    default = default_variant(family_from_key(fam)).key()
    a, b = f"{fam}.A", f"{fam}.B"
    assert moves_script.labels_hold(dict(family=fam, before_variant=a, after_variant=b)) is None  # none named
    row = dict(family=fam, before_variant=a, after_variant=b, before_kernel=a, after_kernel=b + ".realign")
    assert moves_script.labels_hold(row) is True  # a realigned twin is its variant's
    assert moves_script.labels_hold(dict(row, before_kernel=b)) is False
    assert moves_script.labels_hold(dict(row, before_variant=None, before_kernel=default)) is True
    sweep = dict(family=fam, variant=a, cc1d_kernel=a)
    assert moves_script.labels_hold(sweep) is True and moves_script.labels_hold(dict(sweep, cc1d_kernel=b)) is False
