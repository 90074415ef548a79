"""The decode update's runtime entry points through the pybind11 layer, without
torch or a GPU: argument checks (each error the right Python type, naming the
field), the layout of conv_state picking the family, and dispatch from the
catalog by alignment.

Pointers are fake, well-aligned and far apart: every check runs before memory is
touched, and select/explain with an explicit arch need no GPU.
"""
from __future__ import annotations

import pytest

from cc1d.generator import Family, fallback_chain, families

ARCH = "sm_999"  # nobody tunes it: the catalog decides
BF16, F16, F32 = 2, 1, 0
GB = 1 << 32
X, W, B, ST, SEQLENS, IDX, ACC, OUT = (i * GB for i in range(1, 9))
PTRS = (X, W, B, ST, 0, 0, 0, OUT)
N_STRIDES = 15
UPD_FAMILIES = families("upd")


@pytest.fixture
def rt(clean_rt):  # conftest.py: no caller DB, an empty memo, restored after
    return clean_rt


def strides(b=4, d=64, l=1, m=3, w=4, layout="cl", *, x=None, out=None, st=None, wt=None, bias=1,
            idx=(0, 0, 0)):
    """The 15 UpdParams strides of contiguous tensors: x/out (batch, dim, seqlen), conv_state
    (pool=b, dim, m) state_len-contiguous ("cf") or dim-contiguous ("cl")."""
    contiguous = (d * l, l, 1)
    state = (d * m, m, 1) if layout == "cf" else (d * m, 1, d)
    s = (*(x or contiguous), *(wt or (w, 1)), bias, *(st or state), *(out or contiguous), *idx)
    assert len(s) == N_STRIDES
    return s


def args(*, sizes=(4, 64, 1, 3, 4, 4), layout="cl", ptrs=PTRS, pad=-1, x_dtype=BF16, w_dtype=F32, silu=True,
         **kw):
    b, d, l, m, pool, w = sizes
    return ptrs, sizes, strides(b, d, l, m, w, layout, **kw), pad, x_dtype, w_dtype, silu


def with_ptr(i, value, ptrs=PTRS):
    p = list(ptrs)
    p[i] = value
    return tuple(p)


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(sizes=(4, 64, 1, 3, 4, 1)), ValueError, r"width must be in \[2, 8\], got 1"),
    (dict(sizes=(4, 64, 1, 8, 4, 9)), ValueError, r"width must be in \[2, 8\], got 9"),
    (dict(sizes=(0, 64, 1, 3, 4, 4)), ValueError, "batch must be >= 1, got 0"),
    (dict(sizes=(4, 0, 1, 3, 4, 4)), ValueError, "dim must be >= 1, got 0"),
    (dict(sizes=(4, 64, 0, 3, 4, 4)), ValueError, "seqlen must be >= 1, got 0"),
    (dict(sizes=(4, 64, 1, 2, 4, 4)), ValueError, r"conv_state: state_len must be >= width - 1 = 3 .*, got 2"),
    (dict(sizes=(4, 64, 1, 3, 0, 4)), ValueError, r"pool \(conv_state's first dimension\) must be >= 1, got 0"),
    (dict(sizes=(4, 64, 1, 3, 3, 4)), ValueError,
     "without conv_state_indices its first dimension .pool. must be >= batch = 4, got 3"),
    (dict(x_dtype=7), TypeError, "x_dtype must be 0 .f32., 1 .f16. or 2 .bf16., got 7"),
    (dict(x_dtype=F16, w_dtype=BF16), TypeError, r"weight dtype must equal x dtype \(f16\) or be f32, got bf16"),
    (dict(ptrs=with_ptr(0, 0)), ValueError, "x must not be null"),
    (dict(ptrs=with_ptr(1, 0)), ValueError, "weight must not be null"),
    (dict(ptrs=with_ptr(3, 0)), ValueError, "conv_state must not be null"),
    (dict(ptrs=with_ptr(7, 0)), ValueError, "out must not be null"),
    (dict(ptrs=with_ptr(3, ST + 1)), ValueError, r"conv_state must be aligned to its element size \(2 bytes\)"),
    (dict(ptrs=with_ptr(0, X + 1)), ValueError, r"x must be aligned to its element size \(2 bytes\)"),
    (dict(ptrs=with_ptr(5, IDX + 2)), ValueError, r"conv_state_indices must be aligned to its element size \(4"),
    (dict(ptrs=with_ptr(4, SEQLENS), idx=(-1, 0, 0)), ValueError,
     r"cache_seqlens_stride must be >= 0 .*got -1"),
    (dict(ptrs=with_ptr(6, ACC, with_ptr(4, SEQLENS))), ValueError,
     "cache_seqlens and num_accepted_tokens exclude each other"),
    (dict(st=(192, -1, 64)), ValueError, r"st_dim_stride must be >= 0 .*got -1"),
    (dict(x=(64, 1, -1)), ValueError, r"x_l_stride must be >= 0 .*got -1"),
    (dict(ptrs=with_ptr(7, X + 2)), ValueError, "out must not overlap x .x is read while out is written"),
    (dict(ptrs=with_ptr(7, ST + 64)), ValueError, "out must not overlap conv_state"),
    (dict(ptrs=with_ptr(3, X)), ValueError, "conv_state must not overlap x"),
    (dict(x=(1 << 62, 1, 1)), ValueError, "x: offset of the last element overflows int64"),
])
def test_upd_argument_errors_name_the_field(rt, kwargs, exc, words):
    a = args(**kwargs)
    for call in (lambda: rt.explain_upd(*a, arch=ARCH), lambda: rt.upd(*a, 0)):
        with pytest.raises(exc, match=words):
            call()


def test_silu_flag_and_pad_slot_id_pass_through(rt):
    assert rt.explain_upd(*args(silu=False), arch=ARCH)["shape"] == "b4.d64.l1.bias"
    assert rt.explain_upd(*args(pad=123456), arch=ARCH)["shape"] == "b4.d64.l1.bias.silu"


def test_indices_allow_a_pool_of_any_size(rt):
    a = args(sizes=(4, 64, 1, 3, 2, 4), ptrs=with_ptr(5, IDX))
    assert rt.explain_upd(*a, arch=ARCH)["key"].startswith("upd.cl.bf16wf32.w4.")


def b4_winners_db(path, arch, fam, entries) -> str:
    """A tuning DB at `path` holding, for each (variant, features) of `entries`, that
    variant as the winner of shape b4.d64.l1 with those features."""
    from cc1d.tuner.db import TuningDB
    with TuningDB(path) as db:
        for v, feats in entries:
            db.put_winner(v.source, arch=arch, family_key=fam.key(), shape_key=".".join(["b4.d64.l1", *feats]),
                          op="upd", batch=4, dim=64, seqlen=1, features=",".join(feats), variant_key=v.key(),
                          config=v.params, source_hash=v.hash(), **v.geometry(), time_us=3.0,
                          environment={"device": "test"})
    return str(path)


def test_indices_are_a_tuned_feature_with_fallback_to_the_shape_without(rt, tmp_path):
    """conv_state_indices makes the call's shape key "...pool": a winner tuned with it serves
    such calls, one tuned without serves the others, and either serves both when alone."""
    from cc1d.generator import Variant
    fam = Family("upd", "cl", "bf16", "f32", 4)
    plain, pooled = [Variant.of(fam, **dict(c)) for c in (
        dict(threads=64, vec_bytes=8, rows=1, weights="first", max_regs=96),
        dict(threads=128, vec_bytes=8, rows=2, weights="first", max_regs=255))]
    arch = "sm_998"

    with_idx = args(sizes=(4, 64, 1, 3, 9, 4), ptrs=with_ptr(5, IDX))
    both = [(plain, ("bias", "silu")), (pooled, ("bias", "silu", "pool"))]
    rt.set_tuning_dbs([b4_winners_db(tmp_path / "both.db", arch, fam, both)])
    e = rt.explain_upd(*with_idx, arch=arch)
    assert (e["shape"], e["reason"], e["key"]) == ("b4.d64.l1.bias.silu.pool", "exact", pooled.key())
    e = rt.explain_upd(*args(), arch=arch)
    assert (e["shape"], e["reason"], e["key"]) == ("b4.d64.l1.bias.silu", "exact", plain.key())
    for alone, feats, call in ((plain, ("bias", "silu"), with_idx), (pooled, ("bias", "silu", "pool"), args())):
        rt.set_tuning_dbs([b4_winners_db(tmp_path / f"{alone.key()}.db", arch, fam, [(alone, feats)])])
        rt.clear_dispatch_cache()
        e = rt.explain_upd(*call, arch=arch)
        assert (e["reason"], e["key"]) == ("nearest", alone.key())


def test_states_of_width_entries_are_a_tuned_feature_with_fallback(rt, tmp_path):
    """A conv_state of width entries (HF transformers' caches) makes the shape key
    "...wstate": a winner tuned on such states serves those calls and only those while
    the width-1 winner is there; without it, such calls get the width-1 winner (what they
    ran before the feature), a longer state gets no "wstate" at all."""
    from cc1d.generator import Variant
    fam = Family("upd", "cf", "bf16", "f32", 4)
    narrow, wide = [Variant.of(fam, **dict(c)) for c in (
        dict(threads=64, vec_bytes=8, rows=1, weights="first", max_regs=96),
        dict(threads=128, vec_bytes=4, rows=2, weights="after", max_regs=255))]
    arch = "sm_997"

    width_state = args(sizes=(4, 64, 1, 4, 4, 4), layout="cf")
    longer = args(sizes=(4, 64, 1, 6, 4, 4), layout="cf")
    plain = args(layout="cf")
    both = [(narrow, ("bias", "silu")), (wide, ("bias", "silu", "wstate"))]
    rt.set_tuning_dbs([b4_winners_db(tmp_path / "both.db", arch, fam, both)])
    e = rt.explain_upd(*width_state, arch=arch)
    assert (e["shape"], e["reason"], e["key"]) == ("b4.d64.l1.bias.silu.wstate", "exact", wide.key())
    for call in (plain, longer):
        e = rt.explain_upd(*call, arch=arch)
        assert (e["shape"], e["reason"], e["key"]) == ("b4.d64.l1.bias.silu", "exact", narrow.key())
    rt.set_tuning_dbs([b4_winners_db(tmp_path / "narrow.db", arch, fam, [(narrow, ("bias", "silu"))])])
    rt.clear_dispatch_cache()
    e = rt.explain_upd(*width_state, arch=arch)
    assert (e["reason"], e["key"]) == ("nearest", narrow.key())
    assert "none tuned with [bias,silu,wstate]" in e["detail"]


def test_the_launch_without_a_device_says_so(rt):
    with pytest.raises(RuntimeError, match="no GPU backend owns pointer"):
        rt.upd(*args(), 0)


@pytest.mark.parametrize("layout, st, family", [
    ("cf", None, "upd.cf"), ("cl", None, "upd.cl"),
    ("cf", (64 * 8, 8, 2), "upd.cf"),    # padded, strided state_len: through strides
    ("cl", (64 * 3 * 2, 1, 128), "upd.cl"),
])
def test_conv_state_layout_picks_the_family(rt, layout, st, family):
    e = rt.explain_upd(*args(layout=layout, st=st), arch=ARCH)
    assert e["key"].startswith(family + ".bf16wf32.w4."), e["key"]
    assert e["reason"] == "default" and e["source"] == "catalog"


def test_the_catalog_has_update_families_with_general_fallbacks(rt):
    entries = [e for e in rt.catalog() if e["family"].startswith("upd.")]
    fams = {e["family"] for e in entries}
    assert fams == {f.key() for f in UPD_FAMILIES} and len(fams) == 70
    for fam in fams:
        chain = [e for e in entries if e["family"] == fam]
        assert chain[-1]["align_bytes"] == (4 if ".f32w" in fam else 2), fam


@pytest.mark.parametrize("offset", [0, 2, 4, 8, 16])
@pytest.mark.parametrize("which", [0, 3, 7])  # x, conv_state, out
def test_select_upd_meets_the_alignment_of_x_out_and_state(rt, offset, which):
    fam = Family("upd", "cl", "bf16", "bf16", 4)
    chain = fallback_chain(fam)
    # dim 128 bf16 rows: every stride is a multiple of 256 bytes
    a = args(sizes=(4, 128, 1, 3, 4, 4), ptrs=with_ptr(which, PTRS[which] + offset), w_dtype=BF16)
    e = rt.explain_upd(*a, arch=ARCH)
    align = min(256, offset & -offset) if offset else 256
    assert e["alignment"] == align
    first = next(v for v in chain if align % v.geometry()["align_bytes"] == 0)
    assert e["key"] == first.key()
    assert rt.select_upd(*a, arch=ARCH)["key"] == e["key"]


def test_launch_upd_refuses_a_variant_of_another_family_or_alignment(rt):
    cl = fallback_chain(Family("upd", "cl", "bf16", "f32", 4))
    other = fallback_chain(Family("upd", "cf", "bf16", "f32", 4))[0].as_runtime_dict()
    with pytest.raises(ValueError, match="does not serve this call, whose family is upd.cl.bf16wf32.w4"):
        rt.launch_upd(other, *args(), 0)
    a = args(ptrs=with_ptr(0, X + 2))
    with pytest.raises(ValueError, match=f"variant {cl[0].key()} needs x/out/conv_state .* aligned to 8 bytes, "
                                         "the call gives 2"):
        rt.launch_upd(cl[0].as_runtime_dict(), *a, 0)


@pytest.mark.parametrize("offset", [0, 2, 4, 8])
def test_a_packed_state_contiguous_state_keeps_its_vectors(rt, offset):
    # "cf" (pool, dim, width-1): the kernels move a thread's channels as one run,
    # so the state's unit state_len stride does not cap the alignment; its base does.
    fam = Family("upd", "cf", "bf16", "bf16", 4)
    chain = fallback_chain(fam)
    a = args(sizes=(4, 128, 1, 3, 4, 4), layout="cf", ptrs=with_ptr(3, ST + offset), w_dtype=BF16)
    e = rt.explain_upd(*a, arch=ARCH)
    align = min(256, offset & -offset) if offset else 256
    assert e["alignment"] == align
    assert e["key"] == next(v for v in chain if align % v.geometry()["align_bytes"] == 0).key()
    assert chain[0].geometry()["align_bytes"] > 2
