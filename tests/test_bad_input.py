"""Bad input through every runtime entry point, as data (issue 8, item 1; CI, no torch, no GPU).

Each op has a table of cases (a mutation of one valid call, the exception type
and the words that name the argument) and a table of entry points (every pybind
function of the op). The test is their product: every case must be rejected by
every entry point with the same precise error, before any memory is touched or a
device is needed (pointers are fake, 4 GiB apart). A baseline test shows the
unmutated call is accepted, so a case fails only by its own mutation.

Adding an op is three rows: its call builder, its CASES table and its
ENTRY_POINTS table in OPS (fwd, bwd, the decode update upd and the varlen
prefill vfwd are in). The torch-level matrix is in test_bad_input_torch.py.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Callable

import pytest

from cc1d.generator import Family, default_variant

ARCH = "sm_999"  # nobody tunes it: no DB on this machine changes an answer
BF16, F16, F32 = 2, 1, 0
GB = 1 << 32
WORKSPACE = 1 << 30


@dataclass(frozen=True)
class Case:
    name: str
    change: dict                 # keyword overrides of the op's call builder
    exc: type
    words: str                   # regex; names the argument
    only: tuple[str, ...] = ()   # entry points it applies to (empty: all)


# ---- forward ---------------------------------------------------------------------

FX, FW, FB, FSEQ, FIS, FOUT, FFS = (i * GB for i in range(1, 8))


def fwd_call(*, sizes=(2, 16, 128, 4), layout="cf", x_dtype=BF16, w_dtype=F32, silu=True, ptr=None,
             x=None, w=(4, 1), bias=1, out=None, seq=(0, 0), is_=(0, 0, 0), fs=(0, 0, 0)):
    """(ptrs, sizes, strides, x_dtype, w_dtype, silu) of a contiguous call; `ptr` overrides
    pointers by name (x, weight, bias, seq_idx, initial_states, out, final_states)."""
    b, d, l, _ = sizes
    contiguous = (d * l, l, 1) if layout == "cf" else (d * l, 1, d)
    names = ("x", "weight", "bias", "seq_idx", "initial_states", "out", "final_states")
    ptrs = dict(zip(names, (FX, FW, FB, 0, 0, FOUT, 0)))
    ptrs.update(ptr or {})
    strides = (*(x or contiguous), *w, bias, *(out or contiguous), *seq, *is_, *fs)
    assert len(strides) == 17
    return tuple(ptrs[n] for n in names), sizes, strides, x_dtype, w_dtype, silu


STATE = (48, 3, 1)  # a (2, 16, 3) state, contiguous

FWD_CASES = [
    Case("width-0", dict(sizes=(2, 16, 128, 0)), ValueError, r"width must be in \[2, 8\], got 0"),
    Case("width-1", dict(sizes=(2, 16, 128, 1)), ValueError, r"width must be in \[2, 8\], got 1"),
    Case("width-9", dict(sizes=(2, 16, 128, 9)), ValueError, r"width must be in \[2, 8\], got 9"),
    Case("width-negative", dict(sizes=(2, 16, 128, -4)), ValueError, r"width must be in \[2, 8\]"),
    Case("batch-0", dict(sizes=(0, 16, 128, 4)), ValueError, "batch must be >= 1, got 0"),
    Case("dim-0", dict(sizes=(2, 0, 128, 4)), ValueError, "dim must be >= 1, got 0"),
    Case("seqlen-0", dict(sizes=(2, 16, 0, 4)), ValueError, "seqlen must be >= 1, got 0"),
    Case("seqlen-negative", dict(sizes=(2, 16, -5, 4)), ValueError, "seqlen must be >= 1, got -5"),
    Case("x-dtype-code", dict(x_dtype=5), TypeError, r"x_dtype must be 0 \(f32\), 1 \(f16\) or 2 \(bf16\), got 5"),
    Case("w-dtype-code", dict(w_dtype=-1), TypeError, "w_dtype must be"),
    Case("dtype-mismatch", dict(x_dtype=F16, w_dtype=BF16), TypeError,
         r"weight dtype must equal x dtype \(f16\) or be f32, got bf16"),
    Case("dtype-mismatch-f32x", dict(x_dtype=F32, w_dtype=BF16), TypeError, r"weight dtype must equal x dtype \(f32\)"),
    Case("x-null", dict(ptr=dict(x=0)), ValueError, "x must not be null"),
    Case("weight-null", dict(ptr=dict(weight=0)), ValueError, "weight must not be null"),
    Case("out-null", dict(ptr=dict(out=0)), ValueError, "out must not be null"),
    Case("x-odd-address", dict(ptr=dict(x=FX + 1)), ValueError, r"x must be aligned to its element size \(2 bytes\)"),
    Case("out-odd-address", dict(ptr=dict(out=FOUT + 1)), ValueError, r"out must be aligned to its element size"),
    Case("weight-odd-address", dict(ptr=dict(weight=FW + 2)), ValueError,
         r"weight must be aligned to its element size \(4 bytes\)"),
    Case("bias-odd-address", dict(ptr=dict(bias=FB + 2)), ValueError, r"bias must be aligned to its element size"),
    Case("seq_idx-odd-address", dict(ptr=dict(seq_idx=FSEQ + 2), seq=(128, 1)), ValueError,
         r"seq_idx must be aligned to its element size \(4 bytes\)"),
    Case("initial_states-odd-address", dict(ptr=dict(initial_states=FIS + 1), is_=STATE), ValueError,
         "initial_states must be aligned"),
    Case("final_states-odd-address", dict(ptr=dict(final_states=FFS + 1), fs=STATE), ValueError,
         "final_states must be aligned"),
    Case("x-no-unit-stride", dict(x=(2048, 2, 2)), ValueError,
         "x must have x_l_stride == 1 .channel-first. or x_dim_stride == 1"),
    Case("out-layout-differs-cf", dict(out=(2048, 1, 16)), ValueError, "out_l_stride must be 1 like x_l_stride"),
    Case("out-layout-differs-cl", dict(layout="cl", out=(2048, 128, 1)), ValueError,
         "out_dim_stride must be 1 like x_dim_stride"),
    Case("x-negative-batch-stride", dict(x=(-2048, 128, 1)), ValueError, "x_batch_stride must be >= 0"),
    Case("x-negative-dim-stride", dict(layout="cl", x=(2048, 1, -16)), ValueError, "x_l_stride must be >= 0"),
    Case("out-negative-stride", dict(out=(2048, -128, 1)), ValueError, "out_dim_stride must be >= 0"),
    Case("weight-negative-stride", dict(w=(-4, 1)), ValueError, "w_dim_stride must be >= 0"),
    Case("bias-negative-stride", dict(bias=-1), ValueError, "bias_stride must be >= 0"),
    Case("seq_idx-negative-stride", dict(ptr=dict(seq_idx=FSEQ), seq=(128, -1)), ValueError,
         "seq_l_stride must be >= 0"),
    Case("initial_states-negative-stride", dict(ptr=dict(initial_states=FIS), is_=(48, -3, 1)), ValueError,
         "is_dim_stride must be >= 0"),
    Case("final_states-negative-stride", dict(ptr=dict(final_states=FFS), fs=(48, 3, -1)), ValueError,
         "fs_w_stride must be >= 0"),
    Case("x-extent-overflow", dict(x=(1 << 62, 128, 1)), ValueError, "x: extent in bytes overflows int64"),
    Case("out-offset-overflow", dict(out=(2048, 1 << 62, 1)), ValueError, "out: offset of the last element overflows"),
    Case("weight-offset-overflow", dict(w=(1 << 62, 1)), ValueError, "weight: offset of the last element overflows"),
    Case("seq_idx-offset-overflow", dict(ptr=dict(seq_idx=FSEQ), seq=(1 << 62, 1)), ValueError,
         "seq_idx: extent in bytes overflows int64"),
]


def default_for(op: str, layout: str) -> dict:
    """The default variant of the builders' family (bf16 x, f32 weight, width 4), for launch_*."""
    return default_variant(Family(op, layout, "bf16", "f32", 4)).as_runtime_dict()


def x_layout(args: tuple) -> str:
    """fwd and bwd: the family's layout is x's (strides batch, dim, l first)."""
    return "cf" if args[2][2] == 1 else "cl"


FWD_ENTRY_POINTS: dict[str, Callable] = {
    "fwd": lambda rt, a: rt.fwd(*a, 0),
    "launch_fwd": lambda rt, a: rt.launch_fwd(default_for("fwd", x_layout(a)), *a, 0),
    # the plan's kernel, as the tuner launches it (checked before anything is compiled)
    "launch_fwd.as_plan": lambda rt, a: rt.launch_fwd(default_for("fwd", x_layout(a)), *a, 0, as_plan=True),
    "fwd_plan_fixes": lambda rt, a: rt.fwd_plan_fixes(*a),
    "select_fwd": lambda rt, a: rt.select_fwd(*a, 0, ARCH),
    "explain_fwd": lambda rt, a: rt.explain_fwd(*a, 0, ARCH),
    "prepare_fwd": lambda rt, a: rt.prepare_fwd(*a, device=-1),
    # a plan converts all but the pointers and the stream once; its call is fwd's
    "FwdPlan": lambda rt, a: rt.FwdPlan(*a[1:])(*a[0], 0),
    # the plan's launcher (what the PyTorch API calls) raises as the bindings do
    "FwdPlan.launcher": lambda rt, a: rt.FwdPlan(*a[1:]).launcher()(*a[0], 0),
}

# ---- backward --------------------------------------------------------------------

BX, BW, BB, BSEQ, BIS, BDOUT, BDFS, BDX, BDIS, BDW, BDB, BPART = (i * GB for i in range(1, 13))
BWD_NAMES = ("x", "weight", "bias", "seq_idx", "initial_states", "dout", "dfinal_states", "dx",
             "dinitial_states", "dweight", "dbias", "partials")


def bwd_call(*, sizes=(2, 16, 128, 4), layout="cf", x_dtype=BF16, w_dtype=F32, silu=True, ptr=None, x=None,
             w=(4, 1), bias=1, dout=None, dx=None, seq=(0, 0), is_=(0, 0, 0), dfs=(0, 0, 0), dis=(0, 0, 0),
             dw=(4, 1), db=1):
    """(ptrs, sizes, strides, x_dtype, w_dtype, silu) of a contiguous backward call."""
    b, d, l, _ = sizes
    contiguous = (d * l, l, 1) if layout == "cf" else (d * l, 1, d)
    ptrs = dict(zip(BWD_NAMES, (BX, BW, BB, 0, 0, BDOUT, 0, BDX, 0, BDW, BDB, BPART)))
    ptrs.update(ptr or {})
    strides = (*(x or contiguous), *w, bias, *(dout or contiguous), *(dx or contiguous), *seq, *is_, *dfs, *dis,
               *dw, db)
    assert len(strides) == 26
    return tuple(ptrs[n] for n in BWD_NAMES), sizes, strides, x_dtype, w_dtype, silu


LAUNCHING = ("bwd", "launch_bwd", "BwdPlan")  # the workspace is checked only where kernels run

BWD_CASES = [
    Case("width-0", dict(sizes=(2, 16, 128, 0)), ValueError, r"width must be in \[2, 8\], got 0"),
    Case("width-1", dict(sizes=(2, 16, 128, 1)), ValueError, r"width must be in \[2, 8\], got 1"),
    Case("width-9", dict(sizes=(2, 16, 128, 9)), ValueError, r"width must be in \[2, 8\], got 9"),
    Case("batch-0", dict(sizes=(0, 16, 128, 4)), ValueError, "batch must be >= 1, got 0"),
    Case("dim-0", dict(sizes=(2, 0, 128, 4)), ValueError, "dim must be >= 1, got 0"),
    Case("seqlen-0", dict(sizes=(2, 16, 0, 4)), ValueError, "seqlen must be >= 1, got 0"),
    Case("x-dtype-code", dict(x_dtype=3), TypeError, "x_dtype must be 0 .f32., 1 .f16. or 2 .bf16., got 3"),
    Case("dtype-mismatch", dict(x_dtype=BF16, w_dtype=F16), TypeError,
         r"weight dtype must equal x dtype \(bf16\) or be f32, got f16"),
    *[Case(f"{n}-null", dict(ptr={n: 0}), ValueError, f"{n} must not be null")
      for n in ("x", "weight", "dout", "dx", "dweight")],
    Case("partials-null", dict(ptr=dict(partials=0)), ValueError, "partials .the workspace. must not be null",
         only=LAUNCHING),
    Case("partials-misaligned", dict(ptr=dict(partials=BPART + 8)), ValueError,
         "partials .the workspace. must be 16-byte aligned", only=LAUNCHING),
    Case("dinitial_states-without-initial_states", dict(ptr=dict(dinitial_states=BDIS), dis=STATE), ValueError,
         "dinitial_states is given but initial_states is null"),
    Case("dbias-without-bias", dict(ptr=dict(bias=0)), ValueError, "dbias is given but bias is null"),
    *[Case(f"{n}-odd-address", dict(ptr={n: base + 1}), ValueError, f"{n} must be aligned to its element size")
      for n, base in (("x", BX), ("dout", BDOUT), ("dx", BDX), ("weight", BW), ("dweight", BDW), ("bias", BB),
                      ("dbias", BDB))],
    Case("x-no-unit-stride", dict(x=(2048, 2, 2)), ValueError, "x must have x_l_stride == 1"),
    Case("dout-layout-differs", dict(dout=(2048, 1, 16)), ValueError, "dout_l_stride must be 1 like x_l_stride"),
    Case("dx-layout-differs", dict(layout="cl", dx=(2048, 128, 1)), ValueError,
         "dx_dim_stride must be 1 like x_dim_stride"),
    Case("dout-negative-stride", dict(dout=(-2048, 128, 1)), ValueError, "dout_batch_stride must be >= 0"),
    Case("dweight-negative-stride", dict(dw=(4, -1)), ValueError, "dw_width_stride must be >= 0"),
    Case("dbias-negative-stride", dict(db=-1), ValueError, "db_stride must be >= 0"),
    Case("dfinal_states-negative-stride", dict(ptr=dict(dfinal_states=BDFS), dfs=(48, -3, 1)), ValueError,
         "dfs_dim_stride must be >= 0"),
    Case("dx-extent-overflow", dict(dx=(2048, 1 << 62, 1)), ValueError, "dx: offset of the last element overflows"),
    Case("dx-is-dout", dict(ptr=dict(dx=BDOUT)), ValueError, "dx must not overlap dout"),
    Case("dx-overlaps-x", dict(ptr=dict(dx=BX + 64)), ValueError, "dx must not overlap x"),
]


BWD_ENTRY_POINTS: dict[str, Callable] = {
    "bwd": lambda rt, a: rt.bwd(*a, WORKSPACE, 0),
    "launch_bwd": lambda rt, a: rt.launch_bwd(default_for("bwd", x_layout(a)), *a, WORKSPACE, 0),
    "bwd_workspace_bytes": lambda rt, a: rt.bwd_workspace_bytes(*a, arch=ARCH),
    "select_bwd": lambda rt, a: rt.select_bwd(*a, arch=ARCH),
    "explain_bwd": lambda rt, a: rt.explain_bwd(*a, arch=ARCH),
    "prepare_bwd": lambda rt, a: rt.prepare_bwd(*a, device=-1),
    "BwdPlan": lambda rt, a: rt.BwdPlan(*a[1:])(*a[0], WORKSPACE, 0),
    "BwdPlan.workspace_bytes": lambda rt, a: rt.BwdPlan(*a[1:]).workspace_bytes(*a[0]),
}


# ---- decode update -------------------------------------------------------------------

UX, UW, UB, UST, USEQ, UIDX, UACC, UOUT = (i * GB for i in range(1, 9))
UPD_NAMES = ("x", "weight", "bias", "conv_state", "cache_seqlens", "conv_state_indices", "num_accepted_tokens",
             "out")


def upd_call(*, batch=2, dim=16, seqlen=2, state_len=4, pool=3, width=4, layout="cl", pad=-1, x_dtype=BF16,
             w_dtype=F32, silu=True, ptr=None, x=None, w=(4, 1), bias=1, st=None, out=None, idx=(1, 1, 1)):
    """(ptrs, sizes, strides, pad_slot_id, x_dtype, w_dtype, silu) of a contiguous decode update. `layout`
    is conv_state's (pool, dim, state_len), which picks the family: "cf" state_len-contiguous, "cl"
    dim-contiguous. The index arrays (cache_seqlens, conv_state_indices, num_accepted_tokens) are absent
    unless `ptr` gives them; idx holds their strides."""
    contiguous = (dim * seqlen, seqlen, 1)
    state = (dim * state_len, state_len, 1) if layout == "cf" else (dim * state_len, 1, dim)
    ptrs = dict(zip(UPD_NAMES, (UX, UW, UB, UST, 0, 0, 0, UOUT)))
    ptrs.update(ptr or {})
    strides = (*(x or contiguous), *w, bias, *(st or state), *(out or contiguous), *idx)
    assert len(strides) == 15
    sizes = (batch, dim, seqlen, state_len, pool, width)
    return tuple(ptrs[n] for n in UPD_NAMES), sizes, strides, pad, x_dtype, w_dtype, silu


def state_layout(args: tuple) -> str:
    """upd: the family's layout is conv_state's (st_dim_stride, stride 7, is 1: channel-last)."""
    return "cl" if args[2][7] == 1 else "cf"


UPD_INDEX_ARRAYS = (("cache_seqlens", USEQ), ("conv_state_indices", UIDX), ("num_accepted_tokens", UACC))

UPD_CASES = [
    *[Case(f"width-{w}", dict(width=w), ValueError, rf"width must be in \[2, 8\], got {w}") for w in (0, 1, 9, -4)],
    *[Case(f"{n}-{v}", {n: v}, ValueError, f"{n} must be >= 1, got {v}")
      for n in ("batch", "dim", "seqlen") for v in (0, -3)],
    Case("state_len-short", dict(state_len=2), ValueError,
         r"conv_state: state_len must be >= width - 1 = 3 \(the window of previous inputs\), got 2"),
    Case("state_len-negative", dict(state_len=-1), ValueError, "conv_state: state_len must be >= width - 1 = 3"),
    Case("state_len-short-width-8", dict(width=8, state_len=6), ValueError, "state_len must be >= width - 1 = 7"),
    Case("pool-0", dict(pool=0), ValueError, r"pool \(conv_state's first dimension\) must be >= 1, got 0"),
    Case("pool-negative", dict(pool=-2), ValueError, r"pool \(conv_state's first dimension\) must be >= 1"),
    Case("pool-0-with-indices", dict(pool=0, ptr=dict(conv_state_indices=UIDX)), ValueError,
         r"pool \(conv_state's first dimension\) must be >= 1, got 0"),
    Case("pool-below-batch", dict(pool=1), ValueError,
         r"without conv_state_indices its first dimension \(pool\) must be >= batch = 2, got 1"),
    Case("x-dtype-code", dict(x_dtype=5), TypeError, r"x_dtype must be 0 \(f32\), 1 \(f16\) or 2 \(bf16\), got 5"),
    Case("x-dtype-negative", dict(x_dtype=-1), TypeError, "x_dtype must be .*, got -1"),
    Case("w-dtype-code", dict(w_dtype=3), TypeError, "w_dtype must be .*, got 3"),
    Case("dtype-mismatch", dict(x_dtype=F16, w_dtype=BF16), TypeError,
         r"weight dtype must equal x dtype \(f16\) or be f32, got bf16"),
    Case("dtype-mismatch-f32x", dict(x_dtype=F32, w_dtype=F16), TypeError, r"weight dtype must equal x dtype \(f32\)"),
    *[Case(f"{n}-null", dict(ptr={n: 0}), ValueError, f"{n} must not be null")
      for n in ("x", "weight", "conv_state", "out")],
    Case("cache_seqlens-with-num_accepted_tokens", dict(ptr=dict(cache_seqlens=USEQ, num_accepted_tokens=UACC)),
         ValueError, "cache_seqlens and num_accepted_tokens exclude each other"),
    *[Case(f"{n}-odd-address", dict(ptr={n: base + 1}), ValueError,
           rf"{n} must be aligned to its element size \(2 bytes\)")
      for n, base in (("x", UX), ("out", UOUT), ("conv_state", UST))],
    *[Case(f"{n}-odd-address", dict(ptr={n: base + 2}), ValueError,
           rf"{n} must be aligned to its element size \(4 bytes\)")
      for n, base in (("weight", UW), ("bias", UB), *UPD_INDEX_ARRAYS)],
    *[Case(f"{name}-negative", {arg: value}, ValueError, f"{name} must be >= 0 .negative strides")
      for name, arg, value in (("x_batch_stride", "x", (-32, 2, 1)), ("x_dim_stride", "x", (32, -2, 1)),
                               ("x_l_stride", "x", (32, 2, -1)), ("out_batch_stride", "out", (-32, 2, 1)),
                               ("out_l_stride", "out", (32, 2, -1)), ("st_batch_stride", "st", (-64, 1, 16)),
                               ("st_dim_stride", "st", (64, -1, 16)), ("st_l_stride", "st", (64, 1, -16)),
                               ("w_dim_stride", "w", (-4, 1)), ("w_width_stride", "w", (4, -1)),
                               ("bias_stride", "bias", -1))],
    *[Case(f"{n}_stride-negative", dict(ptr={n: base}, idx=(-1, -1, -1)), ValueError,
           f"{n}_stride must be >= 0 .negative strides are not supported., got -1")
      for n, base in UPD_INDEX_ARRAYS],
    Case("out-is-x", dict(ptr=dict(out=UX)), ValueError, "out must not overlap x .x is read while out is written"),
    Case("out-overlaps-x-tail", dict(ptr=dict(out=UX + 126)), ValueError, "out must not overlap x"),
    Case("out-overlaps-conv_state", dict(ptr=dict(out=UST + 64)), ValueError,
         "out must not overlap conv_state .the state is read and written"),
    Case("conv_state-is-x", dict(ptr=dict(conv_state=UX)), ValueError,
         "conv_state must not overlap x .x is copied into the state"),
    Case("x-offset-overflow", dict(x=(32, 1 << 62, 1)), ValueError, "x: offset of the last element overflows int64"),
    Case("x-extent-overflow", dict(x=(1 << 62, 2, 1)), ValueError, "x: extent in bytes overflows int64"),
    Case("out-offset-overflow", dict(out=(32, 1 << 62, 1)), ValueError, "out: offset of the last element overflows"),
    Case("pool-overflow", dict(pool=1 << 62, ptr=dict(conv_state_indices=UIDX)), ValueError,
         "conv_state: offset of the last element overflows int64"),
    Case("weight-offset-overflow", dict(w=(1 << 62, 1)), ValueError, "weight: offset of the last element overflows"),
    Case("bias-extent-overflow", dict(bias=1 << 58), ValueError, "bias: extent in bytes overflows int64"),
    *[Case(f"{n}-extent-overflow", dict(ptr={n: base}, idx=(1 << 62,) * 3), ValueError,
           f"{n}: extent in bytes overflows int64")
      for n, base in UPD_INDEX_ARRAYS],
]

UPD_ENTRY_POINTS: dict[str, Callable] = {
    "upd": lambda rt, a: rt.upd(*a, 0),
    "launch_upd": lambda rt, a: rt.launch_upd(default_for("upd", state_layout(a)), *a, 0),
    "launch_upd.as_plan": lambda rt, a: rt.launch_upd(default_for("upd", state_layout(a)), *a, 0, as_plan=True),
    "upd_plan_fixes": lambda rt, a: rt.upd_plan_fixes(*a),
    "select_upd": lambda rt, a: rt.select_upd(*a, arch=ARCH),
    "explain_upd": lambda rt, a: rt.explain_upd(*a, arch=ARCH),
    "prepare_upd": lambda rt, a: rt.prepare_upd(*a, device=-1),
}

# ---- varlen prefill --------------------------------------------------------------------

VX, VW, VB, VCU, VCI, VHIS, VCS, VOUT = (i * GB for i in range(1, 9))
VARLEN_NAMES = ("x", "weight", "bias", "cu_seqlens", "cache_indices", "has_initial_state", "conv_states", "out")


def varlen_call(*, num_seqs=3, dim=16, total_tokens=104, max_seqlen=0, state_len=3, pool=4, pad=-1, his_bytes=1,
                width=4, layout="cf", x_dtype=BF16, w_dtype=F32, silu=True, ptr=None, x=None, w=(4, 1), bias=1,
                out=None, cs=None, cu=1, ci=1, his=1):
    """(ptrs, sizes, strides, x_dtype, w_dtype, silu) of a contiguous varlen prefill with every
    optional tensor given: x and out (dim, total_tokens) in `layout`, a state pool (pool, dim,
    state_len) with cache_indices and has_initial_state (his_bytes per element)."""
    contiguous = (total_tokens, 1) if layout == "cf" else (1, dim)
    ptrs = dict(zip(VARLEN_NAMES, (VX, VW, VB, VCU, VCI, VHIS, VCS, VOUT)))
    ptrs.update(ptr or {})
    strides = (*(x or contiguous), *w, bias, *(out or contiguous), *(cs or (dim * state_len, state_len, 1)), cu, ci,
               his)
    assert len(strides) == 13
    sizes = (num_seqs, dim, total_tokens, max_seqlen, state_len, pool, pad, his_bytes, width)
    return tuple(ptrs[n] for n in VARLEN_NAMES), sizes, strides, x_dtype, w_dtype, silu


def varlen_layout(args: tuple) -> str:
    """vfwd: the family's layout is x's (strides dim, l first)."""
    return "cf" if args[2][1] == 1 else "cl"


VFWD_CASES = [
    *[Case(f"width-{w}", dict(width=w), ValueError, rf"width must be in \[2, 8\], got {w}") for w in (0, 1, 9, -4)],
    *[Case(f"{n}-{v}", {n: v}, ValueError, f"{n} must be >= 1, got {v}")
      for n in ("num_seqs", "dim", "total_tokens") for v in (0, -3)],
    Case("max_seqlen-negative", dict(max_seqlen=-1), ValueError,
         r"max_seqlen must be in \[0, total_tokens=104\] \(0: bounded by total_tokens\), got -1"),
    Case("max_seqlen-past-total_tokens", dict(max_seqlen=105), ValueError,
         r"max_seqlen must be in \[0, total_tokens=104\].*got 105"),
    Case("state_len-short", dict(state_len=2), ValueError, "state_len must be >= width - 1 = 3, got 2"),
    Case("state_len-short-states-only", dict(state_len=0, ptr=dict(out=0, cache_indices=0, has_initial_state=0)),
         ValueError, "state_len must be >= width - 1 = 3, got 0"),
    Case("pool-0", dict(pool=0), ValueError, "pool must be >= 1, got 0"),
    Case("pool-negative", dict(pool=-1), ValueError, "pool must be >= 1, got -1"),
    Case("pool-below-num_seqs", dict(pool=2, ptr=dict(cache_indices=0)), ValueError,
         r"conv_states has 2 rows \(pool\) but num_seqs is 3: without cache_indices"),
    *[Case(f"his_bytes-{b}", dict(his_bytes=b), ValueError,
           rf"his_bytes \(has_initial_state's element size\) must be 1 \(bool/uint8\) or 4 \(int32\), got {b}")
      for b in (0, 2, 8)],
    Case("x-dtype-code", dict(x_dtype=5), TypeError, r"x_dtype must be 0 \(f32\), 1 \(f16\) or 2 \(bf16\), got 5"),
    Case("w-dtype-code", dict(w_dtype=-1), TypeError, "w_dtype must be .*, got -1"),
    Case("dtype-mismatch", dict(x_dtype=BF16, w_dtype=F16), TypeError,
         r"weight dtype must equal x dtype \(bf16\) or be f32, got f16"),
    *[Case(f"{n}-null", dict(ptr={n: 0}), ValueError, f"{n} must not be null") for n in ("x", "weight", "cu_seqlens")],
    Case("out-and-conv_states-null", dict(ptr=dict(out=0, conv_states=0, cache_indices=0, has_initial_state=0)),
         ValueError, r"out is null \(states only\) but conv_states is null too: nothing to write"),
    Case("states-only-with-cache_indices", dict(ptr=dict(out=0)), ValueError,
         r"out is null \(states only\): cache_indices and has_initial_state must be null"),
    Case("cache_indices-without-conv_states", dict(ptr=dict(conv_states=0)), ValueError,
         "cache_indices is given but conv_states is null"),
    Case("has_initial_state-without-conv_states", dict(ptr=dict(conv_states=0, cache_indices=0)), ValueError,
         "has_initial_state is given but conv_states is null"),
    *[Case(f"{n}-odd-address", dict(ptr={n: base + 1}), ValueError,
           rf"{n} must be aligned to its element size \(2 bytes\)")
      for n, base in (("x", VX), ("out", VOUT), ("conv_states", VCS))],
    *[Case(f"{n}-odd-address", dict(ptr={n: base + 2}), ValueError,
           rf"{n} must be aligned to its element size \(4 bytes\)")
      for n, base in (("weight", VW), ("bias", VB), ("cu_seqlens", VCU), ("cache_indices", VCI))],
    Case("has_initial_state-odd-address-int32", dict(his_bytes=4, ptr=dict(has_initial_state=VHIS + 2)), ValueError,
         r"has_initial_state must be aligned to its element size \(4 bytes\)"),
    Case("x-no-unit-stride", dict(x=(208, 2)), ValueError,
         r"x must have x_l_stride == 1 \(channel-first\) or x_dim_stride == 1 \(channel-last\)"),
    Case("out-layout-differs-cf", dict(out=(1, 16)), ValueError, "out_l_stride must be 1 like x_l_stride"),
    Case("out-layout-differs-cl", dict(layout="cl", out=(104, 1)), ValueError, "out_dim_stride must be 1 like x_dim"),
    *[Case(f"{name}-negative", dict(change), ValueError, f"{name} must be >= 0 .negative strides")
      for name, change in (("x_dim_stride", dict(x=(-104, 1))), ("x_l_stride", dict(layout="cl", x=(1, -16))),
                           ("out_dim_stride", dict(out=(-104, 1))), ("w_dim_stride", dict(w=(-4, 1))),
                           ("w_width_stride", dict(w=(4, -1))), ("bias_stride", dict(bias=-1)),
                           ("cs_pool_stride", dict(cs=(-48, 3, 1))), ("cs_dim_stride", dict(cs=(48, -3, 1))),
                           ("cs_l_stride", dict(cs=(48, 3, -1))), ("cu_stride", dict(cu=-1)),
                           ("ci_stride", dict(ci=-1)), ("his_stride", dict(his=-1)))],
    Case("out-is-x", dict(ptr=dict(out=VX)), ValueError, "out must not overlap x .blocks read x's neighbours"),
    Case("out-overlaps-x-tail", dict(ptr=dict(out=VX + 16 * 104 * 2 - 2)), ValueError, "out must not overlap x"),
    Case("out-overlaps-conv_states", dict(ptr=dict(out=VCS + 64)), ValueError,
         "out must not overlap conv_states .the states are read and written"),
    Case("conv_states-is-x", dict(ptr=dict(conv_states=VX)), ValueError,
         "conv_states must not overlap x .x's last tokens are copied"),
    Case("conv_states-is-x-states-only", dict(ptr=dict(conv_states=VX, out=0, cache_indices=0, has_initial_state=0)),
         ValueError, "conv_states must not overlap x"),
    Case("x-offset-overflow", dict(x=(1 << 62, 1)), ValueError, "x: offset of the last element overflows int64"),
    Case("total_tokens-overflow", dict(total_tokens=1 << 62), ValueError, "x: offset of the last element overflows"),
    Case("x-extent-overflow", dict(layout="cl", x=(1, 1 << 56)), ValueError, "x: extent in bytes overflows int64"),
    Case("out-offset-overflow", dict(out=(1 << 62, 1)), ValueError, "out: offset of the last element overflows"),
    Case("weight-offset-overflow", dict(w=(1 << 62, 1)), ValueError, "weight: offset of the last element overflows"),
    Case("conv_states-offset-overflow", dict(cs=(1 << 62, 3, 1)), ValueError,
         "conv_states: offset of the last element overflows int64"),
    Case("pool-overflow", dict(pool=1 << 62), ValueError, "conv_states: offset of the last element overflows"),
    Case("cu_seqlens-offset-overflow", dict(cu=1 << 62), ValueError, "cu_seqlens: offset of the last element overflows"),
    Case("cache_indices-offset-overflow", dict(ci=1 << 62), ValueError, "cache_indices: offset of the last element"),
    Case("has_initial_state-extent-overflow", dict(his_bytes=4, his=1 << 61), ValueError,
         "has_initial_state: extent in bytes overflows int64"),
]

VFWD_ENTRY_POINTS: dict[str, Callable] = {
    "varlen": lambda rt, a: rt.varlen(*a, 0),
    "launch_varlen": lambda rt, a: rt.launch_varlen(default_for("vfwd", varlen_layout(a)), *a, 0),
    "select_varlen": lambda rt, a: rt.select_varlen(*a, arch=ARCH),
    "explain_varlen": lambda rt, a: rt.explain_varlen(*a, arch=ARCH),
    "prepare_varlen": lambda rt, a: rt.prepare_varlen(*a, device=-1),
}


# ---- the matrix --------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    call: Callable[..., tuple]
    cases: list[Case]
    entry_points: dict[str, Callable]
    # entry points that only decide (need no device): a valid call returns from them
    deciding: tuple[str, ...] = field(default=())
    explain: str = ""            # the entry point that tells the decision


OPS = {
    "fwd": Op(fwd_call, FWD_CASES, FWD_ENTRY_POINTS, deciding=("select_fwd", "explain_fwd", "fwd_plan_fixes"),
              explain="explain_fwd"),
    "bwd": Op(bwd_call, BWD_CASES, BWD_ENTRY_POINTS,
              deciding=("bwd_workspace_bytes", "select_bwd", "explain_bwd", "BwdPlan.workspace_bytes"),
              explain="explain_bwd"),
    "upd": Op(upd_call, UPD_CASES, UPD_ENTRY_POINTS, deciding=("select_upd", "explain_upd", "upd_plan_fixes"),
              explain="explain_upd"),
    "vfwd": Op(varlen_call, VFWD_CASES, VFWD_ENTRY_POINTS, deciding=("select_varlen", "explain_varlen"),
               explain="explain_varlen"),
}

MATRIX = [pytest.param(op, entry, case, id=f"{op}-{entry}-{case.name}")
          for op, spec in OPS.items() for case in spec.cases for entry in spec.entry_points
          if not case.only or entry in case.only]


@pytest.fixture
def rt(clean_rt):  # conftest.py: no caller DB, an empty memo, restored after
    return clean_rt


@pytest.mark.parametrize("op, entry, case", MATRIX)
def test_bad_input_is_rejected_with_a_precise_error(rt, op, entry, case):
    spec = OPS[op]
    with pytest.raises(case.exc, match=case.words):
        spec.entry_points[entry](rt, spec.call(**case.change))


def _has_cuda_device(rt) -> bool:
    try:
        rt.device_target("cuda", 0)
        return True
    except RuntimeError:
        return False


@pytest.mark.parametrize("op, entry", [(op, e) for op, spec in OPS.items() for e in spec.entry_points])
def test_the_valid_baseline_is_accepted(rt, op, entry):
    """Without a mutation, deciding entry points answer and launching ones fail only
    for want of a device (or, on a GPU machine, for the fake pointers): so every
    case above is rejected for its own mutation. Preparing (compile and load, no
    launch) succeeds where a device is present."""
    spec = OPS[op]
    may_succeed = entry.startswith("prepare_") and _has_cuda_device(rt)
    for layout in ("cf", "cl"):
        args = spec.call(layout=layout)
        if entry in spec.deciding:
            spec.entry_points[entry](rt, args)
            continue
        try:
            spec.entry_points[entry](rt, args)
        except RuntimeError as exc:
            assert not isinstance(exc, (ValueError, TypeError)), exc
            assert "GPU" in str(exc) or "driver" in str(exc) or "device" in str(exc), exc
        else:
            assert may_succeed, f"{entry} accepted the baseline without a device to run on"


# The pointer whose element offset the alignment follows: x, but the update's
# state (x counts there only where its dim stride is 1).
ALIGNED_BY = {"fwd": ("x", FX), "bwd": ("x", BX), "upd": ("conv_state", UST), "vfwd": ("x", VX)}


@pytest.mark.parametrize("offset", [2, 6, 10, 14, 30, 62, 126])
@pytest.mark.parametrize("op", list(OPS))
def test_odd_element_offsets_pick_a_variant_whose_requirement_holds(rt, op, offset):
    """A slice at an odd element offset is not an error: the dispatcher picks a
    variant whose alignment requirement the call meets (the GPU test runs it)."""
    spec = OPS[op]
    name, base = ALIGNED_BY[op]
    for layout in ("cf", "cl"):
        e = spec.entry_points[spec.explain](rt, spec.call(layout=layout, ptr={name: base + offset}))
        assert e["alignment"] == offset & -offset
        assert e["alignment"] % e["variant"]["align_bytes"] == 0, e["key"]


@pytest.mark.parametrize("op", list(OPS))
def test_wrong_argument_counts_are_type_errors(rt, op):
    spec = OPS[op]
    ptrs, sizes, strides, *rest = spec.call()
    explain = spec.entry_points[spec.explain]
    for bad in ((ptrs[:-1], sizes, strides), (ptrs, sizes[:3], strides), (ptrs, sizes, strides + (0,)),
                (ptrs, sizes, ("a",) * len(strides))):
        with pytest.raises(TypeError):
            explain(rt, (*bad, *rest))


def test_fwd_plan_launcher_names_its_bad_arguments(rt):
    """The launcher parses its ints itself (no pybind11): counts, types and ranges are
    TypeError / ValueError naming the argument, and it keeps its plan alive."""
    ptrs, sizes, strides, *rest = fwd_call()
    launch = rt.FwdPlan(sizes, strides, *rest).launcher()
    with pytest.raises(TypeError, match="expected 8 arguments .*got 7"):
        launch(*ptrs)
    with pytest.raises(TypeError, match="bias: expected an int .*got str"):
        launch(ptrs[0], ptrs[1], "b", *ptrs[3:], 0)
    with pytest.raises(TypeError, match="stream: expected an int .*got float"):
        launch(*ptrs, 0.0)
    with pytest.raises(ValueError, match="out: expected an int in the int64 range"):
        launch(*ptrs[:5], 1 << 64, ptrs[6], 0)
    with pytest.raises(ValueError, match="x must not be null"):
        launch(0, *ptrs[1:], 0)
    gc.collect()  # the plan object has no other reference
    with pytest.raises(RuntimeError, match="no GPU backend owns pointer|GPU|driver"):
        launch(*ptrs, 0)  # the plan is still there: the call reaches the device look-up
