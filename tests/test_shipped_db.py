"""The tuning DBs shipped in tuning_db/<arch>.db, which the dispatcher reads from
<package dir>/tuning_db/ (docs/DISPATCH.md; how they are made: tuning_db/README.md).

sm_90.db must be there. Every shipped DB is finalized (one file, rollback-journal
mode, no trials), holds only its own arch, is tuned for shapes its shapes file lists,
validates as `cc1d-tune db validate` does (source hash, generator epoch, re-rendered
source of the variant, geometry), compiles for
its arch with NVRTC, is installed into the package unchanged, and the runtime
serves each of its winners for exactly the call it was tuned for. No GPU needed.
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cc1d.generator import default_variant, families, variants
from cc1d.tuner.db import TuningDB, family_from_key, winner_variant

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "tuning_db").glob("*.db"))
DTYPE_CODES = {"f32": 0, "f16": 1, "bf16": 2}


def test_sm90_db_is_shipped():
    path = REPO / "tuning_db" / "sm_90.db"
    assert path.is_file(), (f"{path} is missing: the product ships tuned H100 kernels; produce it on an "
                            f"H100 as tuning_db/README.md says")


@pytest.fixture(params=SHIPPED, ids=lambda p: p.name)
def shipped(request) -> Path:
    return request.param


def _one_value(path: Path, sql: str):
    """The single value `sql` returns, read through a read-only connection."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


def test_is_finalized(shipped):
    mode = _one_value(shipped, "PRAGMA journal_mode")
    assert mode == "delete", f"{shipped.name}: journal_mode {mode}; run cc1d-tune db finalize --db {shipped}"
    beside = [p.name for p in shipped.parent.glob(shipped.name + "-*")]
    assert not beside, f"{beside} beside {shipped.name}: finalize it, and ship the .db alone"


def test_ships_no_trials(shipped):
    # The runtime reads only winners; a merged study's trials would only bloat the
    # package (and turn up in `db report` as convergence plots of one search).
    n = _one_value(shipped, "SELECT COUNT(*) FROM trials")
    assert n == 0, f"{shipped.name} holds {n} trials: run cc1d-tune db finalize --drop-trials --db {shipped}"


def test_holds_only_its_own_arch(shipped):
    with TuningDB(shipped, readonly=True) as db:
        winners = db.winners()
    assert winners, f"{shipped.name} has no winners"
    archs = {w["arch"] for w in winners}
    assert archs == {shipped.stem}, f"{shipped.name}: winners of {archs} (the runtime reads only {shipped.stem}'s)"


def test_every_winner_is_a_shape_of_its_shapes_file(shipped):
    """shapes/<arch>.yaml lists what the DB was tuned for: a re-tune from it keeps every
    winner. (The file may list shapes without a winner: tuning_db/README.md names them.)"""
    from cc1d.tuner.shapes import load_shapes
    path = shipped.parent / "shapes" / f"{shipped.stem}.yaml"
    assert path.is_file(), f"{shipped.name} has no shapes file {path}"
    listed = {(s.family().key(), s.key()) for s in load_shapes(path)}
    with TuningDB(shipped, readonly=True) as db:
        missing = sorted((w["family_key"], w["shape_key"]) for w in db.winners()
                         if (w["family_key"], w["shape_key"]) not in listed)
    assert not missing, (f"{len(missing)} winners of {shipped.name} are no shape of {path.name} (add the "
                         f"shapes the tuner's guard printed): {missing[:10]}")


def test_validates(shipped):
    with TuningDB(shipped, readonly=True) as db:
        problems = db.validate()
    assert not problems, "\n".join(problems[:50])


def test_compiles_for_its_arch(shipped, nvrtc):
    """Every winner's stored source, and every build the runtime makes from it (a
    backward's seq_idx build, the realigned twins that odd and cut lengths run)."""
    if not shipped.stem.startswith("sm_"):
        pytest.skip(f"{shipped.stem}: only NVIDIA targets are compiled here (AMD: tests/test_compile_amd.py)")
    from cc1d.tuner.db import runtime_builds
    built = []

    def compile(src, arch, options):
        built.append((src[:40], tuple(options)))
        return nvrtc.compile(src, arch, options)

    with TuningDB(shipped, readonly=True) as db:
        problems = db.compile_problems(compile, archs=[shipped.stem], workers=max(2, os.cpu_count() or 2),
                                       builds=lambda key, src: runtime_builds(nvrtc, key, src))
    assert not problems, "\n".join(problems[:20])
    twins = [b for b in built if b[0].startswith(("#define CC1D_FWD_REALIGN", "#define CC1D_BWD_REALIGN"))]
    assert twins and any(opts for _, opts in twins), "no realigned twin (or its seq_idx build) was compiled"


def test_installed_with_the_package(shipped):
    import cc1d
    installed = Path(cc1d.__file__).resolve().parent / "tuning_db" / shipped.name
    assert installed.is_file(), f"{installed} missing: is the package installed from this tree (pip install .)?"
    assert installed.read_bytes() == shipped.read_bytes(), f"{installed} differs from {shipped}: reinstall"


# ---- the runtime reads them -------------------------------------------------------

def _apart(b: int, d: int, n: int) -> int:
    """How far apart call_for's fake addresses lie: 4 GiB, or for a problem whose (b, d, n)
    tensor of 4-byte elements is larger, the power of two above its size, so that no two
    overlap (the runtime refuses dx over dout, say)."""
    return max(1 << 32, 1 << (4 * b * d * n - 1).bit_length())


def call_for(family_key: str, batch: int, dim: int, seqlen: int, features: str) -> list:
    """["fwd"|"bwd", explain_*'s arguments...] for contiguous tensors of a tuned problem
    (what the tuner measured on), at fake addresses 4 GiB or more apart (_apart; explain
    touches no memory)."""
    fam = family_from_key(family_key)
    feats = {f for f in features.split(",") if f}
    b, d, n, w = batch, dim, seqlen, fam.width
    if fam.op == "bwd":
        return ["bwd", *bwd_call_for(fam, b, d, n, feats)]
    if fam.op == "upd":
        return ["upd", *upd_call_for(fam, b, d, n, feats)]
    if fam.op == "vfwd":
        return ["vfwd", *varlen_call_for(fam, b, d, n, feats)]
    act = (d * n, n, 1) if fam.layout == "cf" else (d * n, 1, d)
    state = (d * (w - 1), w - 1, 1)
    used = (True, True, "bias" in feats, "seqidx" in feats, "init" in feats, True, "final" in feats)
    apart = _apart(b, d, n)
    ptrs = [(i + 1) * apart * u for i, u in enumerate(used)]  # out overlaps nothing
    strides = [*act, w, 1, int("bias" in feats), *act, *((n, 1) if "seqidx" in feats else (0, 0)),
               *(state if "init" in feats else (0, 0, 0)), *(state if "final" in feats else (0, 0, 0))]
    return ["fwd", ptrs, [b, d, n, w], strides, DTYPE_CODES[fam.x_dtype], DTYPE_CODES[fam.w_dtype],
            "silu" in feats]


def upd_call_for(fam, b: int, d: int, n: int, feats: set) -> list:
    """explain_upd's arguments for the tuner's update problem: contiguous x and out, states of
    width-1 entries (width with "wstate") laid out as the family says ("cl" dim-contiguous): a
    pool of `b`, or with "pool" one of 2b+1 read through conv_state_indices; no other index arrays."""
    w = fam.width
    sl = w if "wstate" in feats else w - 1
    pool = 2 * b + 1 if "pool" in feats else b
    x = (d * n, n, 1)
    state = (d * sl, sl, 1) if fam.layout == "cf" else (d * sl, 1, d)
    ptrs = [1 << 32, 2 << 32, (3 << 32) * ("bias" in feats), 4 << 32, 0, (6 << 32) * ("pool" in feats), 0, 5 << 32]
    strides = [*x, w, 1, int("bias" in feats), *state, *x, 1, 1, 1]
    return [ptrs, [b, d, n, sl, pool, w], strides, -1, DTYPE_CODES[fam.x_dtype], DTYPE_CODES[fam.w_dtype],
            "silu" in feats]


def varlen_call_for(fam, seqs: int, d: int, total: int, feats: set) -> list:
    """explain_varlen's arguments for the tuner's varlen problem (tuner/problems.py VarlenProblem):
    x (dim, total) as the family lays it out, out alike, and with "final" a dim-contiguous pool of
    seqs + 4 rows of state_len = width (vLLM's), int32 cache_indices, bool has_initial_state with "init"."""
    w = fam.width
    pool, sl = (seqs + 4, w) if "final" in feats else (0, 0)
    x = (total, 1) if fam.layout == "cf" else (1, d)
    init, final = "init" in feats, "final" in feats
    ptrs = [1 << 32, 2 << 32, (3 << 32) * ("bias" in feats), 4 << 32, (5 << 32) * final, (6 << 32) * init,
            (7 << 32) * final, 8 << 32]
    sizes = [seqs, d, total, 0, sl, pool, -1, int(init), w]
    strides = [*x, w, 1, int("bias" in feats), *x, *((sl * d, 1, d) if final else (0, 0, 0)), 1, int(final),
               int(init)]
    return [ptrs, sizes, strides, DTYPE_CODES[fam.x_dtype], DTYPE_CODES[fam.w_dtype], "silu" in feats]


def bwd_call_for(fam, b: int, d: int, n: int, feats: set) -> list:
    """explain_bwd's arguments, as call_for's (addresses _apart): x, dout and dx alike; dinitial_states with
    initial_states; "final" = dfinal_states given."""
    w = fam.width
    act = (d * n, n, 1) if fam.layout == "cf" else (d * n, 1, d)
    state = (d * (w - 1), w - 1, 1)
    init, final, seq = "init" in feats, "final" in feats, "seqidx" in feats
    used = (True, True, "bias" in feats, seq, init, True, final, True, init, True, "bias" in feats, True)
    apart = _apart(b, d, n)
    ptrs = [(i + 1) * apart * u for i, u in enumerate(used)]  # dx overlaps nothing
    none3 = (0, 0, 0)
    strides = [*act, w, 1, int("bias" in feats), *act, *act, *((n, 1) if seq else (0, 0)),
               *(state if init else none3), *(state if final else none3), *(state if init else none3),
               w, 1, int("bias" in feats)]
    return [ptrs, [b, d, n, w], strides, DTYPE_CODES[fam.x_dtype], DTYPE_CODES[fam.w_dtype], "silu" in feats]


_EXPLAIN = r"""
import json, sys
from cc1d._runtime import runtime   # sets the package dir to the installed package's
rt = runtime()
logs = []
rt.set_log_handler(logs.append)
a = json.loads(sys.stdin.read())
if a["package_dir"]:
    rt.set_package_dir(a["package_dir"])
out = []
for op, *call in a["calls"]:
    if op in ("fwd", "vfwd"):
        e = (rt.explain_fwd if op == "fwd" else rt.explain_varlen)(*call, 0, a["arch"])
    else:
        e = (rt.explain_bwd if op == "bwd" else rt.explain_upd)(*call, arch=a["arch"])
    out.append({k: e[k] for k in ("reason", "source", "key", "matched_shape", "detail")})
print(json.dumps({"explained": out, "logs": logs}))
"""


def explain_in_fresh_process(calls, arch, tmp_path, package_dir=None) -> dict:
    """The dispatcher's answers with no caller DB, no CC1D_TUNING_DB and an empty user DB
    folder, so only the shipped DB (then the catalog) can answer."""
    env = {**os.environ, "CC1D_CACHE_DIR": str(tmp_path / "cache"), "CC1D_TUNING_DB": "", "CC1D_LOG": ""}
    env.pop("CC1D_PACKAGE_DIR", None)
    r = subprocess.run([sys.executable, "-P", "-c", _EXPLAIN],
                       input=json.dumps(dict(calls=calls, arch=arch, package_dir=package_dir and str(package_dir))),
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_runtime_serves_every_winner_from_the_installed_package(shipped, tmp_path):
    """A fresh process with only the installed package's DB serves each winner's own shape
    from that winner ("exact"), through the kernel the tuner timed there (_served_key)."""
    import cc1d
    installed = Path(cc1d.__file__).resolve().parent / "tuning_db" / shipped.name
    if not installed.is_file():
        pytest.skip("not installed: test_installed_with_the_package fails")
    with TuningDB(shipped, readonly=True) as db:
        winners = db.winners(shipped.stem)
    calls = [call_for(w["family_key"], w["batch"], w["dim"], w["seqlen"], w["features"]) for w in winners]
    res = explain_in_fresh_process(calls, shipped.stem, tmp_path)
    assert res["logs"] == [], res["logs"][:10]  # no entry skipped, no file refused
    wrong = [f"{w['family_key']} {w['shape_key']}: {e}" for w, e in zip(winners, res["explained"])
             if (e["reason"], e["source"], e["key"], e["matched_shape"]) !=
             ("exact", str(installed), _served_key(w, shipped.stem), w["shape_key"])]
    assert not wrong, "\n".join(wrong[:20])


def _served_key(winner: dict, arch: str) -> str:
    """The kernel key the runtime serves a winner's own shape with: its realigned twin where
    the tuned sequence puts rows off its vectors or cuts a segment the twin moves, its
    walk-cut build where the sequence cuts a walked segment (what the tuner times,
    tuner/evaluate.py _kernel), else the winner's own key."""
    feats = set(winner["features"].split(","))
    build = winner_variant(winner).served_build(winner["seqlen"], arch, seq_idx="seqidx" in feats,
                                                final_states="final" in feats)
    return winner["variant_key"] + ("" if build == "plain" else "." + build)


def test_a_db_in_the_package_dir_serves_the_dispatcher(tmp_path):
    """The shipped-DB path end to end: a DB made with the tuner's DB layer and
    finalized, placed as <dir>/tuning_db/sm_90.db, set_package_dir(dir)."""
    fam = families("fwd", "cf")[0]
    # not the catalog's choice, and usable at the calls' alignment (32 bytes or more)
    v = next(v for v in variants(fam) if v.geometry()["align_bytes"] <= 16 and v != default_variant(fam))
    shipped = tmp_path / "pkg" / "tuning_db" / "sm_90.db"
    with TuningDB(shipped) as db:
        db.put_winner(v.source, arch="sm_90", family_key=fam.key(), shape_key="b2.d64.l128.bias.silu",
                      op="fwd", batch=2, dim=64, seqlen=128, features="bias,silu", variant_key=v.key(),
                      config=v.params, **v.geometry(), time_us=1.0, environment={"device": "test"})
        db.finalize()
    assert sorted(p.name for p in shipped.parent.iterdir()) == ["sm_90.db"]
    calls = [call_for(fam.key(), 2, 64, 128, "bias,silu"), call_for(fam.key(), 4, 96, 1000, "bias,silu"),
             call_for(fam.key(), 2, 64, 128, "bias,silu")]
    res = explain_in_fresh_process(calls, "sm_90", tmp_path, package_dir=tmp_path / "pkg")
    exact, near, _ = res["explained"]
    assert (exact["reason"], exact["source"], exact["key"]) == ("exact", str(shipped), v.key())
    assert (near["reason"], near["source"], near["matched_shape"]) == ("nearest", str(shipped),
                                                                        "b2.d64.l128.bias.silu")
    assert res["logs"] == []
    # another arch does not read it
    other = explain_in_fresh_process(calls[:1], "sm_80", tmp_path, package_dir=tmp_path / "pkg")
    assert (other["explained"][0]["reason"], other["explained"][0]["source"]) == ("default", "catalog")


def _shape_of(family_key: str, batch: int, dim: int, seqlen: int, feats: set):
    from cc1d.tuner.shapes import Shape
    fam = family_from_key(family_key)
    return Shape(fam.op, fam.layout, fam.x_dtype, fam.w_dtype, fam.width, batch, dim, seqlen, bias="bias" in feats,
                 activation="silu" if "silu" in feats else "none", seq_idx="seqidx" in feats,
                 initial_states="init" in feats, final_states="final" in feats, state_indices="pool" in feats,
                 width_state="wstate" in feats)


def test_the_tuners_served_winner_is_the_dispatchers_pick(tmp_path):
    """`cc1d-tune --start-from` starts a shape from the winner the dispatcher serves its calls
    (tuner/serving.py served_winner, the rule of docs/DISPATCH.md in Python), and the moves
    benchmarks name the kernel a call runs by it. Calls near the shipped shapes, some with a
    feature more or less, forwards and backwards of shorter and longer sequences (whole
    16-byte vectors: the tuner's kernel choice misfits and cut segments,
    Variant.twin_takes_cut and walk_cut_takes), and every call of the moves grid (tuner/moves.py grid_calls),
    midway calls included, get the same kernel from the runtime. A midway call ranks two
    entries exactly alike; the first in the runtime's entry order serves it (session 73:
    the tuner took the first by shape key, and named the wrong kernel at 56 grid calls)."""
    from cc1d.tuner.moves import grid_calls, snapshot
    from cc1d.tuner.serving import dispatch_rank, served_winner
    shipped = REPO / "tuning_db" / "sm_90.db"
    with TuningDB(shipped, readonly=True) as db:
        winners = db.winners("sm_90")
        shapes = []
        for w in winners:
            feats = {f for f in w["features"].split(",") if f}
            alt = feats ^ ({"wstate"} if w["op"] == "upd" else {"bias"})
            lengths = [(w["batch"], w["dim"], max(w["seqlen"] * k // 32 * 8, 8), feats) for k in (1, 3, 5)] \
                if w["op"] in ("fwd", "bwd") else []
            for b, d, n, f in [(w["batch"] * 3, w["dim"], w["seqlen"], feats),
                               (w["batch"], w["dim"] * 3 // 2, w["seqlen"], feats),
                               (w["batch"], w["dim"], w["seqlen"], alt), *lengths]:
                shapes.append((w["family_key"], _shape_of(w["family_key"], b, d, n, f)))
        near = len(shapes)
        for (_, family_key), rows in sorted(snapshot(db).items()):
            shapes += [(family_key, shape) for _, _, shape in grid_calls(family_key, rows)]
        probes, expected, midway = [], [], 0
        for family_key, shape in shapes:
            ranks = sorted(dispatch_rank(shape, r, "sm_90") for r in winners if r["family_key"] == family_key)
            midway += len(ranks) > 1 and ranks[0] == ranks[1]
            probes.append(call_for(family_key, shape.batch, shape.dim, shape.seqlen, ",".join(shape.features())))
            row = served_winner(db, "sm_90", shape)
            v = winner_variant(row)
            feats = dict(seq_idx=shape.seq_idx, final_states=shape.final_states)
            build = ".realign" if v.twin_takes_cut(shape.seqlen, "sm_90", **feats) else \
                ".walkcut" if v.walk_cut_takes(shape.seqlen, "sm_90", **feats) else ""
            expected.append((family_key, shape.key(), row["variant_key"] + build))
    assert near > 2 * len(winners) and len(shapes) > near + 1000
    assert midway > 100  # the grid's midway calls are in
    assert any(key.endswith(".realign") for *_, key in expected)  # some cut a held backward segment
    assert any(key.endswith(".walkcut") for *_, key in expected)  # some a walked one
    res = explain_in_fresh_process(probes, "sm_90", tmp_path, package_dir=REPO)
    wrong = [f"{fam} {key}: tuner {want}, runtime {e['key']} ({e['reason']} {e['matched_shape']})"
             for (fam, key, want), e in zip(expected, res["explained"]) if e["key"] != want]
    assert not wrong, "\n".join(wrong[:20])
