"""benchmarks/prune_runs.py: its options and timings files are checked; the calls a run's
winner moves are looked up in the timings (either benchmark's rows); with --out-dir a winner
whose moves slowed a timed call is left out of the run's DB written there, and one whose
timed moves are all faster is kept; a tuner log's guard lines count as timings (--guard-logs);
--slowed-out writes the slowed calls as a shapes file to tune, each once with its kernel
before, and no shapes file is written empty; moved calls no timing covers are listed, the
pruning's own moves marked.
No GPU: the runs, timings and logs are made here."""
from __future__ import annotations

import json
import shutil
import sqlite3
import statistics
import subprocess
import sys
from collections import defaultdict
from contextlib import closing
from pathlib import Path

import pytest

from cc1d.tuner.db import TuningDB
from conftest import benchmark_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "prune_runs.py"
SHIPPED = REPO / "tuning_db" / "sm_90.db"
prune_script = benchmark_script("prune_runs")

FAMILY = "bwd.cf.bf16wbf16.w4"
ENTRY = "b8.d5120.l4096.bias.silu"  # a winner serving many grid calls around it


def _run(*argv):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, argv)], capture_output=True, text=True,
                          timeout=300)


def _split_shipped(folder: Path, *shape_keys: str) -> tuple[Path, Path]:
    """The shipped DB less FAMILY's winners of these shapes (before), and a run's DB that
    holds those winners alone."""
    before, run = folder / "before.db", folder / "run.db"
    these = f"family_key = ? AND shape_key IN ({', '.join('?' * len(shape_keys))})"
    for path, where in ((before, these), (run, f"NOT ({these})")):
        shutil.copyfile(SHIPPED, path)
        with closing(sqlite3.connect(path)) as con, con:
            con.execute(f"DELETE FROM winners WHERE {where}", (FAMILY, *shape_keys))
    return before, run


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    """The shipped DB less ENTRY (before), and a run's DB that holds ENTRY's winner alone."""
    before, run = _split_shipped(tmp_path_factory.mktemp("dbs"), ENTRY)
    with TuningDB(run, readonly=True) as db:
        assert [w["shape_key"] for w in db.winners()] == [ENTRY]
    return before, run


def _moves(before):
    """The calls the run's winner moves: before and the run merged are the shipped DB."""
    return prune_script.moves_between(before, SHIPPED, entries=True)


def _timings(path, moves, after_us, peer_us=None, fmt="moves", arch="sm_90"):
    """A timings file timing each move at 10 µs before and `after_us(move)` after."""
    rows = []
    for m in moves:
        if fmt == "moves":
            rows.append(dict(family=m.family_key, features=m.features, call=list(m.call), before_variant=m.before,
                             after_variant=m.after, before_us=10.0, after_us=after_us(m), peer_us=peer_us))
        else:  # bench_vs_peer.py: one kernel a row
            rows += [dict(family=m.family_key, features=m.features, call=list(m.call), variant=v, cc1d_us=us,
                          peer_us=peer_us) for v, us in ((m.before, 10.0), (m.after, after_us(m)))]
    path.write_text(json.dumps({"arch": arch, "rows": rows}))
    return path


@pytest.mark.parametrize("argv, message", [
    ([], "the following arguments are required: --before, --runs, --timings"),
    (["--before", "/nonexistent/a.db", "--runs", SHIPPED, "--timings", __file__], "--before: no such file"),
    (["--before", SHIPPED, "--runs", "/nonexistent/r.db", "--timings", __file__], "--runs: no such file"),
    (["--before", SHIPPED, "--runs", SHIPPED, "--timings", "/nonexistent/m.json"], "--timings: no such file"),
    (["--before", SHIPPED, "--runs", SHIPPED, "--timings", __file__, "--out-dir", REPO],
     f"--out-dir: expected a new folder, got '{REPO}', which exists"),
    (["--before", SHIPPED, "--runs", SHIPPED, "--timings", __file__, "--behind-out", __file__],
     f"--behind-out: expected a new file, got '{__file__}', which exists"),
    (["--before", SHIPPED, "--runs", SHIPPED, "--timings", __file__, "--behind-out", "/nonexistent/b.yaml"],
     "--behind-out: expected a new file, got '/nonexistent/b.yaml', which is in no folder"),
    (["--before", SHIPPED, "--runs", SHIPPED, "--timings", __file__, "--slowed-out", __file__],
     f"--slowed-out: expected a new file, got '{__file__}', which exists"),
    (["--before", SHIPPED, "--runs", SHIPPED, "--timings", __file__, "--slowed-out", "./new.yaml",
      "--behind-out", "new.yaml"], "--behind-out and --slowed-out: expected two files, got 'new.yaml' for both"),
])
def test_bad_options_are_refused(argv, message):
    res = _run(*argv)
    assert res.returncode == 2 and message in res.stderr, res.stderr


@pytest.mark.parametrize("text, why", [("not json", "JSONDecodeError"), ('{"arch": "sm_90", "calls": []}', "KeyError"),
                                       ('{"rows": []}', "KeyError: 'arch'"),
                                       ('{"arch": "sm_90", "rows": [{"family": "x"}]}', "KeyError")])
def test_a_timings_file_that_is_no_benchmarks_rows_is_named(tmp_path, dbs, text, why):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    res = _run("--before", dbs[0], "--runs", dbs[1], "--timings", bad)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"--timings: {bad} is not the JSON rows of bench_moves.py or bench_vs_peer.py ({why}" in res.stderr


@pytest.mark.parametrize("fmt", ["moves", "vs_peer"])
def test_every_moved_call_is_looked_up_in_either_benchmarks_rows(tmp_path, dbs, fmt):
    before, run = dbs
    moves = _moves(before)
    assert len(moves) > 4 and any(m.entry for m in moves)
    timed = moves[:-2]  # the last two left untimed
    arch, times = prune_script.load_timings([_timings(tmp_path / "t.json", timed, lambda m: 8.0, 9.0, fmt)])
    assert arch == "sm_90"
    rows = prune_script.assess(before, SHIPPED, times)
    assert {r["move"] for r in rows} == set(moves)
    for r in rows:
        was_timed = r["move"] in timed
        assert (r["before_us"], r["after_us"], r["peer_us"]) == ((10.0, 8.0, 9.0) if was_timed else (None,) * 3)


def test_a_winner_whose_moves_slowed_a_timed_call_is_left_out(tmp_path, dbs):
    before, run = dbs
    moves = _moves(before)
    victim = next(m for m in moves if not m.entry)
    timings = _timings(tmp_path / "t.json", moves, lambda m: 12.0 if m == victim else 8.0, peer_us=9.0)
    res = _run("--before", before, "--runs", run, "--timings", timings, "--out-dir", tmp_path / "out")
    assert res.returncode == 0, res.stderr
    assert "left out: 1 winner," in res.stdout
    assert f"{FAMILY} {ENTRY}: {victim.call} 10.0 -> 12.0 µs" in res.stdout
    with TuningDB(tmp_path / "out" / f"1-{run.name}", readonly=True) as db:
        assert db.winners() == []
    assert "| all | 0 (0) | 0 | - | 0 | 0 | 0 -> 0 (0) |" in res.stdout  # the pruned merge moves nothing


def test_a_winner_whose_timed_moves_are_faster_is_kept_and_summed(tmp_path, dbs):
    before, run = dbs
    moves = _moves(before)
    untimed = next(m for m in moves if not m.entry)
    timed = [m for m in moves if m != untimed]
    timings = _timings(tmp_path / "t.json", timed, lambda m: 5.0 if m.entry else 8.0, peer_us=9.0)
    res = _run("--before", before, "--runs", run, "--timings", timings, "--out-dir", tmp_path / "out")
    assert res.returncode == 0, res.stderr
    assert "left out: 0 winners," in res.stdout
    with TuningDB(tmp_path / "out" / f"1-{run.name}", readonly=True) as db:
        assert [w["shape_key"] for w in db.winners()] == [ENTRY]
    entries = sum(m.entry for m in moves)
    speeds = [2.0 if m.entry else 1.25 for m in timed]
    gm = statistics.geometric_mean(speeds)
    # 10 µs before, behind the peer's 9; after 8 or 5, ahead of it
    assert (f"| {FAMILY} | {len(moves)} ({entries}) | {len(timed)} | {gm:.2f}x (1.25-2.00x) | {len(timed)} | 0 | "
            f"{len(timed)} -> 0 ({len(timed)}) |") in res.stdout


def test_without_out_dir_the_slowed_calls_are_listed_and_nothing_is_written(tmp_path, dbs):
    before, run = dbs
    moves = _moves(before)
    victim = next(m for m in moves if not m.entry)
    timings = _timings(tmp_path / "t.json", moves, lambda m: 12.0 if m == victim else 8.0)
    res = _run("--before", before, "--runs", run, "--timings", timings)
    assert res.returncode == 0, res.stderr
    assert f"slowed: {FAMILY} {victim.call} 10.0 -> 12.0 µs (served by the {ENTRY} entry)" in res.stdout
    assert "left out" not in res.stdout and list(tmp_path.iterdir()) == [timings]


def test_timings_of_two_archs_are_refused(tmp_path, dbs):
    before, run = dbs
    moves = _moves(before)
    files = [_timings(tmp_path / f"{a}.json", moves, lambda m: 8.0, arch=a) for a in ("sm_90", "sm_80")]
    res = _run("--before", before, "--runs", run, "--timings", *files)
    assert res.returncode == 2 and "--timings: expected the files of one arch, got " in res.stderr, res.stderr
    assert f"{files[0]} sm_90, {files[1]} sm_80" in res.stderr


def test_behind_out_lists_the_timed_calls_slower_than_the_peer_after_the_merge_slowest_first(tmp_path, dbs):
    """Moved calls are judged by their kernel after (here 8 µs against a peer at 9 or 7), and
    a call that no winner moves by the kernel that still serves it (a sweep's row)."""
    from cc1d.tuner.moves import Move
    from cc1d.tuner.shapes import load_shapes
    from cc1d.tuner.serving import served_winner
    before, run = dbs
    moves = _moves(before)
    slow = {moves[0], moves[1]}  # the peer at 7 µs there: 8 after is 0.88x
    rows = [dict(family=m.family_key, features=m.features, call=list(m.call), before_variant=m.before,
                 after_variant=m.after, before_us=10.0, after_us=8.0 if m != moves[1] else 8.8,
                 peer_us=7.0 if m in slow else 9.0) for m in moves]
    kept = Move("sm_90", "fwd.cf.bf16wbf16.w4", "bias,silu", (8, 5120, 2048), None, "")  # an entry no run moves
    with TuningDB(SHIPPED, readonly=True) as db:
        served = served_winner(db, "sm_90", kept.shape)["variant_key"]
    rows.append(dict(family=kept.family_key, features=kept.features, call=list(kept.call), variant=served,
                     cc1d_us=20.0, peer_us=10.0))
    timings = tmp_path / "t.json"
    timings.write_text(json.dumps({"arch": "sm_90", "rows": rows}))
    out = tmp_path / "behind.yaml"
    res = _run("--before", before, "--runs", run, "--timings", timings, "--behind-out", out)
    assert res.returncode == 0, res.stderr
    assert f"3 timed calls behind the peer by more than 3 % written to {out}" in res.stdout
    lines = [ln for ln in out.read_text().splitlines() if ln.startswith("  - ")]
    assert [ln.rsplit("# ", 1)[1] for ln in lines] == ["0.50x", "0.80x", "0.88x"]
    assert [(s.op, s.layout, s.batch, s.dim, s.seqlen) for s in load_shapes(out)] == \
        [("fwd", "cf", 8, 5120, 2048), *((m.shape.op, m.shape.layout, *m.call) for m in (moves[1], moves[0]))]


def test_a_call_no_winner_served_before_is_timed_under_the_familys_default(tmp_path):
    """bench_moves.py names no variant before where the family had no winner: the call ran
    the catalog's default, and its time counts as the default's."""
    from cc1d.generator import default_variant
    from cc1d.tuner.db import family_from_key
    family = "fwd.cl.f16wf16.w4"
    default = default_variant(family_from_key(family)).key()
    assert prune_script.kernel_key(family, None) == default
    assert prune_script.kernel_key(family, "some.variant") == "some.variant"
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"arch": "sm_90", "rows": [
        dict(family=family, features="bias,silu", call=[16, 5120, 128], before_variant=None, after_variant="v",
             before_us=16.0, after_us=15.0, peer_us=None)]}))
    _, times = prune_script.load_timings([path])
    assert times[(family, "bias,silu", (16, 5120, 128))] == {default: [16.0], "v": [15.0]}


def _guard_log(path, checks):
    """A tune.log whose guard round timed `checks` ((move, before µs, after µs)), as the tuner
    prints them (tuner/guard.py Check.describe), among the other lines a run writes."""
    from cc1d.tuner.guard import Check
    lines = [f"guard round 1: the run's winners move {len(checks)} untuned calls in x.db; timing {len(checks)}"]
    lines += ["  " + Check(m, before, after).describe() for m, before, after in checks]
    lines += ["guard round 1: tuning 1 slowed calls as shapes of their own: (1, 2, 3)",
              "family               shape                      winner config              time us  % copy"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_guard_log_lines_count_as_timings_of_both_kernels(tmp_path, dbs):
    """A guard round's line gives the call's time under the variant that served it and under
    the new one; a call no winner served before ("(catalog)") or a failing one gives none."""
    from dataclasses import replace
    before, _ = dbs
    moves = [m for m in _moves(before) if not m.entry and m.before is not None]
    a, b, c = moves[:3]
    log = _guard_log(tmp_path / "tune.log", [(a, 10.0, 12.5), (replace(b, before=None), None, 9.0), (c, 10.0, None)])
    times = defaultdict(lambda: defaultdict(list))
    assert prune_script.load_guard_logs([log], times) == 1
    assert dict(times) == {(a.family_key, a.features, a.call): {a.before: [10.0], a.after: [12.5]}}


def test_a_winner_that_slowed_a_call_only_the_guard_timed_is_left_out_with_guard_logs(tmp_path, dbs):
    before, run = dbs
    moves = _moves(before)
    victim = next(m for m in moves if not m.entry and m.before is not None)
    timings = _timings(tmp_path / "t.json", [m for m in moves if m != victim], lambda m: 8.0)
    log = _guard_log(tmp_path / "tune.log", [(victim, 10.0, 12.0)])
    res = _run("--before", before, "--runs", run, "--timings", timings, "--out-dir", tmp_path / "without")
    assert res.returncode == 0 and "left out: 0 winners," in res.stdout, res.stdout + res.stderr
    res = _run("--before", before, "--runs", run, "--timings", timings, "--guard-logs", log,
               "--out-dir", tmp_path / "with")
    assert res.returncode == 0, res.stderr
    assert "timings from 1 files, and 1 calls from 1 guard logs" in res.stdout
    assert "left out: 1 winner," in res.stdout and f"{FAMILY} {ENTRY}: {victim.call} 10.0 -> 12.0 µs" in res.stdout
    with TuningDB(tmp_path / "with" / f"1-{run.name}", readonly=True) as db:
        assert db.winners() == []
    res = _run("--before", before, "--runs", run, "--timings", timings, "--guard-logs", tmp_path / "none.log")
    assert res.returncode == 2 and "--guard-logs: no such file" in res.stderr, res.stderr


def test_rows_whose_kernels_the_runtime_named_otherwise_give_no_times(tmp_path, dbs):
    """bench_moves.py marks a row labels_hold false where the runtime launched other kernels
    than the row names: its times belong to those, so they count for none."""
    before, _ = dbs
    moves = [m for m in _moves(before) if m.before is not None][:2]
    path = _timings(tmp_path / "t.json", moves, lambda m: 8.0)
    doc = json.loads(path.read_text())
    doc["rows"][0]["labels_hold"] = False
    doc["rows"][1]["labels_hold"] = True
    path.write_text(json.dumps(doc))
    _, times = prune_script.load_timings([path])
    assert (moves[0].family_key, moves[0].features, moves[0].call) not in times
    assert times[(moves[1].family_key, moves[1].features, moves[1].call)] == {moves[1].before: [10.0],
                                                                              moves[1].after: [8.0]}


def _slowed_entries(path):
    """The shapes file's entries as (shape, trailing comment)."""
    from cc1d.tuner.shapes import load_shapes
    comments = [ln.split("  # ", 1)[1] for ln in path.read_text().splitlines() if ln.startswith("  - ")]
    return list(zip(load_shapes(path), comments))


@pytest.mark.parametrize("prune", [True, False])
def test_slowed_out_writes_the_slowed_calls_as_shapes_to_tune_with_their_kernel_before(tmp_path, dbs, prune):
    """With --out-dir the calls that left a winner out, else the merge's slowed calls: the
    same here, where one winner slowed one call."""
    before, run = dbs
    moves = _moves(before)
    victim = next(m for m in moves if not m.entry and m.before is not None)
    timings = _timings(tmp_path / "t.json", moves, lambda m: 12.0 if m == victim else 8.0)
    out = tmp_path / "slowed.yaml"
    res = _run("--before", before, "--runs", run, "--timings", timings, "--slowed-out", out,
               *(["--out-dir", tmp_path / "out"] if prune else []))
    assert res.returncode == 0, res.stderr
    assert f"1 slowed call written to {out}" in res.stdout
    [(shape, comment)] = _slowed_entries(out)
    assert shape == victim.shape and shape.op == "bwd" and shape.bias and shape.activation == "silu"
    assert comment == f"{victim.before} 10.0 -> 12.0 µs (the {ENTRY} entry's)"


def test_no_shapes_file_is_written_where_it_would_list_no_call(tmp_path, dbs):
    """A shapes file lists at least one shape (cc1d-tune refuses an empty one): the output says
    why there is none. Here every timed move is faster and ahead of the peer."""
    before, run = dbs
    timings = _timings(tmp_path / "t.json", _moves(before), lambda m: 8.0, peer_us=9.0)
    slowed_out, behind_out = tmp_path / "slowed.yaml", tmp_path / "behind.yaml"
    res = _run("--before", before, "--runs", run, "--timings", timings, "--slowed-out", slowed_out,
               "--behind-out", behind_out)
    assert res.returncode == 0, res.stderr
    assert f"no call slowed: {slowed_out} not written" in res.stdout
    assert f"no timed call behind the peer: {behind_out} not written" in res.stdout
    assert not slowed_out.exists() and not behind_out.exists()


def test_a_call_two_winners_slowed_is_listed_once_with_its_first_times(tmp_path, dbs):
    before, _ = dbs
    a, b = [m for m in _moves(before) if not m.entry][:2]
    rows = [dict(move=a, before_us=10.0, after_us=12.0), dict(move=b, before_us=5.0, after_us=6.0),
            dict(move=a, before_us=10.0, after_us=13.0)]
    out = tmp_path / "slowed.yaml"
    assert prune_script.write_slowed(out, rows, "header") == 2
    assert [(s, c.split(" (")[0]) for s, c in _slowed_entries(out)] == \
        [(a.shape, f"{prune_script.kernel_key(a.family_key, a.before)} 10.0 -> 12.0 µs"),
         (b.shape, f"{prune_script.kernel_key(b.family_key, b.before)} 5.0 -> 6.0 µs")]


def test_moves_no_timing_covers_are_listed_as_untimed(tmp_path, dbs):
    """The summary counts them; each gets a line of its own, and the output says to time them
    (without --out-dir nothing is pruned, so none is the pruning's)."""
    before, run = dbs
    moves = _moves(before)
    timings = _timings(tmp_path / "t.json", moves[:-2], lambda m: 8.0)
    res = _run("--before", before, "--runs", run, "--timings", timings)
    assert res.returncode == 0, res.stderr
    untimed = [ln for ln in res.stdout.splitlines() if ln.startswith("untimed: ")]
    assert len(untimed) == 2 and all(f"(the {ENTRY} entry's)" in ln for ln in untimed)
    for m in moves[-2:]:
        assert any(ln.startswith(f"untimed: {FAMILY} {m.call} ") for ln in untimed), (m, untimed)
    assert "a move the pruning made" not in res.stdout
    assert f"2 moved calls not timed under both kernels: time them before shipping (benchmarks/bench_moves.py " \
           f"--before {before}" in res.stdout


NEIGHBOUR = "b8.d5120.l3000.bias.silu"  # a winner near ENTRY that serves some of its calls once ENTRY is gone


def test_a_move_the_pruning_made_is_named(tmp_path):
    """Leaving a winner out hands its calls to the nearest other entry: a kernel no run timed
    there (session 80's (4, 2048, 1000), 0.86x after the prune). Such calls are listed as
    untimed and marked as the pruning's moves."""
    before, run = _split_shipped(tmp_path, ENTRY, NEIGHBOUR)
    unpruned = prune_script.moves_between(before, prune_script.merged(before, [run], set(), tmp_path), entries=True)
    pruned = prune_script.moves_between(before, prune_script.merged(before, [run], {("sm_90", FAMILY, ENTRY)},
                                                                     tmp_path), entries=True)
    made = [m for m in pruned if m not in set(unpruned)]
    assert made and all(m.after_shape == NEIGHBOUR for m in made)
    victim = next(m for m in unpruned if m.after_shape == ENTRY and not m.entry and m.before is not None)
    timings = _timings(tmp_path / "t.json", unpruned, lambda m: 12.0 if m == victim else 8.0)
    res = _run("--before", before, "--runs", run, "--timings", timings, "--out-dir", tmp_path / "out")
    assert res.returncode == 0, res.stderr
    assert "left out: 1 winner," in res.stdout and f"{FAMILY} {ENTRY}: {victim.call}" in res.stdout
    tagged = [ln for ln in res.stdout.splitlines() if ln.endswith("(a move the pruning made)")]
    assert len(tagged) == len(made)
    for m in made:
        assert any(f"untimed: {FAMILY} {m.call} " in ln and f"(the {NEIGHBOUR} entry's)" in ln for ln in tagged)


def test_a_call_a_timings_file_timed_keeps_its_times_over_a_guards(tmp_path, dbs):
    """A guard times in the tuner's runs, another regime than the moves benchmark's and the
    peer's (which only the files hold): where a file timed the call, its times alone count,
    so the guard's slower after-time does not put the call behind the peer."""
    before, run = dbs
    moves = _moves(before)
    victim = next(m for m in moves if not m.entry and m.before is not None)
    timings = _timings(tmp_path / "t.json", moves, lambda m: 8.0, peer_us=9.0)
    log = _guard_log(tmp_path / "tune.log", [(victim, 10.0, 12.0)])
    res = _run("--before", before, "--runs", run, "--timings", timings, "--guard-logs", log)
    assert res.returncode == 0, res.stderr
    assert "and 1 calls from 1 guard logs (0 timed in no timings file: only those count)" in res.stdout
    n = len(moves)
    all_line = next(line for line in res.stdout.splitlines() if line.startswith("| all |"))
    # before 10 µs against the peer's 9 (behind), after 8 (ahead); a median with the guard's
    # 12 would have put the victim's after-time at 10, behind the peer
    assert all_line.endswith(f"| {n} -> 0 ({n}) |"), all_line
