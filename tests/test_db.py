"""The tuning DB: schema, refusal rules, concurrent writers, atomic winners,
export/import/merge round trip, validation of every entry."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import pytest

from cc1d.generator import EPOCH, default_variant, families
from cc1d.tuner.db import SCHEMA_VERSION, DBError, TuningDB, family_from_key, sha256

FAM = families("fwd", "cf")[0]


def winner_row(variant, shape_key="b1.d64.l128.bias.silu", arch="sm_90", time_us=10.0):
    return dict(arch=arch, family_key=variant.family.key(), shape_key=shape_key, op="fwd", batch=1, dim=64,
                seqlen=128, features="bias,silu", variant_key=variant.key(), config=variant.params,
                source_hash=variant.hash(), **variant.geometry(), time_us=time_us, default_us=12.0,
                copy_fraction=0.8, spread=0.01, speedup=1.2, environment={"device": "fake"})


def put(db, variant, **kw):
    db.put_winner(variant.source, **winner_row(variant, **kw))


def test_schema_and_meta(tmp_path):
    with TuningDB(tmp_path / "t.db") as db:
        assert db.meta() == {"schema_version": str(SCHEMA_VERSION), "generator_epoch": str(EPOCH)}
        assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in db.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"meta", "sources", "trials", "winners"} <= tables
    with TuningDB(tmp_path / "t.db") as db:  # reopening keeps it
        assert db.meta()["schema_version"] == str(SCHEMA_VERSION)


def test_adopt_timing_method_starts_a_method_apart_from_older_trials(tmp_path, caplog):
    """A DB records the timing method of its trials: a fresh one (or one without trials)
    counts all its trials as the method's; switching, or a DB from before methods were
    recorded that holds trials, starts the method now and says so."""
    trial = dict(run_id="r", arch="sm_90", family_key=FAM.key(), shape_key="b1.d64.l128", variant_key="k",
                 config={}, status="ok", time_us=1.0)
    with TuningDB(tmp_path / "t.db") as db:
        assert db.adopt_timing_method(1) == "" and db.adopt_timing_method(1) == ""
        db.add_trial(**trial)
        assert db.adopt_timing_method(1) == ""  # the same method: its trials stay its own
        assert db.meta()["timing_method"] == "1"
        since = db.adopt_timing_method(2)
        assert since >= db.trials("sm_90", FAM.key(), "b1.d64.l128")[0]["created_at"]
        assert db.meta()["timing_method"] == "2" and db.adopt_timing_method(2) == since
        assert "timed by timing method 1" in caplog.text
    with TuningDB(tmp_path / "old.db") as db:  # trials stored by a cc1d that recorded no method
        db.add_trial(**trial)
        db.conn.execute("DELETE FROM meta WHERE key LIKE 'timing_method%'")
        db.conn.commit()
        assert db.adopt_timing_method(1) != ""
        assert "a cc1d that recorded no timing method" in caplog.text


def test_refuses_newer_schema(tmp_path):
    TuningDB(tmp_path / "t.db").close()
    con = sqlite3.connect(tmp_path / "t.db")
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    con.commit()
    con.close()
    with pytest.raises(DBError, match="newer than this cc1d's"):
        TuningDB(tmp_path / "t.db")


def test_refuses_corrupt_db(tmp_path):
    path = tmp_path / "t.db"
    path.write_bytes(b"SQLite format 3\x00" + b"\x07" * 4000)
    with pytest.raises(DBError, match="(integrity_check|not a readable SQLite DB)"):
        TuningDB(path)


def test_missing_db_when_not_creating(tmp_path):
    with pytest.raises(DBError, match="does not exist"):
        TuningDB(tmp_path / "no.db", create=False)


def test_family_key_round_trip():
    for fam in families():
        assert family_from_key(fam.key()) == fam
    with pytest.raises(ValueError, match="family key"):
        family_from_key("fwd.cf")


def test_winner_and_trial_writes(tmp_path):
    v = default_variant(FAM)
    with TuningDB(tmp_path / "t.db") as db:
        put(db, v)
        w = db.winner("sm_90", FAM.key(), "b1.d64.l128.bias.silu")
        assert w["variant_key"] == v.key() and json.loads(w["config"]) == v.params
        assert db.source(w["source_hash"]) == v.source
        db.add_trial(run_id="r", arch="sm_90", family_key=FAM.key(), shape_key="s", variant_key=v.key(),
                     config=v.params, status="compile_error", error="boom")
        assert db.trials("sm_90", FAM.key(), "s")[0]["error"] == "boom"
        with pytest.raises(ValueError, match="status"):
            db.add_trial(run_id="r", arch="a", family_key="f", shape_key="s", variant_key="v", config={},
                         status="weird")
        with pytest.raises(ValueError, match="does not match its hash"):
            db.put_winner("tampered", **winner_row(v))


WRITER = r"""
import sys
import time
from cc1d.generator import default_variant, families
from cc1d.tuner.db import TuningDB
path, k, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
v = default_variant(families("fwd", "cf")[0])
with TuningDB(path) as db:
    for i in range(n):
        db.add_trial(run_id=f"p{k}", arch="sm_90", family_key=v.family.key(), shape_key=f"s{i}",
                     variant_key=v.key(), config=v.params, status="ok", time_us=float(i))
        db.put_winner(v.source, arch="sm_90", family_key=v.family.key(), shape_key=f"p{k}.s{i}", op="fwd",
                      batch=1, dim=64, seqlen=128, features="", variant_key=v.key(), config=v.params,
                      **v.geometry(), time_us=1.0, environment={})
"""


def test_concurrent_writers_from_several_processes(tmp_path):
    path = tmp_path / "t.db"
    TuningDB(path).close()
    procs = [subprocess.Popen([sys.executable, "-P", "-c", WRITER, str(path), str(k), "40"], stderr=subprocess.PIPE)
             for k in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    with TuningDB(path) as db:
        assert db.conn.execute("SELECT count(*) FROM trials").fetchone()[0] == 160
        assert len(db.winners()) == 160
        assert db.validate() == []


OPENER = r"""
import sys, time
from cc1d.tuner.db import TuningDB
folder, start, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
for r in range(rounds):  # every process opens the same fresh DB at the same moment, round after round
    while time.time() < start + 0.15 * r:
        pass
    TuningDB(f"{folder}/r{r}.db").close()
"""


def test_several_processes_creating_one_db_at_once(tmp_path):
    # Both switch the new file to WAL at once; SQLite answers one of them "database is
    # locked" without waiting. Before the retry this failed about one round in four.
    start = time.time() + 1.5  # after every interpreter has started
    procs = [subprocess.Popen([sys.executable, "-P", "-c", OPENER, str(tmp_path), str(start), "16"],
                              stderr=subprocess.PIPE) for _ in range(6)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    for r in range(16):
        with TuningDB(tmp_path / f"r{r}.db") as db:
            assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert db.meta()["schema_version"] == str(SCHEMA_VERSION)

KILL_MID_WINNER = r"""
import os, signal, sys
from cc1d.generator import default_variant, families
from cc1d.tuner.db import TuningDB
v = default_variant(families("fwd", "cf")[0])
db = TuningDB(sys.argv[1])
with db.transaction():
    db.conn.execute("INSERT OR IGNORE INTO sources VALUES (?, ?)", (v.hash(), v.source))
    os.kill(os.getpid(), signal.SIGKILL)  # dies between the source and the winner row
"""


def test_kill_mid_transaction_leaves_nothing(tmp_path):
    path = tmp_path / "t.db"
    TuningDB(path).close()
    proc = subprocess.run([sys.executable, "-P", "-c", KILL_MID_WINNER, str(path)], capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()
    with TuningDB(path) as db:
        assert db.conn.execute("SELECT count(*) FROM sources").fetchone()[0] == 0
        assert db.winners() == []


def _filled(path):
    db = TuningDB(path)
    for i, v in enumerate([default_variant(FAM), default_variant(families("fwd", "cl")[3])]):
        put(db, v, shape_key=f"b{i}.d64.l128.bias.silu", time_us=10.0 + i)
        db.add_trial(run_id="r", arch="sm_90", family_key=v.family.key(), shape_key=f"b{i}", variant_key=v.key(),
                     config=v.params, status="ok", time_us=1.0, created_at="2024-01-01T00:00:00Z")
    return db


def test_export_import_round_trip_is_identical_text(tmp_path):
    with _filled(tmp_path / "a.db") as a:
        lines = list(a.export_lines(with_trials=True))
    assert lines == sorted(lines, key=lambda l: ["meta", "winner", "source", "trial"].index(
        json.loads(l)["kind"])) and all("\n" not in l for l in lines)
    with TuningDB(tmp_path / "b.db") as b:
        assert b.import_lines(lines) == 2
        again = list(b.export_lines(with_trials=True))
    assert again == lines


def test_import_rejects_bad_lines(tmp_path):
    with TuningDB(tmp_path / "b.db") as b:
        with pytest.raises(DBError, match="import line 1"):
            b.import_lines(["not json"])
        with pytest.raises(DBError, match="has no source line"):
            v = default_variant(FAM)
            b.import_lines([json.dumps({"kind": "winner", **winner_row(v), "config": "{}",
                                        "environment": "{}", "created_at": "x", "epoch": EPOCH})])


def test_merge_keeps_the_faster_winner(tmp_path):
    v = default_variant(FAM)
    other = default_variant(FAM, threads=256)
    with TuningDB(tmp_path / "a.db") as a, TuningDB(tmp_path / "b.db") as b:
        put(a, v, shape_key="s1", time_us=10.0)
        put(b, other, shape_key="s1", time_us=8.0)   # faster: replaces
        put(b, other, shape_key="s2", time_us=50.0)  # new: added
        put(a, v, shape_key="s3", time_us=5.0)
        put(b, other, shape_key="s3", time_us=6.0)   # slower: kept out
        assert a.merge_from(b) == 2
        got = {w["shape_key"]: (w["variant_key"], w["time_us"]) for w in a.winners()}
    assert got == {"s1": (other.key(), 8.0), "s2": (other.key(), 50.0), "s3": (v.key(), 5.0)}


def test_merge_replace_takes_every_winner_and_unused_sources_go(tmp_path):
    v = default_variant(FAM)
    other = default_variant(FAM, threads=256)
    with TuningDB(tmp_path / "a.db") as a, TuningDB(tmp_path / "b.db") as b:
        put(a, v, shape_key="s1", time_us=5.0)
        put(a, v, shape_key="s2", time_us=7.0)
        put(b, other, shape_key="s1", time_us=6.0)   # slower, taken anyway
        put(b, other, shape_key="s2", time_us=8.0)
        assert a.merge_from(b, replace=True) == 2
        got = {w["shape_key"]: (w["variant_key"], w["time_us"]) for w in a.winners()}
        assert got == {"s1": (other.key(), 6.0), "s2": (other.key(), 8.0)}
        assert a.source(v.hash()) is not None       # left behind by the replaced winners
        assert a.drop_unused_sources() == 1
        assert a.source(v.hash()) is None and a.source(other.hash()) == other.source
        assert a.drop_unused_sources() == 0 and a.validate() == []


def test_validate_catches_tampering(tmp_path):
    with _filled(tmp_path / "a.db") as db:
        assert db.validate() == []
        h = db.winners()[0]["source_hash"]
        db.conn.execute("UPDATE sources SET source = source || '// evil' WHERE hash = ?", (h,))
        db.conn.execute("UPDATE winners SET epoch = ? WHERE shape_key LIKE 'b1.%'", (EPOCH + 1,))
        problems = db.validate()
    assert any("does not match its hash" in p for p in problems), problems
    assert any("re-rendering" in p for p in problems), problems
    assert any(f"generator epoch {EPOCH + 1}" in p for p in problems), problems


def test_validate_catches_a_consistently_forged_source(tmp_path):
    """Source and hash both changed: only the re-render check sees it."""
    v = default_variant(FAM)
    forged = v.source + "\n// extra\n"
    with TuningDB(tmp_path / "a.db") as db:
        db.put_winner(forged, **{**winner_row(v), "source_hash": sha256(forged)})
        problems = db.validate()
    assert len(problems) == 1 and "re-rendering" in problems[0]


# ---- read-only use and finalizing for shipping ------------------------------------

def _journal_mode(path) -> str:
    con = sqlite3.connect(path)
    try:
        return con.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        con.close()


def test_finalize_makes_one_self_contained_file(tmp_path):
    path = tmp_path / "ship.db"
    with _filled(path) as db:
        assert (tmp_path / "ship.db-wal").exists()
        db.finalize()
        assert db.validate() == []
    assert _journal_mode(path) == "delete"
    assert not (tmp_path / "ship.db-wal").exists() and not (tmp_path / "ship.db-shm").exists()
    with TuningDB(path, readonly=True) as db:  # readers leave it as it is
        assert len(db.winners()) == 2 and db.validate() == []
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            db.conn.execute("DELETE FROM winners")
    assert _journal_mode(path) == "delete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ship.db"]


def test_finalize_refuses_while_another_connection_is_open(tmp_path):
    path = tmp_path / "busy.db"
    with _filled(path) as db, TuningDB(path) as other:
        other.winners()
        with pytest.raises(DBError, match="journal_mode=DELETE"):
            db.finalize()


def test_copy_to_holds_what_the_wal_still_holds(tmp_path):
    """A commit of a connection still open lives in the -wal file: a file copy misses it,
    copy_to does not, and its copy is one file in rollback-journal mode."""
    path = tmp_path / "live.db"
    with _filled(path) as db:
        db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the file holds both winners
        db.conn.execute("DELETE FROM winners WHERE shape_key = 'b1.d64.l128.bias.silu'")
        assert (tmp_path / "live.db-wal").exists()
        plain = tmp_path / "plain.db"
        plain.write_bytes(path.read_bytes())
        with TuningDB(path, readonly=True) as reader:
            copy = reader.copy_to(tmp_path / "copy.db")
            with pytest.raises(DBError, match="copy.db: it exists"):
                reader.copy_to(copy)
            with pytest.raises(DBError, match=r"cannot copy tuning DB .*live.db to .*nowhere/x.db \(unable to open"):
                reader.copy_to(tmp_path / "nowhere" / "x.db")
    with TuningDB(plain, readonly=True) as stale, TuningDB(copy, readonly=True) as fresh:
        assert len(stale.winners()) == 2  # the file alone: the delete is not in it
        assert [w["shape_key"] for w in fresh.winners()] == ["b0.d64.l128.bias.silu"]
        assert fresh.validate() == []
    assert _journal_mode(copy) == "delete" and not (tmp_path / "copy.db-wal").exists()


def test_readonly_refusals(tmp_path):
    with pytest.raises(DBError, match="does not exist"):
        TuningDB(tmp_path / "none.db", readonly=True)
    con = sqlite3.connect(tmp_path / "other.db")
    con.execute("CREATE TABLE t (a)")
    con.commit()
    con.close()
    with pytest.raises(DBError, match=r"lacks the tables \['meta', 'sources', 'winners'\]"):
        TuningDB(tmp_path / "other.db", readonly=True)
    with _filled(tmp_path / "a.db") as db:
        db.conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(DBError, match="newer than this cc1d's"):
        TuningDB(tmp_path / "a.db", readonly=True)
    with _filled(tmp_path / "b.db") as db, pytest.raises(DBError, match="read-only"):
        TuningDB(tmp_path / "b.db", readonly=True).finalize()


def test_compile_problems_compiles_each_source_once_per_arch(tmp_path):
    compiled = []
    cl = default_variant(families("fwd", "cl")[3])  # _filled stores it once; it "fails to compile"

    def fake_compile(source, arch, options):
        compiled.append((sha256(source), arch))
        if sha256(source) == cl.hash():
            raise RuntimeError("NVRTC failed\ncc1d_kernel.cu(3): error: injected")

    with _filled(tmp_path / "a.db") as db:
        put(db, cl, shape_key="b9.d64.l128.bias.silu")  # the same source a second time
        put(db, cl, shape_key="b9.d64.l128.bias.silu", arch="sm_80")
        problems = db.compile_problems(fake_compile, workers=2)
        assert sorted(compiled) == sorted(set(compiled)) and len(compiled) == 3
        assert db.compile_problems(fake_compile, archs=["sm_80"]) == problems[:1]
    cl_fails = [p for p in problems if "error: injected" in p]
    assert len(problems) == len(cl_fails) == 2, problems
    assert problems[0].startswith("sm_80 ") and "does not compile for sm_80" in problems[0]
    assert "b1.d64.l128.bias.silu" in problems[1] and "b9.d64.l128.bias.silu" in problems[1]


def test_compile_problems_compiles_every_named_build_and_names_the_one_that_fails(tmp_path):
    """builds(key, source) lists the kernels the runtime makes from a source: each is
    compiled with its options, and a failure says which build it was."""
    calls = []

    def fake_compile(source, arch, options):
        calls.append((source[:7], tuple(options)))
        if options == ["-DSEQ"]:
            raise RuntimeError("NVRTC failed\ncc1d_kernel.cu(9): error: injected in the seq build")

    def builds(key, source):
        return [("plain", source, []), ("seq_idx", source, ["-DSEQ"]), ("realigned", "#twin\n" + source, [])]

    with _filled(tmp_path / "a.db") as db:
        n = len({(w["source_hash"], w["variant_key"]) for w in db.winners()})
        problems = db.compile_problems(fake_compile, builds=builds)
    assert len(calls) == 3 * n and sum(1 for s, _ in calls if s.startswith("#twin\n")) == n
    assert len(problems) == n and all("its seq_idx build does not compile for sm_90: "
                                      "cc1d_kernel.cu(9): error: injected in the seq build" in p for p in problems)


def test_a_schema_1_db_is_migrated_in_place(tmp_path):
    bwd = default_variant(families("bwd", "cf")[0])
    path = tmp_path / "v1.db"
    with TuningDB(path) as db:
        put(db, default_variant(FAM))
        db.put_winner(bwd.source, **{**winner_row(bwd), "op": "bwd"})
    con = sqlite3.connect(path)  # back to what a schema-1 tuner wrote
    con.execute("ALTER TABLE winners DROP COLUMN split_blocks")
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    with TuningDB(path, readonly=True) as db:  # read as schema 2, nothing written
        assert {w["op"]: w["split_blocks"] for w in db.winners()} == {"fwd": 0, "bwd": 2048}
        assert db.meta()["schema_version"] == "1"
    with TuningDB(path) as db:
        assert db.meta()["schema_version"] == str(SCHEMA_VERSION)
        assert {w["op"]: w["split_blocks"] for w in db.winners()} == {"fwd": 0, "bwd": 2048}
        assert len(db.winners()) == 2


def test_import_of_schema_1_lines_fills_split_blocks(tmp_path):
    bwd = default_variant(families("bwd", "cl")[0])
    with TuningDB(tmp_path / "a.db") as db:
        db.put_winner(bwd.source, **{**winner_row(bwd), "op": "bwd"})
        lines = [json.dumps({k: v for k, v in json.loads(ln).items() if k != "split_blocks"})
                 for ln in db.export_lines()]
    with TuningDB(tmp_path / "b.db") as db:
        assert db.import_lines(lines) == 1
        assert db.winners()[0]["split_blocks"] == 2048
