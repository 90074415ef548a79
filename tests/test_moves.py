"""tuner/moves.py: which untuned calls a change of the winners hands to another kernel,
and `cc1d-tune db merge` saying so. Built from two real shipped backward winners: the
(2, 4096, 2048) one, and the (4, 4096, 8192) one added beside it (the backward's distance
counts seqlen twice and batch apart, so calls of A's seqlen stay with A whatever their batch)."""
from __future__ import annotations

from pathlib import Path

import pytest

from cc1d.tuner.cli import main
from cc1d.tuner.db import TuningDB
from cc1d.tuner.moves import (GRID_BATCHES, GRID_LENGTHS, Move, changed_entries, describe, moved_calls,
                              round_robin, snapshot)

SHIPPED = Path(__file__).resolve().parents[1] / "tuning_db" / "sm_90.db"
FAMILY = "bwd.cf.bf16wbf16.w4"
A, B = "b2.d4096.l2048.bias.silu", "b4.d4096.l8192.bias.silu"


@pytest.fixture(scope="module")
def shipped_rows():
    with TuningDB(SHIPPED, readonly=True) as db:
        rows = {k: db.winner("sm_90", FAMILY, k) for k in (A, B)}
        sources = {k: db.source(r["source_hash"]) for k, r in rows.items()}
    assert rows[A]["variant_key"] != rows[B]["variant_key"]
    return rows, sources


def _db(path, shipped_rows, keys):
    rows, sources = shipped_rows
    with TuningDB(path) as db:
        for k in keys:
            db.put_winner(sources[k], **{c: v for c, v in rows[k].items() if c != "source_hash"})
    return path


@pytest.fixture
def a_then_ab(tmp_path, shipped_rows):
    """Snapshots of a DB holding the A winner, then A and B."""
    with TuningDB(_db(tmp_path / "a.db", shipped_rows, [A])) as db:
        before = snapshot(db)
    with TuningDB(_db(tmp_path / "ab.db", shipped_rows, [A, B])) as db:
        after = snapshot(db)
    return before, after


def test_a_new_winner_takes_the_calls_nearest_to_it(a_then_ab, shipped_rows):
    rows, _ = shipped_rows
    before, after = a_then_ab
    moves = moved_calls(before, after)
    va, vb = rows[A]["variant_key"], rows[B]["variant_key"]
    assert Move("sm_90", FAMILY, "bias,silu", (16, 4096, 4096), va, vb) in moves  # 4 ln 2 from B, 5 from A
    assert Move("sm_90", FAMILY, "bias,silu", (1, 4096, 16384), va, vb) in moves
    calls = {m.call for m in moves}
    assert (2, 4096, 2048) not in calls and (4, 4096, 8192) not in calls  # tuned shapes are their own
    assert (1, 4096, 2048) not in calls and (2, 4096, 1000) not in calls  # still nearest to A
    assert (16, 4096, 2048) not in calls and (1, 4096, 4096) not in calls  # B's work, A's seqlen or nearer
    assert all((m.before, m.after, m.after_shape) == (va, vb, B) for m in moves)  # B's winner serves them
    assert moved_calls(after, after) == []  # nothing changed, nothing moved


def test_a_new_entry_is_listed_with_what_served_its_call_before(a_then_ab, shipped_rows):
    rows, _ = shipped_rows
    before, after = a_then_ab
    va, vb = rows[A]["variant_key"], rows[B]["variant_key"]
    assert changed_entries(before, after) == [Move("sm_90", FAMILY, "bias,silu", (4, 4096, 8192), va, vb, entry=True)]
    assert changed_entries(before, after)[0].after_shape == B  # its own winner serves it
    assert changed_entries(after, after) == []  # the same winners: nothing changed
    first = changed_entries({}, after)  # a new family: both entries, from the catalog's default
    assert [(m.call, m.before, m.entry) for m in first] == [((2, 4096, 2048), None, True), ((4, 4096, 8192), None, True)]


def test_a_new_family_moves_its_calls_from_the_catalog_default(tmp_path, shipped_rows):
    with TuningDB(_db(tmp_path / "a.db", shipped_rows, [A])) as db:
        moves = moved_calls({}, snapshot(db))
    assert len(moves) == len(GRID_BATCHES) * len(GRID_LENGTHS) - 1  # one dim; (2, 4096, 2048) is tuned
    assert {m.before for m in moves} == {None}
    assert describe(moves)[1].startswith(f"  sm_90 {FAMILY} (bias,silu): {len(moves)}, e.g. (1, 4096, 128) "
                                         f"the catalog's default -> ")


def test_describe_counts_each_family_and_shows_a_few_calls():
    moves = [Move("sm_90", FAMILY, "bias,silu", (b, 64, 512), f"{FAMILY}.x", f"{FAMILY}.y") for b in (1, 2, 4, 8)]
    lines = describe(moves, examples=2)
    assert lines[0].startswith("the new winners take 4 untuned calls of a grid (batch 1-16, the tuned dims, "
                               "seqlen 128-16384)")
    assert lines[1] == f"  sm_90 {FAMILY} (bias,silu): 4, e.g. (1, 64, 512) x -> y; (2, 64, 512) x -> y"
    assert describe([]) == []


def test_db_merge_prints_the_calls_it_moved(tmp_path, shipped_rows, capsys):
    dest = _db(tmp_path / "dest.db", shipped_rows, [A])
    new = _db(tmp_path / "new.db", shipped_rows, [B])
    with TuningDB(dest) as db:
        before = snapshot(db)
    with TuningDB(_db(tmp_path / "ab.db", shipped_rows, [A, B])) as db:
        n = len(moved_calls(before, snapshot(db)))
    assert main(["db", "merge", "--db", str(dest), str(new)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("merged 1 winners") and n > 0
    assert lines[1].startswith(f"the new winners take {n} untuned calls of a grid")
    assert lines[2].startswith(f"  sm_90 {FAMILY} (bias,silu): {n}, e.g. ")
    assert main(["db", "merge", "--db", str(dest), str(new)]) == 0  # the same again: nothing moves
    out = capsys.readouterr().out
    assert "merged 0 winners" in out and "the new winners take" not in out


def test_db_drop_deletes_one_winner_and_prints_the_calls_it_gives_back(tmp_path, shipped_rows, capsys):
    path = _db(tmp_path / "ab.db", shipped_rows, [A, B])
    with TuningDB(path) as db:
        with_b = snapshot(db)
    with TuningDB(_db(tmp_path / "a.db", shipped_rows, [A])) as db:
        n = len(moved_calls(with_b, snapshot(db)))
    assert main(["db", "drop", "--db", str(path), "--family", FAMILY, "--shape", B]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"dropped sm_90 {FAMILY} {B} ({shipped_rows[0][B]['variant_key']}) from {path}")
    assert lines[1].startswith(f"dropping it moves {n} untuned calls of a grid") and n > 0
    with TuningDB(path, readonly=True) as db:
        assert [r["shape_key"] for r in db.winners()] == [A]
    # a second time: nothing to drop, and the DB says what it holds
    assert main(["db", "drop", "--db", str(path), "--family", FAMILY, "--shape", B, "--arch", "sm_90"]) == 2
    assert f"no winner of {FAMILY} at {B} on sm_90; its 1 shapes of {FAMILY} on sm_90 include {A}" in \
        capsys.readouterr().err


def test_db_drop_needs_the_arch_where_two_hold_the_shape(tmp_path, shipped_rows, capsys):
    rows, sources = shipped_rows
    path = _db(tmp_path / "a.db", shipped_rows, [A])
    with TuningDB(path) as db:
        db.put_winner(sources[A], **{**{c: v for c, v in rows[A].items() if c != "source_hash"}, "arch": "sm_100"})
    assert main(["db", "drop", "--db", str(path), "--family", FAMILY, "--shape", A]) == 2
    err = capsys.readouterr().err
    assert f"drop: {FAMILY} {A} is held for sm_100, sm_90 in {path}: name one with --arch" in err, err
    assert main(["db", "drop", "--db", str(path), "--family", FAMILY, "--shape", A, "--arch", "sm_100"]) == 0
    with TuningDB(path, readonly=True) as db:
        assert [r["arch"] for r in db.winners()] == ["sm_90"]
    assert f"holds no other winner of {FAMILY} on sm_100: its calls take the next DB's winners" in \
        capsys.readouterr().out


def _m(family, n, arch="sm_90"):
    return Move(arch, family, "bias,silu", (1, 64, n), "a", "b")


def test_round_robin_takes_each_family_in_turn_and_keeps_the_rest_in_order():
    moves = [_m("fwd.cf.x", n) for n in range(5)] + [_m("bwd.cf.y", 9)] + [_m("fwd.cl.z", n) for n in range(3)]
    taken, rest = round_robin(moves, 6)
    assert [(m.family_key, m.call[2]) for m in taken] == [
        ("bwd.cf.y", 9), ("fwd.cf.x", 0), ("fwd.cl.z", 0), ("fwd.cf.x", 1), ("fwd.cl.z", 1), ("fwd.cf.x", 2)]
    assert rest == [_m("fwd.cf.x", 3), _m("fwd.cf.x", 4), _m("fwd.cl.z", 2)]
    every, none = round_robin(moves, 100)
    assert sorted(every, key=moves.index) == moves and none == []
    assert round_robin(moves, 0) == ([], moves)
    # another arch's family is a family of its own
    assert [m.arch for m in round_robin([_m("f", 1), _m("f", 2), _m("f", 3, "gfx942")], 2)[0]] == ["gfx942", "sm_90"]
