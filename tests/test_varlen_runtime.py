"""The varlen prefill's runtime entry points through the pybind11 layer, without
torch or a GPU: argument checks (each error the right Python type, naming the
field) and dispatch of vfwd families from the catalog (alignment fallbacks).

Pointers are fake, well-aligned and far apart: every check runs before memory is
touched, and select/explain with an explicit arch need no GPU.
"""
from __future__ import annotations

import pytest

from cc1d.generator import Family, fallback_chain

ARCH = "sm_999"  # nobody tunes it: the catalog decides
BF16, F16, F32 = 2, 1, 0
GB = 1 << 32
X, W, B, CU, CI, HIS, CS, OUT = (i * GB for i in range(1, 9))
PTRS = (X, W, B, CU, CI, HIS, CS, OUT)
D, T, S, POOL, SL = 64, 1000, 5, 12, 6  # dim, total_tokens, num_seqs, pool rows, state_len


@pytest.fixture
def rt(clean_rt):  # conftest.py: no caller DB, an empty memo, restored after
    return clean_rt


def with_ptr(i, value, ptrs=PTRS):
    p = list(ptrs)
    p[i] = value
    return tuple(p)


def args(*, ptrs=PTRS, num_seqs=S, dim=D, total=T, max_seqlen=0, state_len=SL, pool=POOL, pad=-1, his_bytes=1,
         width=4, layout="cf", x=None, out=None, wt=(4, 1), bias=1, cs=None, cu=1, ci=1, his=1,
         x_dtype=BF16, w_dtype=F32, silu=True):
    contiguous = (T, 1) if layout == "cf" else (1, D)
    cs = cs or (D * SL, SL, 1)
    strides = (*(x or contiguous), *wt, bias, *(out or contiguous), *cs, cu, ci, his)
    sizes = (num_seqs, dim, total, max_seqlen, state_len, pool, pad, his_bytes, width)
    return ptrs, sizes, strides, x_dtype, w_dtype, silu


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(width=1), ValueError, r"width must be in \[2, 8\], got 1"),
    (dict(width=9), ValueError, r"width must be in \[2, 8\], got 9"),
    (dict(num_seqs=0), ValueError, "num_seqs must be >= 1, got 0"),
    (dict(dim=0), ValueError, "dim must be >= 1, got 0"),
    (dict(total=0), ValueError, "total_tokens must be >= 1, got 0"),
    (dict(max_seqlen=-1), ValueError, r"max_seqlen must be in \[0, total_tokens=1000\]"),
    (dict(max_seqlen=T + 1), ValueError, r"max_seqlen must be in \[0, total_tokens=1000\].*got 1001"),
    (dict(x_dtype=5), TypeError, r"x_dtype must be 0 \(f32\), 1 \(f16\) or 2 \(bf16\), got 5"),
    (dict(x_dtype=F16, w_dtype=BF16), TypeError, r"weight dtype must equal x dtype \(f16\) or be f32, got bf16"),
    (dict(ptrs=with_ptr(0, 0)), ValueError, "x must not be null"),
    (dict(ptrs=with_ptr(1, 0)), ValueError, "weight must not be null"),
    (dict(ptrs=with_ptr(3, 0)), ValueError, "cu_seqlens must not be null"),
    (dict(ptrs=with_ptr(3, CU + 2)), ValueError, r"cu_seqlens must be aligned to its element size \(4 bytes\)"),
    (dict(ptrs=with_ptr(4, CI + 2)), ValueError, r"cache_indices must be aligned to its element size \(4 bytes\)"),
    (dict(ptrs=with_ptr(6, 0)), ValueError, "cache_indices is given but conv_states is null"),
    (dict(ptrs=with_ptr(4, 0, with_ptr(6, 0))), ValueError, "has_initial_state is given but conv_states is null"),
    (dict(ptrs=with_ptr(7, 0, with_ptr(6, 0, (X, W, B, CU, 0, 0, 0, 0)))), ValueError,
     "out is null .states only. but conv_states is null too"),
    (dict(ptrs=with_ptr(7, 0)), ValueError, r"out is null \(states only\): cache_indices and has_initial_state"),
    (dict(state_len=2), ValueError, "state_len must be >= width - 1 = 3, got 2"),
    (dict(pool=0), ValueError, "pool must be >= 1, got 0"),
    (dict(ptrs=with_ptr(4, 0), pool=4), ValueError, "conv_states has 4 rows .pool. but num_seqs is 5"),
    (dict(his_bytes=2), ValueError, r"his_bytes .has_initial_state's element size. must be 1 .bool/uint8. or 4"),
    (dict(his_bytes=4, ptrs=with_ptr(5, HIS + 2)), ValueError,
     r"has_initial_state must be aligned to its element size \(4 bytes\)"),
    (dict(x=(T, 2)), ValueError, "x must have x_l_stride == 1 .channel-first. or x_dim_stride == 1"),
    (dict(out=(T, 2)), ValueError, "out_l_stride must be 1 like x_l_stride .channel-first layout., got 2"),
    (dict(layout="cl", out=(T, 1)), ValueError, "out_dim_stride must be 1 like x_dim_stride"),
    (dict(cs=(D * SL, SL, -1)), ValueError, "cs_l_stride must be >= 0"),
    (dict(cu=-1), ValueError, "cu_stride must be >= 0"),
    (dict(ptrs=with_ptr(6, CS + 1)), ValueError, r"conv_states must be aligned to its element size \(2 bytes\)"),
    (dict(ptrs=with_ptr(0, X + 1)), ValueError, r"x must be aligned to its element size \(2 bytes\)"),
    (dict(silu=True, x=(1 << 62, 1)), ValueError, "x: offset of the last element overflows int64"),
])
def test_validation_names_the_argument(rt, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        rt.select_varlen(*args(**kwargs), arch=ARCH)


def test_varlen_without_a_gpu_is_a_backend_error(rt):
    with pytest.raises(RuntimeError, match="no GPU backend owns pointer"):
        rt.varlen(*args(), 0)


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_dispatch_takes_the_catalog_chain_by_alignment(rt, layout):
    fam = Family("vfwd", layout, "bf16", "f32", 4)
    chain = fallback_chain(fam)
    want = rt.select_varlen(*args(layout=layout), arch=ARCH)
    assert want["key"] == chain[0].key()
    # One element of misalignment (x at +2 bytes): the chain's general variant.
    odd = rt.select_varlen(*args(layout=layout, ptrs=with_ptr(0, X + 2)), arch=ARCH)
    assert odd["key"] == chain[-1].key() and odd["align_bytes"] == 2
    e = rt.explain_varlen(*args(layout=layout), arch=ARCH)
    assert e["reason"] == "default" and e["source"] == "catalog"
    assert e["shape"] == f"b{S}.d{D}.l{T}.silu.init.final".replace(".silu", ".bias.silu")


def test_states_only_mode_needs_no_weight(rt):
    ptrs = (X, 0, 0, CU, 0, 0, CS, 0)
    v = rt.select_varlen(*args(ptrs=ptrs, x_dtype=BF16, w_dtype=BF16, width=2, silu=False, pool=S), arch=ARCH)
    assert v["key"].startswith("vfwd.cf.bf16wbf16.w2.")


def test_launch_varlen_checks_the_variant(rt):
    fam = Family("vfwd", "cf", "bf16", "f32", 4)
    other = Family("fwd", "cf", "bf16", "f32", 4)
    with pytest.raises(ValueError, match="does not serve this call, whose family is vfwd.cf.bf16wf32.w4"):
        rt.launch_varlen(fallback_chain(other)[0].as_runtime_dict(), *args(), 0)
    with pytest.raises(ValueError, match="needs x/out base addresses and outer strides aligned to"):
        rt.launch_varlen(fallback_chain(fam)[0].as_runtime_dict(), *args(ptrs=with_ptr(0, X + 2)), 0)
