"""Bad input through every runtime entry point, as data (issue 8, item 1; CI, no torch, no GPU).

Each op has a table of cases (a mutation of one valid call, the exception type
and the words that name the argument) and a table of entry points (every pybind
function of the op). The test is their product: every case must be rejected by
every entry point with the same precise error, before any memory is touched or a
device is needed (pointers are fake, 4 GiB apart). A baseline test shows the
unmutated call is accepted, so a case fails only by its own mutation.

Adding an op (decode, varlen) after it lands is three rows: its call builder,
its CASES table and its ENTRY_POINTS table in OPS. The torch-level matrix is in
test_bad_input_torch.py.
"""
from __future__ import annotations

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


def default_for(op: str, args: tuple) -> dict:
    """The default variant of the call's family (layout from x's strides), for launch_*."""
    layout = "cf" if args[2][2] == 1 else "cl"
    return default_variant(Family(op, layout, "bf16", "f32", 4)).as_runtime_dict()


FWD_ENTRY_POINTS: dict[str, Callable] = {
    "fwd": lambda rt, a: rt.fwd(*a, 0),
    "launch_fwd": lambda rt, a: rt.launch_fwd(default_for("fwd", a), *a, 0),
    "select_fwd": lambda rt, a: rt.select_fwd(*a, 0, ARCH),
    "explain_fwd": lambda rt, a: rt.explain_fwd(*a, 0, ARCH),
    "prepare_fwd": lambda rt, a: rt.prepare_fwd(*a, device=-1),
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


LAUNCHING = ("bwd", "launch_bwd")  # the workspace is checked only where kernels run

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
    "launch_bwd": lambda rt, a: rt.launch_bwd(default_for("bwd", a), *a, WORKSPACE, 0),
    "bwd_workspace_bytes": lambda rt, a: rt.bwd_workspace_bytes(*a, arch=ARCH),
    "select_bwd": lambda rt, a: rt.select_bwd(*a, arch=ARCH),
    "explain_bwd": lambda rt, a: rt.explain_bwd(*a, arch=ARCH),
    "prepare_bwd": lambda rt, a: rt.prepare_bwd(*a, device=-1),
}


# ---- the matrix --------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    call: Callable[..., tuple]
    cases: list[Case]
    entry_points: dict[str, Callable]
    # entry points that only decide (need no device): a valid call returns from them
    deciding: tuple[str, ...] = field(default=())


OPS = {
    "fwd": Op(fwd_call, FWD_CASES, FWD_ENTRY_POINTS, deciding=("select_fwd", "explain_fwd")),
    "bwd": Op(bwd_call, BWD_CASES, BWD_ENTRY_POINTS,
              deciding=("bwd_workspace_bytes", "select_bwd", "explain_bwd")),
}

MATRIX = [pytest.param(op, entry, case, id=f"{op}-{entry}-{case.name}")
          for op, spec in OPS.items() for case in spec.cases for entry in spec.entry_points
          if not case.only or entry in case.only]


@pytest.fixture
def rt():
    from cc1d._runtime import runtime
    rt = runtime()
    rt.set_tuning_dbs([])
    rt.clear_dispatch_cache()
    yield rt
    rt.clear_dispatch_cache()


@pytest.mark.parametrize("op, entry, case", MATRIX)
def test_bad_input_is_rejected_with_a_precise_error(rt, op, entry, case):
    spec = OPS[op]
    with pytest.raises(case.exc, match=case.words):
        spec.entry_points[entry](rt, spec.call(**case.change))


@pytest.mark.parametrize("op, entry", [(op, e) for op, spec in OPS.items() for e in spec.entry_points])
def test_the_valid_baseline_is_accepted(rt, op, entry):
    """Without a mutation, deciding entry points answer and launching ones fail only
    for want of a device: so every case above is rejected for its own mutation."""
    spec = OPS[op]
    for layout in ("cf", "cl"):
        args = spec.call(layout=layout)
        if entry in spec.deciding:
            spec.entry_points[entry](rt, args)
        else:
            with pytest.raises(RuntimeError) as info:
                spec.entry_points[entry](rt, args)
            assert not isinstance(info.value, (ValueError, TypeError)), info.value
            assert "GPU" in str(info.value) or "driver" in str(info.value), info.value


@pytest.mark.parametrize("offset", [2, 6, 10, 14, 30, 62, 126])
@pytest.mark.parametrize("op", ["fwd", "bwd"])
def test_odd_element_offsets_pick_a_variant_whose_requirement_holds(rt, op, offset):
    """A slice at an odd element offset is not an error: the dispatcher picks a
    variant whose alignment requirement the call meets (the GPU test runs it)."""
    spec = OPS[op]
    base = FX if op == "fwd" else BX
    for layout in ("cf", "cl"):
        e = spec.entry_points[f"explain_{op}"](rt, spec.call(layout=layout, ptr=dict(x=base + offset)))
        assert e["alignment"] == offset & -offset
        assert e["alignment"] % e["variant"]["align_bytes"] == 0, e["key"]


@pytest.mark.parametrize("op", ["fwd", "bwd"])
def test_wrong_argument_counts_are_type_errors(rt, op):
    spec = OPS[op]
    ptrs, sizes, strides, *rest = spec.call()
    explain = spec.entry_points[f"explain_{op}"]
    for bad in ((ptrs[:-1], sizes, strides), (ptrs, sizes[:3], strides), (ptrs, sizes, strides + (0,)),
                (ptrs, sizes, ("a",) * len(strides))):
        with pytest.raises(TypeError):
            explain(rt, (*bad, *rest))
