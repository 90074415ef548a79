"""The decode update's kernels compile: the pairwise covering set of both upd
spaces and every untuned (catalog) upd kernel for NVRTC sm_90, the latter with
no local memory; hipRTC gfx942/gfx90a through rocm-trixie.sh (marker amd).
test_compile_nvidia/amd cover every op together; these run the update alone."""
from __future__ import annotations

import pytest

from cc1d.generator import default_variant, fallback_chain, families

from cc1d.generator.covering import axis_values, covering_variants
from test_compile_amd import AMD_TARGETS, compile_for_amd
from compile_checks import fixed_kernel_problems, with_defines
from test_compile_nvidia import _check

UPD = families("upd")


def test_upd_space_counts():
    assert len(UPD) == 2 * 5 * 7
    assert {f.layout for f in UPD} == {"cf", "cl"}


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_upd_covering_set_covers_every_value_and_pair(layout):
    chosen = covering_variants("upd", layout)
    for axis, vals in axis_values("upd", layout).items():
        got = {dict((("dtypes", (v.family.x_dtype, v.family.w_dtype)),
                     ("width", v.family.width), *v.config))[axis] for v in chosen}
        assert got == vals, axis


def test_upd_covering_set_compiles_for_sm90(nvrtc):
    _check(nvrtc, [*covering_variants("upd", "cf"), *covering_variants("upd", "cl")], may_spill=lambda v: True)


def test_untuned_upd_kernels_compile_for_sm90_without_spills(nvrtc):
    chains = sorted({v for f in UPD for v in fallback_chain(f)}, key=lambda v: v.key())
    _check(nvrtc, chains, may_spill=lambda v: False)


def test_sm90_kernels_say_they_wait_for_the_previous_grid(nvrtc):
    """The runtime launches a kernel early (programmatic dependent launch) only where its
    module exports cc1d_waits_for_previous_grid: sm_90 update, forward, varlen and backward
    kernels do (they start with griddepcontrol.wait, the backward's reduction too); sm_80
    ones cannot."""
    from cc1d.generator.render import render
    marker = b"cc1d_waits_for_previous_grid"
    for op in ("upd", "fwd", "vfwd", "bwd"):
        for layout in ("cf", "cl"):  # one family per op and layout: the code is shared
            v = default_variant(next(f for f in families(op) if f.layout == layout), "sm_90")
            src = render(v)
            assert marker in bytes(nvrtc.compile(src, "sm_90", [])[0]), v.key()
            assert marker not in bytes(nvrtc.compile(src, "sm_80", [])[0]), v.key()
            if op == "bwd":  # both of the module's kernels wait before they touch memory
                for entry in ("cc1d_kernel(", "cc1d_reduce("):
                    body = src[src.index(entry):]
                    first = body[body.index("{") + 1:].lstrip().split("\n", 1)[0]
                    assert first == "cc1d_wait_for_previous_grid();", (v.key(), entry, first)


# ---- plans' fixed kernels (upd.cu.j2 CC1D_UPD_FIXED, runtime upd_fixed_options) ----------

GB = 1 << 32
DTYPE_CODES = {"f32": 0, "f16": 1, "bf16": 2}


def fixed_call(family, *, batch=4, dim=640, pool=6, bias=True, indices=False, cache_seqlens=False,
               pad=-1, silu=True, keeps_width=False):
    """upd_fixed_options' arguments for a call of `family` (fake pointers, contiguous tensors;
    conv_state (pool, dim, width-1) in the family's layout, or (pool, dim, width) with
    keeps_width: HF transformers' caches)."""
    w = family.width
    m = w if keeps_width else w - 1
    ptrs = (GB, 2 * GB, 3 * GB if bias else 0, 4 * GB, 5 * GB if cache_seqlens else 0,
            6 * GB if indices else 0, 0, 8 * GB)
    state = (dim * m, m, 1) if family.layout == "cf" else (dim * m, 1, dim)
    strides = (dim, 1, 1, w, 1, 1, *state, dim, 1, 1, 1, 1, 0)
    return (ptrs, (batch, dim, 1, m, pool, w), strides, pad, DTYPE_CODES[family.x_dtype],
            DTYPE_CODES[family.w_dtype], silu)


FIXED_FAMILIES = [f for f in UPD if f.width == 4 or (f.x_dtype, f.w_dtype, f.layout) == ("bf16", "bf16", "cl")]


def test_fixed_options_name_every_constant_once(rt):
    opts = rt.upd_fixed_options(*fixed_call(UPD[0], pad=-(1 << 63), indices=True))
    names = [o[2:].partition("=")[0] for o in opts]
    assert names[0] == "CC1D_UPD_FIXED" and len(names) == len(set(names)) == 25
    assert "-DCC1D_FIX_DIM=((long long)640ULL)" in opts and "-DCC1D_FIX_HAS_INDICES=((long long)1ULL)" in opts
    assert "-DCC1D_FIX_PAD_SLOT_ID=((long long)9223372036854775808ULL)" in opts  # int64 min, as the kernel reads it
    assert "-DCC1D_FIX_HAS_BIAS=((long long)1ULL)" in opts
    assert "-DCC1D_FIX_HAS_BIAS=((long long)0ULL)" in rt.upd_fixed_options(*fixed_call(UPD[0], bias=False))


@pytest.mark.parametrize("features", [dict(), dict(indices=True, bias=False, silu=False),
                                      dict(cache_seqlens=True, pad=(1 << 63) - 1, dim=100),
                                      dict(keeps_width=True), dict(keeps_width=True, indices=True)])
def test_fixed_update_kernels_compile_for_sm90_without_spills_and_shrink(nvrtc, features):
    """Each default update kernel of width 4 (and bf16 channel-last of every width) compiled
    the way a plan does with a call's constants: no errors, no local memory, and much less
    code than the generic kernel (the constants fold it)."""
    failures = []
    for f in FIXED_FAMILIES:
        v = default_variant(f, "sm_90")
        failures += fixed_kernel_problems(nvrtc, v, nvrtc.upd_fixed_options(*fixed_call(f, **features)), shrink=2)
    assert not failures, "\n".join(failures)


@pytest.mark.amd
@pytest.mark.parametrize("target", AMD_TARGETS)
def test_fixed_update_kernels_compile_for_amd(trixie, rt, target):
    """The same fixed kernels through hipRTC (the constants as #define lines: the worker
    passes no options)."""
    chosen = []
    for f in FIXED_FAMILIES:
        if f.width != 4:
            continue
        v = default_variant(f, target)
        opts = rt.upd_fixed_options(*fixed_call(f, indices=True))
        chosen.append(with_defines(v, opts, "fixed"))
        if f.x_dtype == "bf16":  # the batched step for states of width entries (HF's caches)
            opts = rt.upd_fixed_options(*fixed_call(f, indices=True, keeps_width=True))
            chosen.append(with_defines(v, opts, "fixed-width-state"))
    compile_for_amd(trixie, target, chosen)


@pytest.mark.amd
@pytest.mark.parametrize("target", AMD_TARGETS)
def test_upd_covering_set_and_defaults_compile_for_amd(trixie, target):
    chosen = [*covering_variants("upd", "cf", target), *covering_variants("upd", "cl", target)]
    defaults = {default_variant(f, target).key() for f in UPD}
    chosen += [v for f in UPD for v in fallback_chain(f, target) if v not in chosen]
    compile_for_amd(trixie, target, chosen, no_scratch=defaults)
