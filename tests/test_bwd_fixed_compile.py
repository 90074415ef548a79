"""Backward plans' fixed kernels (bwd_common.cuh.j2 CC1D_BWD_FIXED, runtime bwd_fixed_options):
channel-last only; the options name what a plan holds constant, the template reads every one
of them, channel-first sources do not carry the block, and the default channel-last backward
kernels compile with them for NVRTC sm_90 (no local memory, less code) and hipRTC gfx942
(marker amd). Their results on the GPU: test_bwd_fixed_gpu.py."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cc1d.generator import default_variant, families, variants

from compile_checks import fixed_kernel_problems, width4_fixed_builds
from test_compile_amd import AMD_TARGETS, compile_for_amd

GB = 1 << 32
DTYPE_CODES = {"f32": 0, "f16": 1, "bf16": 2}
TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "bwd_common.cuh.j2"
ALL = dict(seq_idx=True, initial_states=True, dfinal_states=True, dinitial_states=True)


def fixed_bwd_call(family, *, batch=3, dim=664, seqlen=1000, bias=True, seq_idx=False, initial_states=False,
                   dfinal_states=False, dinitial_states=False, silu=True, row_pad=0, layout=None):
    """bwd_fixed_options' arguments for a call of `family` (or `layout`): fake pointers; x,
    dout and dx in that layout (the contiguous dim padded by row_pad elements), the rest
    contiguous."""
    layout = layout or family.layout
    w, m = family.width, family.width - 1
    if layout == "cf":
        xs = (dim * (seqlen + row_pad), seqlen + row_pad, 1)
    else:
        xs = (seqlen * (dim + row_pad), 1, dim + row_pad)
    states = (dim * m, m, 1)
    strides = (*xs, w, 1, 1 if bias else 0, *xs, *xs, *((seqlen, 1) if seq_idx else (0, 0)),
               *(states if initial_states else (0, 0, 0)), *(states if dfinal_states else (0, 0, 0)),
               *(states if dinitial_states else (0, 0, 0)), w, 1, 1 if bias else 0)
    on = lambda flag, slot: slot * GB if flag else 0  # noqa: E731
    ptrs = (GB, 2 * GB, on(bias, 3), on(seq_idx, 4), on(initial_states, 5), 6 * GB, on(dfinal_states, 7), 8 * GB,
            on(dinitial_states, 9), 10 * GB, on(bias, 11), 12 * GB)
    return (ptrs, (batch, dim, seqlen, w), strides, DTYPE_CODES[family.x_dtype], DTYPE_CODES[family.w_dtype],
            silu)


def _family(layout="cl", x_dtype="bf16", w_dtype="bf16", width=4):
    return next(f for f in families("bwd") if (f.layout, f.x_dtype, f.w_dtype, f.width) ==
                (layout, x_dtype, w_dtype, width))


def _names(options):
    return [o[2:].partition("=")[0] for o in options]


def test_fixed_options_hold_dim_and_the_strides_seqlen_does_not_set(rt):
    cl = rt.bwd_fixed_options(*fixed_bwd_call(_family(), row_pad=8))
    assert _names(cl)[0] == "CC1D_BWD_FIXED" and len(set(_names(cl))) == len(cl)
    assert "-DCC1D_FIX_DIM=((long long)664ULL)" in cl
    assert "-DCC1D_FIX_X_L_STRIDE=((long long)672ULL)" in cl  # the padded token pitch
    assert "-DCC1D_FIX_DX_DIM_STRIDE=((long long)1ULL)" in cl
    assert "-DCC1D_FIX_HAS_BIAS=((long long)1ULL)" in cl and "-DCC1D_FIX_HAS_SEQ_IDX=((long long)0ULL)" in cl
    # the activation, batch and seqlen (and the strides they set) stay run-time values:
    # calls of other lengths, and with or without SiLU, share the kernel
    assert not {"CC1D_FIX_SILU", "CC1D_FIX_BATCH", "CC1D_FIX_SEQLEN", "CC1D_FIX_X_BATCH_STRIDE"} & set(_names(cl))
    assert cl == rt.bwd_fixed_options(*fixed_bwd_call(_family(), row_pad=8, batch=7, seqlen=33, silu=False))
    assert rt.bwd_plan_fixes(*fixed_bwd_call(_family()))
    every = rt.bwd_fixed_options(*fixed_bwd_call(_family(), **ALL))
    assert every[1:1 + len(rt.bwd_seq_build_options())] == rt.bwd_seq_build_options()  # the seq_idx build's
    assert {"CC1D_FIX_SEQ_L_STRIDE", "CC1D_FIX_IS_W_STRIDE", "CC1D_FIX_DFS_BATCH_STRIDE",
            "CC1D_FIX_DIS_DIM_STRIDE"} <= set(_names(every))
    assert "-DCC1D_FIX_HAS_DINITIAL_STATES=((long long)1ULL)" in every


def test_channel_first_plans_fix_nothing(rt):
    """Channel-first fixed kernels ran slower (docs/DISPATCH.md): no options, no block in
    the sources."""
    call = fixed_bwd_call(_family("cf"))
    assert rt.bwd_fixed_options(*call) == [] and not rt.bwd_plan_fixes(*call)
    cf = _family("cf")
    assert all("CC1D_BWD_FIXED" not in v.source for v in list(variants(cf))[:50])
    assert "CC1D_BWD_FIXED" in default_variant(_family(), "sm_90").source


def test_the_template_reads_every_fixed_constant_and_no_other(rt):
    """A stride macro the template does not read would silently stay a run-time value."""
    emitted = set()
    for features in (dict(), ALL):
        emitted |= set(_names(rt.bwd_fixed_options(*fixed_bwd_call(_family(), **features))))
    emitted -= {o[2:].partition("=")[0] for o in rt.bwd_seq_build_options()}
    read = set(re.findall(r"\bCC1D_FIX_\w+", TEMPLATE.read_text())) | {"CC1D_BWD_FIXED"}
    assert emitted == read


def test_fixed_options_check_the_call(rt):
    args = list(fixed_bwd_call(_family()))
    args[1] = (3, 664, 1000, 9)  # width 9
    with pytest.raises(ValueError, match="width"):
        rt.bwd_fixed_options(*args)
    args = list(fixed_bwd_call(_family()))
    args[2] = (*args[2][:6], 664 * 1000, 1000, 1, *args[2][9:])  # dout channel-first, x channel-last
    with pytest.raises(ValueError, match="dout"):
        rt.bwd_fixed_options(*args)


FIXED_FAMILIES = [f for f in families("bwd")
                  if f.layout == "cl" and (f.width == 4 or (f.x_dtype, f.w_dtype) == ("bf16", "bf16"))]


@pytest.mark.parametrize("features", [dict(), dict(ALL, bias=False, dim=100, row_pad=3)],
                         ids=["plain", "every-input"])
def test_fixed_backward_kernels_compile_for_sm90_without_spills_and_shrink(nvrtc, features):
    """Each default channel-last backward kernel of width 4 (and bf16 of every width)
    compiled the way a plan does: no errors, no local memory, and less code than the
    kernel it replaces (with seq_idx: the seq_idx build)."""
    failures = []
    replaced = tuple(nvrtc.bwd_seq_build_options()) if features.get("seq_idx") else ()
    for f in FIXED_FAMILIES:
        v = default_variant(f, "sm_90")
        failures += fixed_kernel_problems(nvrtc, v, nvrtc.bwd_fixed_options(*fixed_bwd_call(f, **features)),
                                          shrink=1, generic_options=replaced)
    assert not failures, "\n".join(failures)


@pytest.mark.amd
@pytest.mark.parametrize("target", AMD_TARGETS)
def test_fixed_backward_kernels_compile_for_amd(trixie, rt, target):
    """The same through hipRTC (the constants as #define lines: the worker passes no options)."""
    options_for = lambda f, features: rt.bwd_fixed_options(*fixed_bwd_call(f, **features))  # noqa: E731
    chosen = width4_fixed_builds(FIXED_FAMILIES, target, options_for, (("plain", {}), ("every-input", ALL)))
    compile_for_amd(trixie, target, chosen)
