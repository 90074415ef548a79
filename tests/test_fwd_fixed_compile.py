"""Forward plans' fixed kernels (fwd_common.cuh.j2 CC1D_FWD_FIXED, runtime fwd_fixed_options):
the options name what a plan holds constant, the template reads every one of them, and the
default forward kernels compile with them for NVRTC sm_90 (no local memory, less code) and
hipRTC gfx942 (marker amd). Their results on the GPU: test_fwd_fixed_gpu.py."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cc1d.generator import default_variant, families

from compile_checks import fixed_kernel_problems, width4_fixed_builds
from test_compile_amd import AMD_TARGETS, compile_for_amd

GB = 1 << 32
DTYPE_CODES = {"f32": 0, "f16": 1, "bf16": 2}
TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "fwd_common.cuh.j2"
ALL = dict(seq_idx=True, initial_states=True, final_states=True)


def fixed_call(family, *, batch=3, dim=664, seqlen=1000, bias=True, seq_idx=False, initial_states=False,
               final_states=False, silu=True, row_pad=0):
    """fwd_fixed_options' arguments for a call of `family`: fake pointers, x and out in the
    family's layout (their contiguous dim padded by row_pad elements), states contiguous."""
    w, m = family.width, family.width - 1
    if family.layout == "cf":
        xs = (dim * (seqlen + row_pad), seqlen + row_pad, 1)
    else:
        xs = (seqlen * (dim + row_pad), 1, dim + row_pad)
    states = (dim * m, m, 1)
    strides = (*xs, w, 1, 1, *xs, *((seqlen, 1) if seq_idx else (0, 0)),
               *(states if initial_states else (0, 0, 0)), *(states if final_states else (0, 0, 0)))
    ptrs = (GB, 2 * GB, 3 * GB if bias else 0, 4 * GB if seq_idx else 0, 5 * GB if initial_states else 0, 6 * GB,
            7 * GB if final_states else 0)
    return (ptrs, (batch, dim, seqlen, w), strides, DTYPE_CODES[family.x_dtype], DTYPE_CODES[family.w_dtype],
            silu)


def _family(layout, x_dtype="bf16", w_dtype="bf16", width=4):
    return next(f for f in families("fwd") if (f.layout, f.x_dtype, f.w_dtype, f.width) ==
                (layout, x_dtype, w_dtype, width))


def _names(options):
    return [o[2:].partition("=")[0] for o in options]


def test_fixed_options_hold_dim_and_the_strides_seqlen_does_not_set(rt):
    cl = rt.fwd_fixed_options(*fixed_call(_family("cl"), row_pad=8))
    assert _names(cl)[0] == "CC1D_FWD_FIXED" and len(set(_names(cl))) == len(cl)
    assert "-DCC1D_FIX_DIM=((long long)664ULL)" in cl
    assert "-DCC1D_FIX_X_L_STRIDE=((long long)672ULL)" in cl  # the padded row pitch
    assert "-DCC1D_FIX_X_DIM_STRIDE=((long long)1ULL)" in cl
    assert "-DCC1D_FIX_HAS_BIAS=((long long)1ULL)" in cl and "-DCC1D_FIX_SILU=((long long)1ULL)" in cl
    # batch and seqlen (and the strides they set) stay run-time values: calls of other
    # lengths share the kernel
    assert not {"CC1D_FIX_BATCH", "CC1D_FIX_SEQLEN", "CC1D_FIX_X_BATCH_STRIDE"} & set(_names(cl))
    assert cl == rt.fwd_fixed_options(*fixed_call(_family("cl"), row_pad=8, batch=7, seqlen=33))
    cf = rt.fwd_fixed_options(*fixed_call(_family("cf"), bias=False, silu=False))
    assert "CC1D_FIX_X_DIM_STRIDE" not in _names(cf)  # channel-first: a row's length, seqlen
    assert "-DCC1D_FIX_X_L_STRIDE=((long long)1ULL)" in cf
    assert "-DCC1D_FIX_HAS_BIAS=((long long)0ULL)" in cf and "-DCC1D_FIX_SILU=((long long)0ULL)" in cf
    every = rt.fwd_fixed_options(*fixed_call(_family("cf"), **ALL))
    assert {"CC1D_FIX_SEQ_L_STRIDE", "CC1D_FIX_IS_W_STRIDE", "CC1D_FIX_FS_BATCH_STRIDE"} <= set(_names(every))
    assert "-DCC1D_FIX_HAS_SEQ_IDX=((long long)1ULL)" in every


def test_the_template_reads_every_fixed_constant_and_no_other(rt):
    """A stride macro the template does not read would silently stay a run-time value."""
    emitted = set()
    for layout in ("cf", "cl"):
        for features in (dict(), ALL):
            emitted |= set(_names(rt.fwd_fixed_options(*fixed_call(_family(layout), **features))))
    read = set(re.findall(r"\bCC1D_FIX_\w+", TEMPLATE.read_text())) | {"CC1D_FWD_FIXED"}
    assert emitted == read


def test_fixed_options_check_the_call(rt):
    args = list(fixed_call(_family("cl")))
    args[1] = (3, 664, 1000, 9)  # width 9
    with pytest.raises(ValueError, match="width"):
        rt.fwd_fixed_options(*args)


FIXED_FAMILIES = [f for f in families("fwd") if f.width == 4 or (f.x_dtype, f.w_dtype) == ("bf16", "bf16")]


@pytest.mark.parametrize("features", [dict(), dict(ALL, bias=False, silu=False, dim=100, row_pad=3)],
                         ids=["plain", "every-input"])
def test_fixed_forward_kernels_compile_for_sm90_without_spills_and_shrink(nvrtc, features):
    """Each default forward kernel of width 4 (and bf16 of every width) compiled the way a
    plan does: no errors, no local memory, and less code than the generic kernel."""
    failures = []
    for f in FIXED_FAMILIES:
        v = default_variant(f, "sm_90")
        failures += fixed_kernel_problems(nvrtc, v, nvrtc.fwd_fixed_options(*fixed_call(f, **features)), shrink=1)
    assert not failures, "\n".join(failures)


@pytest.mark.amd
@pytest.mark.parametrize("target", AMD_TARGETS)
def test_fixed_forward_kernels_compile_for_amd(trixie, rt, target):
    """The same through hipRTC (the constants as #define lines: the worker passes no options)."""
    options_for = lambda f, features: rt.fwd_fixed_options(*fixed_call(f, **features))  # noqa: E731
    chosen = width4_fixed_builds(FIXED_FAMILIES, target, options_for, (("plain", {}), ("every-input", ALL)))
    compile_for_amd(trixie, target, chosen)
