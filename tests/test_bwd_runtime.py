"""The backward's runtime entry points through the pybind11 layer, without torch or
a GPU: argument checks (each error the right Python type, naming the field),
the workspace size (splits arithmetic), and dispatch of bwd families (catalog
and tuning-DB chain, alignment requirements).

Pointers are fake, well-aligned and far apart: every check runs before memory is
touched, and select/explain/bwd_workspace_bytes with an explicit arch need no GPU.
"""
from __future__ import annotations

import math

import pytest

from cc1d.generator import Family, fallback_chain, families

ARCH = "sm_999"  # nobody tunes it: only the DBs these tests build are consulted
BF16, F16, F32 = 2, 1, 0
GB = 1 << 32  # tensors 4 GiB apart: no accidental overlap, any alignment we ask for
X, W, B, SEQ, IS, DOUT, DFS, DX, DIS, DW, DB, PART = (i * GB for i in range(1, 13))
PTRS = (X, W, B, 0, 0, DOUT, 0, DX, 0, DW, DB, PART)
N_STRIDES = 26


@pytest.fixture
def rt(clean_rt):  # conftest.py: no caller DB, an empty memo, restored after
    return clean_rt


def strides(b=2, d=16, l=128, w=4, layout="cf", *, x=None, dout=None, dx=None, wt=(4, 1), bias=1,
            seq=(0, 0), is_=(0, 0, 0), dfs=(0, 0, 0), dis=(0, 0, 0), dw=(4, 1), db=1):
    """The 26 BwdParams strides of a contiguous call (x, dout and dx alike unless given)."""
    contiguous = (d * l, l, 1) if layout == "cf" else (d * l, 1, d)
    x = x or contiguous
    s = (*x, *wt, bias, *(dout or contiguous), *(dx or contiguous), *seq, *is_, *dfs, *dis, *dw, db)
    assert len(s) == N_STRIDES
    return s


def args(*, sizes=(2, 16, 128, 4), layout="cf", ptrs=PTRS, x_dtype=BF16, w_dtype=F32, silu=True, **kw):
    b, d, l, w = sizes
    return ptrs, sizes, strides(b, d, l, w, layout, **kw), x_dtype, w_dtype, silu


def bwd(rt, workspace=1 << 30, **kw):
    rt.bwd(*args(**kw), workspace, 0)


def with_ptr(i, value, ptrs=PTRS):
    p = list(ptrs)
    p[i] = value
    return tuple(p)


STATE = (4 * 3, 3, 1)  # (batch, dim, w) strides of a (2, 16, 3) state


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(sizes=(2, 16, 128, 1)), ValueError, r"width must be in \[2, 8\], got 1"),
    (dict(sizes=(2, 16, 128, 9)), ValueError, r"width must be in \[2, 8\], got 9"),
    (dict(sizes=(0, 16, 128, 4)), ValueError, "batch must be >= 1, got 0"),
    (dict(sizes=(2, 0, 128, 4)), ValueError, "dim must be >= 1, got 0"),
    (dict(sizes=(2, 16, 0, 4)), ValueError, "seqlen must be >= 1, got 0"),
    (dict(x_dtype=5), TypeError, "x_dtype must be 0 .f32., 1 .f16. or 2 .bf16., got 5"),
    (dict(w_dtype=7), TypeError, "w_dtype must be"),
    (dict(x_dtype=F16, w_dtype=BF16), TypeError, r"weight dtype must equal x dtype \(f16\) or be f32, got bf16"),
    (dict(ptrs=with_ptr(0, 0)), ValueError, "x must not be null"),
    (dict(ptrs=with_ptr(1, 0)), ValueError, "weight must not be null"),
    (dict(ptrs=with_ptr(5, 0)), ValueError, "dout must not be null"),
    (dict(ptrs=with_ptr(7, 0)), ValueError, "dx must not be null"),
    (dict(ptrs=with_ptr(9, 0)), ValueError, "dweight must not be null"),
    (dict(ptrs=with_ptr(11, 0)), ValueError, "partials .the workspace. must not be null"),
    (dict(ptrs=with_ptr(11, PART + 8)), ValueError, "partials .the workspace. must be 16-byte aligned"),
    (dict(ptrs=with_ptr(8, DIS)), ValueError, "dinitial_states is given but initial_states is null"),
    (dict(ptrs=with_ptr(10, DB, with_ptr(2, 0))), ValueError, "dbias is given but bias is null"),
    (dict(ptrs=with_ptr(0, X + 1)), ValueError, r"x must be aligned to its element size \(2 bytes\)"),
    (dict(ptrs=with_ptr(5, DOUT + 1)), ValueError, r"dout must be aligned to its element size \(2 bytes\)"),
    (dict(ptrs=with_ptr(7, DX + 1)), ValueError, r"dx must be aligned to its element size \(2 bytes\)"),
    (dict(ptrs=with_ptr(1, W + 2)), ValueError, r"weight must be aligned to its element size \(4 bytes\)"),
    (dict(ptrs=with_ptr(9, DW + 2)), ValueError, r"dweight must be aligned to its element size \(4 bytes\)"),
    (dict(ptrs=with_ptr(10, DB + 2)), ValueError, r"dbias must be aligned to its element size \(4 bytes\)"),
    (dict(x=(2048, 2, 2)), ValueError, "x must have x_l_stride == 1 .channel-first. or x_dim_stride == 1"),
    (dict(dout=(2048, 1, 16)), ValueError, "dout_l_stride must be 1 like x_l_stride .channel-first layout"),
    (dict(dx=(2048, 1, 16)), ValueError, "dx_l_stride must be 1 like x_l_stride .channel-first layout"),
    (dict(layout="cl", dout=(2048, 128, 1)), ValueError,
     "dout_dim_stride must be 1 like x_dim_stride .channel-last layout"),
    (dict(layout="cl", dx=(2048, 128, 1)), ValueError, "dx_dim_stride must be 1 like x_dim_stride .channel-last"),
    (dict(x=(-2048, 128, 1)), ValueError, "x_batch_stride must be >= 0"),
    (dict(dout=(-2048, 128, 1)), ValueError, "dout_batch_stride must be >= 0"),
    (dict(dx=(2048, -128, 1)), ValueError, "dx_dim_stride must be >= 0"),
    (dict(wt=(-4, 1)), ValueError, "w_dim_stride must be >= 0"),
    (dict(dw=(4, -1)), ValueError, "dw_width_stride must be >= 0"),
    (dict(bias=-1), ValueError, "bias_stride must be >= 0"),
    (dict(db=-1), ValueError, "db_stride must be >= 0"),
    (dict(ptrs=with_ptr(3, SEQ), seq=(128, -1)), ValueError, "seq_l_stride must be >= 0"),
    (dict(ptrs=with_ptr(4, IS), is_=(48, 3, -1)), ValueError, "is_w_stride must be >= 0"),
    (dict(ptrs=with_ptr(6, DFS), dfs=(48, -3, 1)), ValueError, "dfs_dim_stride must be >= 0"),
    (dict(ptrs=with_ptr(8, DIS, with_ptr(4, IS)), is_=STATE, dis=(-48, 3, 1)), ValueError,
     "dis_batch_stride must be >= 0"),
    (dict(x=(1 << 62, 128, 1)), ValueError, "x: extent in bytes overflows int64"),
    (dict(dx=(2048, 1 << 62, 1)), ValueError, "dx: offset of the last element overflows int64"),
    (dict(dw=(1 << 62, 1)), ValueError, "dweight: offset of the last element overflows int64"),
    (dict(ptrs=with_ptr(7, DOUT)), ValueError, "dx must not overlap dout .the kernel reads dout's neighbours"),
    (dict(ptrs=with_ptr(7, DOUT + 2048)), ValueError, "dx must not overlap dout"),
    (dict(ptrs=with_ptr(7, X)), ValueError, "dx must not overlap x .the kernel reads x's neighbours"),
    (dict(ptrs=with_ptr(7, X - 64)), ValueError, "dx must not overlap x"),
])
def test_bad_arguments_raise_precise_errors(rt, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        bwd(rt, **kwargs)


def test_valid_call_without_a_gpu_is_a_runtime_error(rt):
    with pytest.raises(RuntimeError, match="no GPU backend owns pointer"):
        bwd(rt)
    # every optional tensor given, channel-last: still only the missing device is wrong
    ptrs = (X, W, B, SEQ, IS, DOUT, DFS, DX, DIS, DW, DB, PART)
    with pytest.raises(RuntimeError, match="no GPU backend owns pointer"):
        bwd(rt, layout="cl", ptrs=ptrs, seq=(128, 1), is_=STATE, dfs=STATE, dis=STATE)


def test_x_may_be_dout_and_dbias_may_be_left_out(rt):
    # x == dout (both read only) and bias without dbias are valid: the device is what is missing
    with pytest.raises(RuntimeError, match="no GPU backend owns pointer"):
        bwd(rt, ptrs=with_ptr(10, 0, with_ptr(5, X)))


def test_dx_adjacent_to_x_is_not_an_overlap(rt):
    nbytes = 2 * 16 * 128 * 2
    with pytest.raises(RuntimeError, match="no GPU backend owns pointer"):
        bwd(rt, ptrs=with_ptr(7, X + nbytes))
    with pytest.raises(ValueError, match="dx must not overlap x"):
        bwd(rt, ptrs=with_ptr(7, X + nbytes - 2))


# ---- workspace size ---------------------------------------------------------

def expected_splits(b, d, l, tile_l, tile_d, split_blocks, layout="cf"):
    """The documented rule (cc1d.h, causal_conv1d_bwd), computed independently:
    split_blocks / groups rounded up channel-first, down channel-last."""
    items = b * math.ceil(l / tile_l)
    groups = min(math.ceil(d / tile_d), 65535)
    per_group = math.floor(split_blocks / groups) if layout == "cl" else math.ceil(split_blocks / groups)
    return max(1, min(items, per_group))


def variant(tile_l, tile_d, split_blocks=2048, key="bwd.cf.bf16wf32.w4.test", align=2):
    return dict(key=key, hash="0" * 64, source="", threads=128, tile_l=tile_l, tile_d=tile_d, smem_bytes=0,
                align_bytes=align, split_blocks=split_blocks)


@pytest.mark.parametrize("sizes, tiles, splits", [
    ((2, 16, 128, 4), (64, 8, 2048), 4),            # items = 2 * 2 = 4 < 2048 / 2
    ((8, 4096, 4096, 4), (64, 8, 2048), 4),         # groups 512: ceil(2048 / 512) = 4 < items 512
    ((8, 4096, 4096, 4), (64, 8, 8192), 16),        # groups 512: ceil(8192 / 512) = 16
    ((8, 4096, 4096, 4), (64, 8, 512), 1),          # groups 512: ceil(512 / 512) = 1
    ((1, 8, 64 * 3000, 4), (64, 8, 2048), 2048),    # one group: 2048 < items 3000
    ((1, 8, 64 * 3000, 4), (64, 8, 8192), 3000),    # one group: items 3000 < 8192
    ((1, 8, 1, 4), (64, 8, 2048), 1),               # one item
    ((3, 100, 10, 2), (4, 3, 2048), 9),             # items 3 * 3 = 9; groups 34, ceil(2048 / 34) = 61
    ((3, 100, 10, 2), (4, 3, 7), 1),                # groups 34 > 7 blocks: one split
    ((1, 8 * 70000, 64, 8), (64, 8, 2048), 1),      # 70000 groups clamp to 65535: ceil(2048 / 65535) = 1
])
def test_launch_bwd_states_the_workspace_rule(rt, sizes, tiles, splits):
    check_workspace_rule(rt, sizes, tiles, splits, "cf")


# Channel-last rounds split_blocks / groups down: the grid stays within split_blocks.
@pytest.mark.parametrize("sizes, tiles, splits", [
    ((2, 4096, 2048, 4), (32, 64, 660), 10),        # groups 64: floor(660 / 64) = 10 (640 blocks), items 128
    ((8, 5120, 2048, 4), (16, 128, 528), 13),       # groups 40: floor(528 / 40) = 13 (520 blocks)
    ((2, 16, 128, 4), (64, 8, 660), 4),             # items = 2 * 2 = 4 < 660 / 2
    ((1, 8 * 1000, 64, 4), (64, 8, 660), 1),        # groups 1000 > 660: floor is 0, one split
])
def test_launch_bwd_states_the_channel_last_workspace_rule(rt, sizes, tiles, splits):
    check_workspace_rule(rt, sizes, tiles, splits, "cl")


def check_workspace_rule(rt, sizes, tiles, splits, layout):
    b, d, l, w = sizes
    assert expected_splits(b, d, l, *tiles, layout) == splits
    need = splits * d * (w + 1) * 4
    a = args(sizes=sizes, w_dtype=F32, layout=layout)
    key = f"bwd.{layout}.bf16wf32.w{w}.test"
    with pytest.raises(ValueError, match=rf"workspace_bytes must be >= {need} \(splits {splits} x dim {d} x "
                                         rf"\(width \+ 1\) x 4 bytes, for variant .*\), got {need - 1}"):
        rt.launch_bwd(variant(*tiles, key=key), *a, need - 1, 0)
    with pytest.raises(RuntimeError, match="no GPU backend owns pointer"):  # enough: on to the device
        rt.launch_bwd(variant(*tiles, key=key), *a, need, 0)


@pytest.mark.parametrize("split_blocks", [0, -5])
def test_launch_bwd_needs_split_blocks(rt, split_blocks):
    v = variant(64, 8, split_blocks)
    with pytest.raises(ValueError, match=rf"split_blocks must be >= 1 for the backward, got {split_blocks}"):
        rt.launch_bwd(v, *args(), 1 << 20, 0)
    del v["split_blocks"]  # a hand-made dict without it: 0
    with pytest.raises(ValueError, match="split_blocks must be >= 1 for the backward, got 0"):
        rt.launch_bwd(v, *args(), 1 << 20, 0)


BWD_FAMILIES = [f for f in families() if f.op == "bwd"]


@pytest.mark.parametrize("fam", BWD_FAMILIES, ids=lambda f: f.key())
def test_workspace_bytes_follow_the_selected_variant(rt, fam):
    dt = {"f32": F32, "f16": F16, "bf16": BF16}
    for sizes in ((2, 16, 128), (8, 2048, 4096), (1, 100, 7), (4, 6000, 1000)):
        b, d, l = sizes
        a = args(sizes=(*sizes, fam.width), layout=fam.layout, x_dtype=dt[fam.x_dtype], w_dtype=dt[fam.w_dtype],
                 dw=(fam.width, 1), wt=(fam.width, 1))
        a = (with_ptr(11, 0, a[0]), *a[1:])  # no workspace yet: not looked at
        v = rt.select_bwd(*a, arch=ARCH)
        assert v["key"].startswith(fam.key() + ".")
        splits = expected_splits(b, d, l, v["tile_l"], v["tile_d"], v["split_blocks"], fam.layout)
        want = splits * d * (fam.width + 1) * 4
        assert rt.bwd_workspace_bytes(*a, arch=ARCH) == want


def test_workspace_bytes_checks_the_arguments_but_not_the_workspace(rt):
    a = args()
    assert rt.bwd_workspace_bytes(with_ptr(11, 0), *a[1:], arch=ARCH) > 0
    assert rt.bwd_workspace_bytes(with_ptr(11, PART + 4), *a[1:], arch=ARCH) > 0
    with pytest.raises(ValueError, match="dout must not be null"):
        rt.bwd_workspace_bytes(with_ptr(5, 0), *a[1:], arch=ARCH)
    with pytest.raises(ValueError, match="target"):
        rt.bwd_workspace_bytes(*a, arch="tpu_v4")


def test_workspace_bytes_without_arch_or_device_use_the_catalog(rt):
    a = args()
    e = rt.explain_bwd(*a)
    assert e["reason"] == "default" and e["arch"] == ""
    v = e["variant"]
    assert rt.bwd_workspace_bytes(*a) == expected_splits(2, 16, 128, v["tile_l"], v["tile_d"], v["split_blocks"]) * 16 * 5 * 4


# ---- dispatch -----------------------------------------------------------------

def test_the_catalog_has_backward_families_with_general_fallbacks(rt):
    entries = [e for e in rt.catalog() if e["family"].startswith("bwd.")]
    fams = {e["family"] for e in entries}
    assert fams == {f.key() for f in BWD_FAMILIES}
    for fam in fams:
        chain = [e for e in entries if e["family"] == fam]
        assert chain[-1]["align_bytes"] == (4 if ".f32w" in fam else 2), fam


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("offset", [0, 2, 4, 8, 16, 32])
def test_select_bwd_meets_the_alignment_of_x_dout_and_dx(rt, layout, offset):
    fam = Family("bwd", layout, "bf16", "bf16", 4)
    chain = fallback_chain(fam)
    for which in (0, 5, 7):  # the offset on x, dout or dx alone
        ptrs = with_ptr(which, PTRS[which] + offset)
        a = args(sizes=(2, 128, 128, 4), layout=layout, ptrs=ptrs, w_dtype=BF16)  # strides: 256-byte multiples
        e = rt.explain_bwd(*a, arch=ARCH)
        align = min(256, offset & -offset) if offset else 256
        assert e["alignment"] == align
        assert e["key"].startswith(fam.key() + ".")
        assert align % e["variant"]["align_bytes"] == 0
        # the catalog's first variant of the chain the call allows
        first = next(v for v in chain if align % v.geometry()["align_bytes"] == 0)
        assert e["key"] == first.key() and e["reason"] == "default"
        assert rt.select_bwd(*a, arch=ARCH)["key"] == e["key"]


def test_outer_strides_count_for_the_alignment(rt):
    # channel-first: dout's dim stride of 129 elements leaves 2-byte alignment
    a = args(w_dtype=BF16, dout=(16 * 129, 129, 1))
    e = rt.explain_bwd(*a, arch=ARCH)
    assert e["alignment"] == 2 and e["variant"]["align_bytes"] == 2


FWD_PTRS = (X, W, B, 0, 0, DOUT, 0)
FWD_STRIDES = (2048, 128, 1, 4, 1, 1, 2048, 128, 1, 0, 0, 0, 0, 0, 0, 0, 0)  # args()'s call, forward


def test_forward_and_backward_decisions_do_not_share_a_memo_entry(rt):
    f = rt.select_fwd(FWD_PTRS, (2, 16, 128, 4), FWD_STRIDES, BF16, F32, True, 0, ARCH)
    b = rt.select_bwd(*args(), arch=ARCH)
    assert f["key"].startswith("fwd.cf.bf16wf32.w4.") and b["key"].startswith("bwd.cf.bf16wf32.w4.")
    assert rt.select_fwd(FWD_PTRS, (2, 16, 128, 4), FWD_STRIDES, BF16, F32, True, 0, ARCH) == f


def test_launch_bwd_checks_the_variant_against_the_call(rt):
    a = args()
    fwd_v = variant(64, 8, key="fwd.cf.bf16wf32.w4.test")
    with pytest.raises(ValueError, match="does not serve this call, whose family is bwd.cf.bf16wf32.w4"):
        rt.launch_bwd(fwd_v, *a, 1 << 30, 0)
    with pytest.raises(ValueError, match="needs x/dout/dx base addresses and batch/outer strides aligned to 512"):
        rt.launch_bwd(variant(64, 8, align=512), *a, 1 << 30, 0)
    with pytest.raises(ValueError, match="tile_l"):
        rt.launch_bwd(variant(0, 8), *a, 1 << 30, 0)
    v = variant(64, 8)
    del v["tile_d"]
    with pytest.raises(ValueError, match="tile_d"):
        rt.launch_bwd(v, *a, 1 << 30, 0)


def tuned_bwd_db(path, entries) -> str:
    """A finalized tuning DB of backward winners for ARCH: (variant, (batch, dim, seqlen)),
    each tuned with bias and SiLU. Returns its path."""
    from cc1d.tuner.db import TuningDB
    with TuningDB(path) as db:
        for v, (b, d, l) in entries:
            db.put_winner(v.source, arch=ARCH, family_key=v.family.key(), shape_key=f"b{b}.d{d}.l{l}.bias.silu",
                          op="bwd", batch=b, dim=d, seqlen=l, features="bias,silu", variant_key=v.key(),
                          config=v.params, source_hash=v.hash(), **v.geometry(), time_us=10.0,
                          environment={"device": "test"})
        db.finalize()
    return str(path)


def test_tuned_backward_winners_are_found_along_the_chain(rt, tmp_path):
    fam = Family("bwd", "cf", "bf16", "f32", 4)
    chain = fallback_chain(fam)
    tuned = chain[-1]  # not the catalog's first choice, so a hit shows
    b, d, l = 2, 16, 128
    path = tuned_bwd_db(tmp_path / "bwd.db", [(tuned, (b, d, l))])
    rt.set_tuning_dbs([path])
    a = args()
    e = rt.explain_bwd(*a, arch=ARCH)
    assert (e["reason"], e["key"], e["source"]) == ("exact", tuned.key(), str(path))
    g = tuned.geometry()
    assert rt.bwd_workspace_bytes(*a, arch=ARCH) == expected_splits(b, d, l, g["tile_l"], g["tile_d"], g["split_blocks"]) * d * 5 * 4
    # another shape: the nearest tuned one; the forward of the same call is not served by it
    assert rt.explain_bwd(*args(sizes=(4, 32, 256, 4)), arch=ARCH)["reason"] == "nearest"
    fwd = rt.explain_fwd(FWD_PTRS, (b, d, l, 4), FWD_STRIDES, BF16, F32, True, 0, ARCH)
    assert fwd["reason"] == "default" and fwd["key"].startswith("fwd.")


def _bwd_cf(**config):
    from cc1d.generator import Variant
    fam = Family("bwd", "cf", "bf16", "bf16", 4)
    return Variant.of(fam, **{"vec_bytes": 16, "rows": 1, "max_regs": 128, "split_blocks": 512, **config})


LONG_TILES = _bwd_cf(threads=128, nvec=16, max_regs=96)   # 16384-position tiles of four 4096-position segments
TILES_2048 = _bwd_cf(threads=64, nvec=4)                   # 2048-position tiles of two 1024-position segments
TILES_512 = _bwd_cf(threads=128, nvec=2, rows=4, max_regs=96)  # 512 a row, one 512-position segment


def test_nearest_backward_passes_over_tiles_more_than_twice_the_sequence(rt, tmp_path):
    """A channel-first backward block runs its tile's segments side by side: an entry whose
    tiles of several segments are more than twice the call's sequence ranks behind every
    entry that fits, however near (session 62, H200: (8, 5120, 4096) took 430.9 us on the (1, 5376, 32768) winner's
    16384-position tiles, 286.4 on the (8, 5120, 2048) winner's)."""
    assert (LONG_TILES.geometry()["tile_l"], TILES_2048.geometry()["tile_l"]) == (16384, 2048)
    entries = [(LONG_TILES, (8, 5376, 16384)), (TILES_2048, (8, 5120, 2048))]  # each nearest to two calls
    rt.set_tuning_dbs([tuned_bwd_db(tmp_path / "t.db", entries)])
    for seqlen, want in ((4096, TILES_2048), (8000, TILES_2048), (8192, LONG_TILES), (16384, LONG_TILES)):
        e = rt.explain_bwd(*args(sizes=(8, 5120, seqlen, 4), w_dtype=BF16), arch=ARCH)
        # (8000 cuts a segment: the twin serves, test_realign.py)
        assert (e["reason"], e["key"].removesuffix(".realign")) == ("nearest", want.key()), (seqlen, e["key"])
        assert "more than twice" not in e["detail"], e["detail"]


def test_nearest_backward_counts_batch_seqlen_and_dim_apart(rt, tmp_path):
    """The backward's distance (docs/DISPATCH.md, session 68): |ln batch| + 2 |ln seqlen| +
    0.5 |ln dim| apart. (4, 64, 2048) has the (16, 64, 512) entry's work, which the
    forward's batch x seqlen axis would take; the backward takes the (1, 64, 4096) one."""
    entries = [(TILES_2048, (1, 64, 4096)), (TILES_512, (16, 64, 512))]
    rt.set_tuning_dbs([tuned_bwd_db(tmp_path / "t.db", entries)])
    e = rt.explain_bwd(*args(sizes=(4, 64, 2048, 4), w_dtype=BF16), arch=ARCH)
    assert (e["reason"], e["key"], e["matched_shape"]) == ("nearest", TILES_2048.key(), "b1.d64.l4096.bias.silu")
    assert e["distance"] == pytest.approx(math.log(4) + 2 * math.log(2))
    e = rt.explain_bwd(*args(sizes=(16, 128, 1024, 4), w_dtype=BF16), arch=ARCH)
    assert (e["matched_shape"], e["distance"]) == ("b16.d64.l512.bias.silu", pytest.approx(2.5 * math.log(2)))


def test_a_far_backward_entry_is_one_further_than_a_seqlen_factor_of_2(rt, tmp_path):
    rt.set_tuning_dbs([tuned_bwd_db(tmp_path / "t.db", [(TILES_512, (2, 64, 1024))])])
    far = "it is far from this call"
    for sizes in ((2, 64, 2048), (4, 64, 1024), (2, 256, 1024), (2, 64, 600)):  # 2 ln 2 or less
        assert far not in rt.explain_bwd(*args(sizes=(*sizes, 4), w_dtype=BF16), arch=ARCH)["detail"], sizes
    for sizes in ((2, 64, 2100), (16, 64, 1024), (4, 64, 2048)):
        e = rt.explain_bwd(*args(sizes=(*sizes, 4), w_dtype=BF16), arch=ARCH)
        assert e["distance"] > 2 * math.log(2), sizes
        assert (f"{far} (distance {e['distance']:.2f}, further than a seqlen factor of 2 alone), so its kernel "
                "may fit the call poorly") in e["detail"], e["detail"]


def test_nearest_backward_passes_over_segments_longer_than_the_sequence(rt, tmp_path):
    """As the forward's, for held segments: no row would run a whole segment on the fast path
    (session 62, H200: (2, 4096, 1000) took 90.2 us on 1024-position segments, 39.3 on 512)."""
    rt.set_tuning_dbs([tuned_bwd_db(tmp_path / "t.db", [(TILES_2048, (2, 4096, 2048)), (TILES_512, (1, 5120, 512))])])
    for seqlen, want in ((1000, TILES_512), (1016, TILES_512), (1024, TILES_2048), (1536, TILES_2048)):
        e = rt.explain_bwd(*args(sizes=(2, 4096, seqlen, 4), w_dtype=BF16), arch=ARCH)
        assert e["key"].removesuffix(".realign") == want.key(), (seqlen, e["key"])


def test_walked_segments_longer_than_the_sequence_misfit_only_through_the_twin(rt, tmp_path):
    """Walked segments take a short sequence well on aligned rows ((2, 4096, 1000): 28.8 us on
    2048-position segments in their plain build; since session 75 it runs their walk-cut
    build), not through their twin, which rows off the vectors need ((2, 4096, 1001): 49.2
    us, against 39.6 on held 512-position segments)."""
    walked = _bwd_cf(threads=128, nvec=8, rows=4, max_regs=255)
    assert walked.geometry()["tile_l"] == 2048 and "#define CC1D_BWD_WALKED 1\n" in walked.source
    assert "#define CC1D_BWD_WALKED 0\n" in TILES_512.source
    rt.set_tuning_dbs([tuned_bwd_db(tmp_path / "t.db", [(walked, (2, 4096, 2048)), (TILES_512, (1, 5120, 512))])])
    for seqlen, want in ((1000, walked.key() + ".walkcut"), (1001, TILES_512.key() + ".realign"),
                         (2047, TILES_512.key() + ".realign"), (2049, walked.key() + ".realign")):
        e = rt.explain_bwd(*args(sizes=(2, 4096, seqlen, 4), w_dtype=BF16), arch=ARCH)
        assert e["key"] == want, (seqlen, e["key"])


def test_a_misfit_nearest_backward_says_why_where_none_fits(rt, tmp_path):
    rt.set_tuning_dbs([tuned_bwd_db(tmp_path / "t.db", [(LONG_TILES, (1, 5376, 32768))])])
    e = rt.explain_bwd(*args(sizes=(8, 5120, 4096, 4), w_dtype=BF16), arch=ARCH)
    assert (e["reason"], e["key"]) == ("nearest", LONG_TILES.key())
    assert ("its tiles (16384 positions, 4 segments side by side) are more than twice this call's sequence, so "
            "most of each block's warps idle, and no tuned entry's kernel fits the call: cc1d-tune this shape"
            ) in e["detail"]
    e = rt.explain_bwd(*args(sizes=(8, 5120, 8192, 4), w_dtype=BF16), arch=ARCH)
    assert "no tuned entry's kernel fits the call" not in e["detail"], e["detail"]
    rt.set_tuning_dbs([tuned_bwd_db(tmp_path / "held.db", [(TILES_2048, (8, 5120, 2048))])])
    e = rt.explain_bwd(*args(sizes=(8, 5120, 1000, 4), w_dtype=BF16), arch=ARCH)
    assert ("its kernel's segments (1024 positions) are longer than this call's sequence, so no row runs a whole "
            "segment on the fast path, and no tuned entry's kernel fits the call: cc1d-tune this shape") in e["detail"]


# ---- the partial-sum layout (split_blocks) from a tuning DB ---------------------

def _with_split_blocks(variant, split_blocks):
    from cc1d.generator import Variant
    return Variant.of(variant.family, **{**variant.params, "split_blocks": split_blocks})


@pytest.mark.parametrize("split_blocks", [512, 8192])
def test_a_tuned_split_blocks_sets_the_workspace(rt, tmp_path, split_blocks):
    fam = Family("bwd", "cf", "bf16", "f32", 4)
    tuned = _with_split_blocks(fallback_chain(fam)[0], split_blocks)
    assert f".s{split_blocks}" in tuned.key()
    b, d, l = 8, 64, 4096
    tuned_bwd_db(tmp_path / "bwd.db", [(tuned, (b, d, l))])
    rt.set_tuning_dbs([str(tmp_path / "bwd.db")])
    a = args(sizes=(b, d, l, 4), w_dtype=F32)
    e = rt.explain_bwd(*a, arch=ARCH)
    assert (e["reason"], e["variant"]["split_blocks"]) == ("exact", split_blocks)
    g = tuned.geometry()
    splits = expected_splits(b, d, l, g["tile_l"], g["tile_d"], split_blocks)
    assert rt.bwd_workspace_bytes(*a, arch=ARCH) == splits * d * 5 * 4


def test_a_schema_1_db_runs_its_backward_winners_with_2048_blocks(rt, tmp_path):
    import sqlite3
    fam = Family("bwd", "cf", "bf16", "f32", 4)
    tuned = _with_split_blocks(fallback_chain(fam)[0], 512)
    path = tmp_path / "v1.db"
    tuned_bwd_db(path, [(tuned, (2, 16, 128))])
    con = sqlite3.connect(path)  # what a schema-1 tuner wrote: no split_blocks column
    con.execute("ALTER TABLE winners DROP COLUMN split_blocks")
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    rt.set_tuning_dbs([str(path)])
    e = rt.explain_bwd(*args(), arch=ARCH)
    assert (e["reason"], e["key"], e["variant"]["split_blocks"]) == ("exact", tuned.key(), 2048)


def test_a_backward_row_without_split_blocks_is_skipped(rt, tmp_path):
    import sqlite3
    fam = Family("bwd", "cf", "bf16", "f32", 4)
    path = tmp_path / "bad.db"
    tuned_bwd_db(path, [(fallback_chain(fam)[-1], (2, 16, 128))])
    con = sqlite3.connect(path)
    con.execute("UPDATE winners SET split_blocks = 0")
    con.commit()
    con.close()
    lines = []
    rt.set_log_handler(lines.append)
    try:
        rt.set_tuning_dbs([str(path)])
        assert rt.explain_bwd(*args(), arch=ARCH)["reason"] == "default"
    finally:
        rt.set_log_handler(None)
    assert any("split_blocks 0 out of range" in ln for ln in lines), lines
