"""The dispatcher (runtime/src/dispatch.cpp, tuning_db.cpp): lookup chain, exact /
nearest / default selection, requirement checks, stale or broken DBs, the memo.

No GPU: explain_fwd is asked with fake, 256-aligned pointers and an explicit arch
(it never touches memory). In-process tests use a made-up arch, so a real user
DB or shipped DB on this machine cannot change their answers.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import threading

import pytest

from cc1d.generator import EPOCH, Family, fallback_chain, variants
from cc1d.tuner.db import SCHEMA_VERSION, TuningDB

ARCH = "sm_999"  # nobody tunes it: only the DBs these tests build are consulted
FAM = Family("fwd", "cf", "bf16", "f32", 4)
BF16, F32 = 2, 0
_ALL = list(variants(FAM))
V16 = [v for v in _ALL if v.geometry()["align_bytes"] == 16]  # need 16-byte alignment
V2 = [v for v in _ALL if v.geometry()["align_bytes"] == 2]    # need only the element size
CATALOG_16, CATALOG_2 = fallback_chain(FAM)[0], fallback_chain(FAM)[-1]


@pytest.fixture
def rt(clean_rt):  # conftest.py: no caller DB, an empty memo, restored after
    return clean_rt


@pytest.fixture
def logs(rt):
    lines: list[str] = []
    rt.set_log_handler(lines.append)
    return lines


def features(bias=True, silu=True) -> str:
    return ",".join(n for n, on in (("bias", bias), ("silu", silu)) if on)


def shape_key(b, d, l, feats="bias,silu") -> str:
    return ".".join([f"b{b}.d{d}.l{l}", *[f for f in feats.split(",") if f]])


def put(db: TuningDB, variant, b, d, l, feats="bias,silu", arch=ARCH, **kw) -> None:
    db.put_winner(variant.source, arch=arch, family_key=FAM.key(), shape_key=shape_key(b, d, l, feats),
                  op="fwd", batch=b, dim=d, seqlen=l, features=feats, variant_key=variant.key(),
                  config=variant.params, source_hash=variant.hash(), **variant.geometry(),
                  time_us=10.0, environment={"device": "test"}, **kw)


def make_db(path, entries, **kw):
    """entries: (variant, batch, dim, seqlen[, features])."""
    with TuningDB(path) as db:
        for e in entries:
            put(db, *e, **kw)
    return str(path)


def call(b=2, d=64, l=128, *, bias=True, silu=True, x_ptr=256, final=False):
    """explain_fwd/select_fwd arguments of a contiguous channel-first bf16/f32 call."""
    w = 4
    # 4 GiB apart: x, out and final_states must not overlap, whatever the shape
    ptrs = (x_ptr, 1 << 32, (2 << 32) if bias else 0, 0, 0, 3 << 32, (4 << 32) if final else 0)
    strides = (d * l, l, 1, w, 1, 1 if bias else 0, d * l, l, 1, 0, 0, 0, 0, 0,
               *((d * (w - 1), w - 1, 1) if final else (0, 0, 0)))
    return ptrs, (b, d, l, w), strides, BF16, F32, silu


def explain(rt, *args, arch=ARCH, **kw):
    return rt.explain_fwd(*call(*args, **kw), 0, arch)


# ---- selection ---------------------------------------------------------------

def test_exact_hit(rt, tmp_path):
    v = V16[3]
    path = make_db(tmp_path / "t.db", [(v, 2, 64, 128), (V16[5], 4, 64, 128)])
    rt.set_tuning_dbs([path])
    e = explain(rt, 2, 64, 128)
    assert (e["reason"], e["source"], e["key"], e["matched_shape"]) == ("exact", path, v.key(),
                                                                         "b2.d64.l128.bias.silu")
    assert e["distance"] == 0 and e["arch"] == ARCH and e["shape"] == "b2.d64.l128.bias.silu"
    assert e["variant"] == v.as_runtime_dict()
    assert rt.select_fwd(*call(2, 64, 128), 0, ARCH) == v.as_runtime_dict()


def test_features_must_match(rt, tmp_path):
    path = make_db(tmp_path / "t.db", [(V16[3], 2, 64, 128, "bias,silu"), (V16[4], 2, 64, 128, "silu"),
                                       (V16[6], 2, 64, 128, "bias,silu,final")])
    rt.set_tuning_dbs([path])
    assert explain(rt, 2, 64, 128, bias=False)["key"] == V16[4].key()
    assert explain(rt, 2, 64, 128, final=True)["key"] == V16[6].key()
    # no entry without bias and silu: the nearest with the fewest differing features serves
    e = explain(rt, 2, 64, 128, bias=False, silu=False)
    assert (e["reason"], e["key"]) == ("nearest", V16[4].key())
    assert "tuned with features [silu]; none tuned with []" in e["detail"]


def test_same_features_beat_any_distance(rt, tmp_path):
    path = make_db(tmp_path / "t.db", [(V16[3], 2, 64, 128, "bias,silu"), (V16[4], 1, 8192, 1 << 20, "silu")])
    rt.set_tuning_dbs([path])
    e = explain(rt, 2, 64, 128, bias=False)
    assert (e["reason"], e["key"], e["matched_shape"]) == ("nearest", V16[4].key(), "b1.d8192.l1048576.silu")
    assert "tuned with features" not in e["detail"]


def test_nearest_by_distance(rt, tmp_path):
    shapes = [(1, 64, 128), (8, 64, 4096), (2, 2048, 512), (16, 4096, 8192)]
    path = make_db(tmp_path / "t.db", [(V16[i], *s) for i, s in enumerate(shapes)])
    rt.set_tuning_dbs([path])

    def dist(b, d, l, s):
        return abs(math.log(b * l) - math.log(s[0] * s[2])) + abs(math.log(d) - math.log(s[1]))

    for b, d, l in [(1, 64, 256), (4, 64, 4096), (2, 1024, 512), (1, 2048, 1024), (8, 8192, 8192),
                    (3, 104, 3000), (64, 64, 8)]:
        want = min(range(len(shapes)), key=lambda i: dist(b, d, l, shapes[i]))
        e = explain(rt, b, d, l)
        assert (e["reason"], e["key"]) == ("nearest", V16[want].key()), (b, d, l)
        assert e["matched_shape"] == shape_key(*shapes[want])
        assert e["distance"] == pytest.approx(dist(b, d, l, shapes[want]))


def test_batch_times_seqlen_is_one_axis(rt, tmp_path):
    # b4 x l1024 and b1 x l4096 are the same amount of work: distance 0 in that axis
    path = make_db(tmp_path / "t.db", [(V16[0], 1, 512, 4096), (V16[1], 4, 512, 2048)])
    rt.set_tuning_dbs([path])
    e = explain(rt, 4, 512, 1024)
    assert (e["key"], e["distance"]) == (V16[0].key(), 0.0)


def test_nearest_prefers_a_kernel_whose_segment_fits_the_sequence(rt, tmp_path):
    """A channel-first forward kernel's fast path takes whole segments: an entry whose
    segment is longer than the call's sequence ranks behind every one whose segment fits,
    however near (its kernel would run every row on the edge path)."""
    from cc1d.generator.variant import cf_segment_positions  # equals the kernel's SEG_L (test_render.py)
    long_seg = next(v for v in V16 if cf_segment_positions(v.geometry(), ARCH) == 2048)
    short_seg = next(v for v in V16 if cf_segment_positions(v.geometry(), ARCH) == 512)
    path = make_db(tmp_path / "t.db", [(long_seg, 8, 4096, 2048), (short_seg, 1, 4096, 512)])
    rt.set_tuning_dbs([path])
    for l, want in [(2000, short_seg), (1000, short_seg), (512, short_seg), (2048, long_seg), (3000, long_seg)]:
        e = explain(rt, 8, 4096, l)
        assert e["key"] == want.key(), (l, e)
        assert "longer than this call's sequence" not in e["detail"]
    # none fits: the nearest serves, and the detail says why it is slow
    e = explain(rt, 8, 4096, 256)
    assert (e["reason"], e["key"]) == ("nearest", short_seg.key())
    assert "segments (512 positions) are longer than this call's sequence" in e["detail"], e


def test_nearest_channel_last_passes_over_tiles_over_twice_the_sequence(rt, tmp_path):
    """A channel-last block covers tile_l positions: one more than twice the call's sequence
    leaves most of each block idle, so such an entry ranks behind every one whose tile fits,
    however near (session 73, H200: fp16 (8, 5120, 128) took 31.2 us on a 512-position tile,
    11.7 on the nearest entry that fits)."""
    cl = Family("fwd", "cl", "bf16", "bf16", 4)
    cl_variants = [v for v in variants(cl) if v.geometry()["align_bytes"] == 8]
    long_tile = next(v for v in cl_variants if v.geometry()["tile_l"] == 512)
    short_tile = next(v for v in cl_variants if v.geometry()["tile_l"] == 64)

    def cl_db(name, entries):
        with TuningDB(tmp_path / name) as db:
            for v, (b, d, l) in entries:
                db.put_winner(v.source, arch=ARCH, family_key=cl.key(), shape_key=shape_key(b, d, l), op="fwd",
                              batch=b, dim=d, seqlen=l, features="bias,silu", variant_key=v.key(), config=v.params,
                              source_hash=v.hash(), **v.geometry(), time_us=10.0, environment={"device": "test"})
        return str(tmp_path / name)

    def explain_cl(b, d, l):
        ptrs = (256, 1 << 32, 2 << 32, 0, 0, 3 << 32, 0)
        strides = (d * l, 1, d, 4, 1, 1, d * l, 1, d, 0, 0, 0, 0, 0, 0, 0, 0)
        return rt.explain_fwd(ptrs, (b, d, l, 4), strides, BF16, BF16, True, 0, ARCH)

    rt.set_tuning_dbs([cl_db("both.db", [(long_tile, (16, 2048, 256)), (short_tile, (1, 2048, 2048))])])
    for l, want in [(256, long_tile), (300, long_tile), (255, short_tile), (128, short_tile), (32, short_tile)]:
        e = explain_cl(16, 2048, l)
        assert e["key"] == want.key(), (l, e)
        assert "more than twice this call's sequence" not in e["detail"], e
    # none fits: the nearest serves, and the detail says why it is slow
    rt.set_tuning_dbs([cl_db("long.db", [(long_tile, (16, 2048, 256))])])
    e = explain_cl(16, 2048, 128)
    assert (e["reason"], e["key"]) == ("nearest", long_tile.key())
    assert ("its tiles (512 positions a block) are more than twice this call's sequence, so most of each block "
            "idles, and no tuned entry's kernel fits the call: cc1d-tune this shape") in e["detail"], e


def test_detail_flags_a_nearest_shape_more_than_twice_away(rt, tmp_path):
    path = make_db(tmp_path / "t.db", [(V16[0], 1, 512, 2048)])
    rt.set_tuning_dbs([path])
    far = "far from this call"
    assert far not in explain(rt, 1, 512, 2048)["detail"]      # exact
    assert far not in explain(rt, 1, 512, 1024)["detail"]      # half the work: distance ln 2
    assert far not in explain(rt, 1, 1024, 2048)["detail"]     # twice the channels
    for b, d, l in [(1, 512, 512), (1, 2048, 2048), (1, 1024, 4096), (8, 512, 2048)]:
        e = explain(rt, b, d, l)
        assert e["reason"] == "nearest" and e["distance"] > math.log(2), (b, d, l)
        assert f"{far} (distance {e['distance']:.2f}, more than a factor of 2 apart)" in e["detail"], e
        assert "cc1d-tune this shape" in e["detail"]


def test_requirement_check_skips_misaligned(rt, tmp_path):
    exact = make_db(tmp_path / "exact.db", [(V16[3], 2, 64, 128), (V2[5], 16, 4096, 8192)])
    rt.set_tuning_dbs([exact])
    assert explain(rt, 2, 64, 128)["key"] == V16[3].key()
    # x at 256 + 2 bytes: only 2-byte alignment, so the exact 16-byte winner is out
    e = explain(rt, 2, 64, 128, x_ptr=258)
    assert (e["reason"], e["key"], e["alignment"]) == ("nearest", V2[5].key(), 2)
    assert "needs 16-byte alignment" in e["detail"]

    only16 = make_db(tmp_path / "only16.db", [(V16[3], 2, 64, 128), (V16[4], 8, 64, 128)])
    rt.set_tuning_dbs([only16])
    e = explain(rt, 2, 64, 128, x_ptr=258)
    assert (e["reason"], e["key"]) == ("default", CATALOG_2.key())
    assert explain(rt, 2, 64, 128, x_ptr=256 + 16)["key"] == V16[3].key()


def test_exact_anywhere_beats_nearest_and_ties_go_to_earlier_db(rt, tmp_path):
    first = make_db(tmp_path / "first.db", [(V16[1], 2, 64, 256)])
    second = make_db(tmp_path / "second.db", [(V16[2], 2, 64, 128), (V16[3], 2, 64, 256)])
    rt.set_tuning_dbs([first, second])
    e = explain(rt, 2, 64, 128)
    assert (e["reason"], e["source"], e["key"]) == ("exact", second, V16[2].key())
    e = explain(rt, 2, 64, 512)  # equally near to both b2.d64.l256 entries
    assert (e["reason"], e["source"], e["key"]) == ("nearest", first, V16[1].key())


def test_other_arch_and_family_are_not_used(rt, tmp_path):
    path = make_db(tmp_path / "t.db", [(V16[3], 2, 64, 128)], arch="sm_80")
    rt.set_tuning_dbs([path])
    assert explain(rt, 2, 64, 128)["reason"] == "default"
    assert explain(rt, 2, 64, 128, arch="sm_80")["reason"] == "exact"
    e = rt.explain_fwd(*call(2, 64, 128)[:3], BF16, BF16, True, 0, "sm_80")  # bf16 weights: other family
    assert (e["reason"], e["key"]) == ("default", fallback_chain(Family("fwd", "cf", "bf16", "bf16", 4))[0].key())


def test_no_arch_no_device_gives_default(rt, tmp_path):
    rt.set_tuning_dbs([make_db(tmp_path / "t.db", [(V16[3], 2, 64, 128)])])
    e = rt.explain_fwd(*call(2, 64, 128), 0, "")  # no driver here: no device owns x
    assert (e["reason"], e["arch"], e["key"]) == ("default", "", CATALOG_16.key())
    assert "arch unknown" in e["detail"]
    with pytest.raises(ValueError, match="target must look like"):
        rt.explain_fwd(*call(), 0, "../../etc")


def test_invalid_call_is_rejected_before_any_lookup(rt):
    ptrs, sizes, strides, xd, wd, silu = call()
    with pytest.raises(ValueError, match="width"):
        rt.explain_fwd(ptrs, (2, 64, 128, 9), strides, xd, wd, silu, 0, ARCH)


# ---- broken DBs: one warning, then the next in the chain ---------------------

def test_stale_epoch_entry_skipped(rt, logs, tmp_path):
    path = make_db(tmp_path / "t.db", [(V16[3], 2, 64, 128)], epoch=EPOCH + 1)
    with TuningDB(path) as db:
        put(db, V16[4], 4, 64, 128)  # a good entry in the same file stays usable
    rt.set_tuning_dbs([path])
    e = explain(rt, 2, 64, 128)
    assert (e["reason"], e["key"]) == ("nearest", V16[4].key())
    assert len(logs) == 1 and "b2.d64.l128.bias.silu" in logs[0] and f"generator epoch {EPOCH + 1}" in logs[0]
    rt.clear_dispatch_cache()
    explain(rt, 2, 64, 128)
    assert len(logs) == 1  # one warning per entry, per process


def test_wrong_source_hash_skipped(rt, logs, tmp_path):
    path = make_db(tmp_path / "t.db", [(V16[3], 2, 64, 128)])
    con = sqlite3.connect(path)
    con.execute("UPDATE sources SET source = source || '// tampered\n'")
    con.commit()
    con.close()
    rt.set_tuning_dbs([path])
    e = explain(rt, 2, 64, 128)
    assert (e["reason"], e["source"]) == ("default", "catalog")
    assert len(logs) == 1 and "does not match its hash" in logs[0] and V16[3].key() in logs[0]


def test_missing_source_and_bad_features_skipped(rt, logs, tmp_path):
    path = make_db(tmp_path / "t.db", [(V16[3], 2, 64, 128), (V16[4], 4, 64, 128)])
    con = sqlite3.connect(path)
    con.execute("DELETE FROM sources WHERE hash = ?", (V16[3].hash(),))
    con.execute("UPDATE winners SET features = 'bias,silu,sparkle' WHERE batch = 4")
    con.commit()
    con.close()
    rt.set_tuning_dbs([path])
    assert explain(rt, 2, 64, 128)["reason"] == "default"
    assert len(logs) == 2
    assert any("missing from the sources table" in m for m in logs)
    assert any("unknown feature" in m for m in logs)


def test_newer_schema_skipped(rt, logs, tmp_path):
    path = make_db(tmp_path / "t.db", [(V16[3], 2, 64, 128)])
    con = sqlite3.connect(path)
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    con.commit()
    con.close()
    fallback = make_db(tmp_path / "ok.db", [(V16[4], 2, 64, 128)])
    rt.set_tuning_dbs([path, fallback])
    e = explain(rt, 2, 64, 128)
    assert (e["reason"], e["source"], e["key"]) == ("exact", fallback, V16[4].key())
    assert len(logs) == 1 and "newer than this cc1d's" in logs[0] and path in logs[0]


@pytest.mark.parametrize("content", [b"SQLite format 3\x00" + b"\x07" * 4000, b"not a database at all\n" * 50,
                                     b""], ids=["corrupt", "not_sqlite", "empty"])
def test_unreadable_file_falls_back(rt, logs, tmp_path, content):
    path = tmp_path / "bad.db"
    path.write_bytes(content)
    rt.set_tuning_dbs([str(path)])
    e = explain(rt, 2, 64, 128)
    assert (e["reason"], e["source"]) == ("default", "catalog")
    assert len(logs) == 1 and str(path) in logs[0] and "not used" in logs[0]


def test_missing_file_and_directory_fall_back(rt, logs, tmp_path):
    rt.set_tuning_dbs([str(tmp_path / "nope.db"), str(tmp_path)])
    assert explain(rt, 2, 64, 128)["reason"] == "default"
    assert len(logs) == 2 and "nope.db" in logs[0] and "No such file" in logs[0]


def test_reads_a_db_a_tuner_holds_open(rt, tmp_path):
    # WAL mode with -wal/-shm files present and a connection open: read-only readers work
    with TuningDB(tmp_path / "t.db") as db:
        put(db, V16[3], 2, 64, 128)
        rt.set_tuning_dbs([str(tmp_path / "t.db")])
        assert explain(rt, 2, 64, 128)["reason"] == "exact"


# ---- memo ----------------------------------------------------------------------

def test_memo_serves_repeat_calls_without_db_work(rt, logs, tmp_path):
    path = make_db(tmp_path / "t.db", [(V16[3], 2, 64, 128)])
    rt.set_tuning_dbs([path])
    assert explain(rt, 2, 64, 128)["reason"] == "exact"
    os.remove(path)
    assert explain(rt, 2, 64, 128)["reason"] == "exact"  # memoised: the file is not read again
    assert explain(rt, 2, 64, 1000)["reason"] == "nearest"  # a new shape: the loaded DB is reused
    assert logs == []
    rt.clear_dispatch_cache()
    assert explain(rt, 2, 64, 128)["reason"] == "default"
    assert len(logs) == 1 and "No such file" in logs[0]


def test_set_tuning_dbs_invalidates_the_memo(rt, tmp_path):
    a = make_db(tmp_path / "a.db", [(V16[3], 2, 64, 128)])
    b = make_db(tmp_path / "b.db", [(V16[4], 2, 64, 128)])
    rt.set_tuning_dbs([a])
    assert explain(rt, 2, 64, 128)["key"] == V16[3].key()
    rt.set_tuning_dbs([b])
    assert explain(rt, 2, 64, 128)["key"] == V16[4].key()


def test_threads_get_identical_answers(rt, tmp_path):
    path = make_db(tmp_path / "t.db", [(V16[i], 1 << i, 64 << (i % 3), 128 << i) for i in range(6)]
                   + [(V2[1], 4, 256, 1024)])
    cases = [(b, d, l, x) for b in (1, 3, 8) for d in (64, 200, 4096) for l in (1, 128, 5000)
             for x in (256, 258, 264)]
    rt.set_tuning_dbs([path])
    want = {c: explain(rt, *c[:3], x_ptr=c[3])["key"] for c in cases}
    for _ in range(3):
        rt.clear_dispatch_cache()  # every thread races on fresh decisions and a fresh DB load
        results: list[dict] = []
        errors: list[BaseException] = []
        start = threading.Barrier(8)

        def worker(seed):
            try:
                start.wait()
                got = {}
                for i in range(len(cases) * 4):
                    c = cases[(i * 7 + seed) % len(cases)]
                    key = explain(rt, *c[:3], x_ptr=c[3])["key"]
                    assert got.setdefault(c, key) == key
                results.append(got)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert len(results) == 8
        for got in results:
            assert got == want


# ---- lookup order, env knobs and the Python API: fresh processes ----------------

_CHAIN_SCRIPT = r"""
import json, os, sys
from cc1d import _cc1d as rt  # not _runtime.runtime(): that sets the package dir, we test CC1D_PACKAGE_DIR
logs = []
rt.set_log_handler(logs.append)
a = json.loads(sys.argv[1])
ptrs, sizes, strides = a["call"]
def ask():
    e = rt.explain_fwd(ptrs, sizes, strides, 2, 0, True, 0, a["arch"])
    return [e["reason"], e["source"], e["key"]]
out = []
rt.set_tuning_dbs([a["caller"]])
out.append(ask())
rt.set_tuning_dbs([])                       # -> CC1D_TUNING_DB
out.append(ask())
os.remove(a["env"]); rt.clear_dispatch_cache()   # -> the user's DB (warning: env DB missing)
out.append(ask())
os.remove(a["user"]); rt.clear_dispatch_cache()  # -> the shipped DB
out.append(ask())
rt.set_package_dir(a["empty"])              # -> the catalog
out.append(ask())
print(json.dumps({"out": out, "logs": logs}))
"""


def _run(script, args, env):
    full = {**os.environ, **env}
    r = subprocess.run([sys.executable, "-P", "-c", script, json.dumps(args)], capture_output=True, text=True,
                       env=full, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_lookup_order(tmp_path):
    cache, pkg, empty = tmp_path / "cache", tmp_path / "pkg", tmp_path / "empty"
    (pkg / "tuning_db").mkdir(parents=True)
    empty.mkdir()
    entry = lambda v: [(v, 2, 64, 128)]  # noqa: E731
    paths = dict(caller=make_db(tmp_path / "caller.db", entry(V16[1])),
                 env=make_db(tmp_path / "env.db", entry(V16[2])),
                 user=make_db(cache / "tuning.db", entry(V16[3])),
                 shipped=make_db(pkg / "tuning_db" / f"{ARCH}.db", entry(V16[4])))
    ptrs, sizes, strides, *_ = call(2, 64, 128)
    res = _run(_CHAIN_SCRIPT, dict(paths, call=[ptrs, sizes, strides], arch=ARCH, empty=str(empty)),
               {"CC1D_CACHE_DIR": str(cache), "CC1D_TUNING_DB": paths["env"] + ":" + str(tmp_path / "none.db"),
                "CC1D_PACKAGE_DIR": str(pkg), "CC1D_LOG": ""})
    assert res["out"] == [["exact", paths["caller"], V16[1].key()],
                          ["exact", paths["env"], V16[2].key()],
                          ["exact", paths["user"], V16[3].key()],
                          ["exact", paths["shipped"], V16[4].key()],
                          ["default", "catalog", CATALOG_16.key()]]
    # the env names a missing file too: one warning for it, one for env.db once removed
    assert sum("none.db" in m for m in res["logs"]) == 1
    assert sum("env.db" in m for m in res["logs"]) == 1
    assert len(res["logs"]) == 2


_LOG_SCRIPT = r"""
import json, sys
import cc1d
from cc1d._runtime import runtime
rt = runtime()
logs = []
rt.set_log_handler(logs.append)
a = json.loads(sys.argv[1])
cc1d.set_tuning_db(a["db"])
ptrs, sizes, strides = a["call"]
for l in (128, 128, 256, 128):
    rt.explain_fwd(ptrs, sizes[:2] + [l] + sizes[3:], strides, 2, 0, True, 0, a["arch"])
cc1d.set_tuning_db()
rt.explain_fwd(ptrs, sizes, strides, 2, 0, True, 0, a["arch"])
print(json.dumps({"logs": logs, "torch": "torch" in sys.modules}))
"""


def test_log_dispatch_and_set_tuning_db(tmp_path):
    db = make_db(tmp_path / "t.db", [(V16[3], 2, 64, 128)])
    ptrs, sizes, strides, *_ = call(2, 64, 128)
    res = _run(_LOG_SCRIPT, dict(db=db, call=[ptrs, list(sizes), strides], arch=ARCH),
               {"CC1D_LOG": "dispatch", "CC1D_CACHE_DIR": str(tmp_path / "cache")})
    logs = res["logs"]
    assert len(logs) == 3, logs  # one line per new decision: l128, l256, then l128 without the DB
    assert logs[0].startswith(f"dispatch: {ARCH} {FAM.key()} b2.d64.l128.bias.silu align 256 -> {V16[3].key()} "
                              f"(exact, from {db})")
    assert "(nearest to b2.d64.l128.bias.silu, distance 0.693" in logs[1]
    assert "(default, from catalog)" in logs[2]
    assert res["torch"] is False  # import cc1d and set_tuning_db pull in no torch


def test_explain_python_api(tmp_path, rt):
    torch = pytest.importorskip("torch")
    import cc1d
    db = make_db(tmp_path / "t.db", [(V16[3], 2, 64, 128)])
    cc1d.set_tuning_db(db)
    x = torch.empty(2, 64, 128, dtype=torch.bfloat16)
    w = torch.empty(64, 4)
    e = cc1d.explain(x, w, torch.empty(64), activation="silu", arch=ARCH)
    assert (e["reason"], e["source"], e["key"]) == ("exact", db, V16[3].key())
    e = cc1d.explain(x, w, activation="silu", arch=ARCH)
    # no shape tuned without bias: the winner tuned with it serves (bias is a runtime flag)
    assert e["reason"] == "nearest" and "tuned with features" in e["detail"], e
    e = cc1d.explain(x.transpose(1, 2).contiguous().transpose(1, 2), w, torch.empty(64), activation="silu",
                     arch=ARCH)
    assert e["key"].startswith("fwd.cl.")
