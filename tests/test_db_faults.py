"""Tuning-DB faults (issue 8, item 3), CPU only: the runtime warns once and falls
back to the catalog for a truncated, corrupt, foreign, locked or newer-schema DB
(and skips single bad entries); the tuner refuses to write into a DB it cannot
trust, with a message that says why; neither changes a byte of what is stored.

A winner whose source hashes right but does not compile is dropped for the
process with one warning, and the call takes the next choice: shown here through
precompile_fwd (decide and compile for sm_90 with NVRTC, no GPU), on the GPU in
test_db_faults_gpu.py.

(Corrupt/not-SQLite/empty files, a newer schema, stale epochs and wrong source
hashes on the runtime side are also in test_dispatch.py; a kernel that gives
wrong results needs a GPU: test_db.py / test_tuner_cli.py validate them.)
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
from contextlib import closing

import pytest

from cc1d.tuner.db import DBError, TuningDB
from test_dispatch import ARCH, CATALOG_16, V16, _run, call, explain, logs, make_db, rt  # noqa: F401 - fixtures

SHAPES = [(2, 64, 128), (4, 64, 512), (1, 2048, 77)]


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def finalized_db(tmp_path, name="t.db", shapes=SHAPES, arch=ARCH):
    """A shipped-style DB: one self-contained file (rollback journal, no -wal)."""
    path = make_db(tmp_path / name, [(V16[i], *s) for i, s in enumerate(shapes)], arch=arch)
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


# ---- a winner whose source does not compile -----------------------------------

def break_source(path, variant_key: str, tag: str) -> None:
    """Gives variant_key's winner a source that does not compile, stored under its
    own sha256 (sources.hash and winners.source_hash): every hash check passes.
    `tag` makes the source unique, so no earlier test in the process broke it."""
    with closing(sqlite3.connect(path)) as c, c:
        old, source = c.execute("SELECT s.hash, s.source FROM winners AS w JOIN sources AS s "
                                "ON s.hash = w.source_hash WHERE w.variant_key = ?", (variant_key,)).fetchone()
        bad = f"{source}\n#error broken on purpose ({tag})\n"
        new = hashlib.sha256(bad.encode()).hexdigest()
        c.execute("UPDATE sources SET hash = ?, source = ? WHERE hash = ?", (new, bad, old))
        c.execute("UPDATE winners SET source_hash = ? WHERE source_hash = ?", (new, old))


@pytest.fixture
def nvrtc_sm90(rt):
    try:
        rt.compile('extern "C" __global__ void cc1d_kernel() {}', "sm_90")
    except RuntimeError as exc:
        pytest.skip(f"NVRTC not usable here: {exc}".splitlines()[0])


# A fresh process: its own broken set and warnings, and only the DBs given (an
# empty package dir and cache dir hide the shipped and the user's sm_90 DBs).
_PRECOMPILE_SCRIPT = r"""
import json, sys
from cc1d import _cc1d as rt  # not _runtime.runtime(): that would set the package dir
logs = []
rt.set_log_handler(logs.append)
a = json.loads(sys.argv[1])
rt.set_tuning_dbs(a["dbs"])
out = []
for shape in a["shapes"]:
    if shape == "clear":
        rt.clear_dispatch_cache()
        continue
    call = a["calls"][str(shape)]
    before = rt.explain_fwd(*call, 0, "sm_90")  # decides only: the winner is not compiled yet
    got = rt.precompile_fwd(*call, "sm_90")
    after = rt.explain_fwd(*call, 0, "sm_90")
    out.append({"before": before["key"], "after_is_got": after == got,
                **{k: got[k] for k in ("reason", "source", "key", "detail")}})
print(json.dumps({"out": out, "logs": logs}))
"""


def run_alone(tmp_path, script, **args):
    (tmp_path / "empty").mkdir(exist_ok=True)
    return _run(script, args, {"CC1D_CACHE_DIR": str(tmp_path / "cache"), "CC1D_PACKAGE_DIR": str(tmp_path / "empty"),
                               "CC1D_TUNING_DB": "", "CC1D_LOG": ""})


def precompile(tmp_path, db, shapes):
    calls = {str(list(s)): call(*s) for s in shapes if s != "clear"}
    return run_alone(tmp_path, _PRECOMPILE_SCRIPT, dbs=[db], calls=calls,
                     shapes=[s if s == "clear" else list(s) for s in shapes])


def test_winner_that_does_not_compile_warns_once_and_falls_back_to_the_catalog(nvrtc_sm90, tmp_path):
    path = finalized_db(tmp_path, shapes=SHAPES[:1], arch="sm_90")
    broken = V16[0].key()
    break_source(path, broken, str(tmp_path))
    before = digest(path)
    res = precompile(tmp_path, path, [SHAPES[0], SHAPES[0], SHAPES[1], "clear", SHAPES[0]])
    first, *rest = res["out"]
    assert first["before"] == broken  # the memoised decision named it until it failed to compile
    for r in res["out"]:
        assert (r["reason"], r["source"], r["key"]) == ("default", "catalog", CATALOG_16.key()), r
        assert r["after_is_got"], r  # explain now reports the fallback
        assert f"{broken} in {path} skipped: its source does not compile for sm_90" in r["detail"], r
    assert all(r["before"] == CATALOG_16.key() for r in rest)  # never chosen again, after a clear too
    assert len(res["logs"]) == 1, res["logs"]
    log = res["logs"][0]
    assert log.startswith(f"tuning DB {path}: {broken} (sm_90, tuned for b2.d64.l128.bias.silu) does not compile: "
                          "NVRTC failed to compile for sm_90 (NVRTC_ERROR_COMPILATION): "), log
    assert f"#error directive: broken on purpose ({tmp_path})" in log and "options:" not in log, log
    assert digest(path) == before


def test_winner_that_does_not_compile_gives_way_to_the_next_tuned_entry(nvrtc_sm90, tmp_path):
    path = finalized_db(tmp_path, arch="sm_90")
    break_source(path, V16[0].key(), str(tmp_path))
    res = precompile(tmp_path, path, [SHAPES[0], SHAPES[1], SHAPES[0]])
    first, second, third = res["out"]
    assert (first["before"], first["reason"], first["source"], first["key"]) == (V16[0].key(), "nearest", path,
                                                                                V16[1].key())
    assert f"{V16[0].key()} in {path} skipped" in first["detail"]
    assert (second["reason"], second["key"]) == ("exact", V16[1].key())  # the others still serve
    assert (third["before"], third["key"]) == (V16[1].key(), V16[1].key())
    assert len(res["logs"]) == 1 and V16[0].key() in res["logs"][0], res["logs"]


_THREADS_SCRIPT = r"""
import json, sys, threading
from cc1d import _cc1d as rt
logs, keys = [], []
rt.set_log_handler(logs.append)
a = json.loads(sys.argv[1])
rt.set_tuning_dbs(a["dbs"])
start = threading.Barrier(8)
def work():
    start.wait()
    keys.append(rt.precompile_fwd(*a["call"], "sm_90")["key"])
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"keys": keys, "logs": logs}))
"""


def test_threads_racing_on_a_winner_that_does_not_compile_warn_once(nvrtc_sm90, tmp_path):
    path = finalized_db(tmp_path, shapes=SHAPES[:1], arch="sm_90")
    break_source(path, V16[0].key(), str(tmp_path))
    res = run_alone(tmp_path, _THREADS_SCRIPT, dbs=[path], call=call(*SHAPES[0]))
    assert res["keys"] == [CATALOG_16.key()] * 8
    assert len(res["logs"]) == 1 and V16[0].key() in res["logs"][0], res["logs"]


def test_catalog_kernel_that_does_not_compile_still_raises(rt, logs, nvrtc_sm90, tmp_path):
    """NVRTC knows no sm_20, so nothing compiles for it: each tuned winner is
    dropped as a DB fault (one warning each), then the catalog's error is raised,
    once per call, with no further warnings and no loop."""
    path = finalized_db(tmp_path, arch="sm_20")
    before = digest(path)
    rt.set_tuning_dbs([path])
    for _ in range(2):
        with pytest.raises(rt.CompileError, match="NVRTC failed to compile for sm_20"):
            rt.precompile_fwd(*call(*SHAPES[0]), "sm_20")
        assert len(logs) == len(SHAPES), logs
    assert all(m.startswith(f"tuning DB {path}: ") and "does not compile" in m for m in logs), logs
    e = explain(rt, *SHAPES[0], arch="sm_20")
    assert (e["reason"], e["key"]) == ("default", CATALOG_16.key())
    assert all(f"{v.key()} in {path} skipped" in e["detail"] for v in V16[:len(SHAPES)]), e["detail"]
    assert digest(path) == before
