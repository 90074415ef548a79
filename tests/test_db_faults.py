"""Tuning-DB faults (issue 8, item 3), CPU only: the runtime warns once and falls
back to the catalog for a truncated, corrupt, foreign, locked or newer-schema DB
(and skips single bad entries); the tuner refuses to write into a DB it cannot
trust, with a message that says why; neither changes a byte of what is stored.

(Corrupt/not-SQLite/empty files, a newer schema, stale epochs and wrong source
hashes on the runtime side are also in test_dispatch.py; a source that fails to
compile and a kernel that gives wrong results need a compiler or a GPU:
test_db.py / test_tuner_cli.py validate and compile them.)
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat

import pytest

from cc1d.tuner.db import DBError, TuningDB
from test_dispatch import ARCH, V16, explain, logs, make_db, rt  # noqa: F401 - fixtures

SHAPES = [(2, 64, 128), (4, 64, 512), (1, 2048, 77)]


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def finalized_db(tmp_path, name="t.db"):
    """A shipped-style DB: one self-contained file (rollback journal, no -wal)."""
    path = make_db(tmp_path / name, [(V16[i], *s) for i, s in enumerate(SHAPES)])
    with TuningDB(path) as db:
        db.finalize()
    return path


def assert_falls_back_with_one_warning(rt, logs, path, words):
    rt.set_tuning_dbs([str(path)])
    for shape in SHAPES + SHAPES:  # several decisions, one warning
        e = explain(rt, *shape)
        assert (e["reason"], e["source"]) == ("default", "catalog"), e
    assert len(logs) == 1, logs
    assert str(path) in logs[0] and words in logs[0], logs[0]


def test_truncated_db(rt, logs, tmp_path):
    path = finalized_db(tmp_path)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 3])
    before = digest(path)
    assert_falls_back_with_one_warning(rt, logs, path, "not used")
    assert digest(path) == before


def test_truncated_to_the_header_only(rt, logs, tmp_path):
    path = finalized_db(tmp_path)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:100])
    assert_falls_back_with_one_warning(rt, logs, path, "not used")


def test_foreign_sqlite_db(rt, logs, tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as c:
        c.execute("CREATE TABLE photos (id INTEGER, name TEXT)")
        c.execute("INSERT INTO photos VALUES (1, 'cat')")
    before = digest(path)
    assert_falls_back_with_one_warning(rt, logs, path, "not used")
    with pytest.raises(DBError, match="SQLite DB of something else"):
        TuningDB(path)
    assert digest(path) == before  # the tuner added nothing to it


def test_newer_schema_is_neither_read_nor_written(rt, logs, tmp_path):
    path = finalized_db(tmp_path)
    with sqlite3.connect(path) as c:
        c.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    before = digest(path)
    assert_falls_back_with_one_warning(rt, logs, path, "schema version 99")
    with pytest.raises(DBError, match="schema version 99, newer than"):
        TuningDB(path)
    assert digest(path) == before


def test_locked_db_falls_back_then_recovers(rt, logs, tmp_path):
    """A rollback-journal DB under an exclusive lock: the runtime waits its busy
    timeout (5 s), warns and uses the catalog; once the lock is gone and the memo
    is cleared, the tuned entries serve again."""
    path = finalized_db(tmp_path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        rt.set_tuning_dbs([str(path)])
        e = explain(rt, *SHAPES[0])
        assert e["reason"] == "default" and len(logs) == 1 and "not used" in logs[0], (e, logs)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    rt.clear_dispatch_cache()
    assert explain(rt, *SHAPES[0])["reason"] == "exact"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory(rt, logs, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = finalized_db(folder)
    for p in folder.iterdir():
        assert p.name == "t.db", p  # nothing beside it
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        before = digest(path)
        rt.set_tuning_dbs([str(path)])
        assert explain(rt, *SHAPES[0])["reason"] == "exact"  # read-only folders are readable
        assert logs == []
        with pytest.raises((DBError, sqlite3.OperationalError)):
            with TuningDB(path) as db:  # the tuner cannot write there: a clear error, not a half-write
                db.put_winner  # noqa: B018
                raise DBError("opened")  # reaching here means it opened for writing
        assert digest(path) == before
    finally:
        folder.chmod(stat.S_IRWXU)


def test_bad_entries_are_skipped_one_by_one(rt, logs, tmp_path):
    """One entry with a wrong source hash, one with an unknown feature: each warned
    once and skipped; the good entry still serves; nothing in the file changes."""
    path = finalized_db(tmp_path)
    with sqlite3.connect(path) as c:
        c.execute("UPDATE winners SET source_hash = ? WHERE shape_key = 'b4.d64.l512.bias.silu'", ("0" * 64,))
        c.execute("UPDATE winners SET features = 'bias,turbo' WHERE shape_key = 'b1.d2048.l77.bias.silu'")
    before = digest(path)
    rt.set_tuning_dbs([str(path)])
    assert explain(rt, *SHAPES[0])["reason"] == "exact"
    assert explain(rt, *SHAPES[1])["reason"] != "exact"
    assert explain(rt, *SHAPES[2])["reason"] != "exact"
    assert len(logs) == 2, logs
    assert any("missing from the sources table" in m or "does not match" in m for m in logs), logs
    assert any("unknown feature" in m for m in logs), logs
    assert digest(path) == before


@pytest.mark.parametrize("damage", ["truncate", "garbage", "foreign"])
def test_tuner_refuses_an_untrusted_db_and_keeps_it(tmp_path, damage):
    path = finalized_db(tmp_path)
    keep = tmp_path / "copy.db"
    if damage == "truncate":
        data = open(path, "rb").read()
        open(path, "wb").write(data[:len(data) // 3])
    elif damage == "garbage":
        open(path, "wb").write(b"this is not SQLite\n" * 100)
    else:
        os.remove(path)
        with sqlite3.connect(path) as c:
            c.execute("CREATE TABLE t (a)")
    shutil.copy(path, keep)
    with pytest.raises(DBError) as info:
        TuningDB(path)
    msg = str(info.value)
    assert str(path) in msg and ("refusing" in msg or "not a readable SQLite DB" in msg), msg
    assert digest(path) == digest(keep)
