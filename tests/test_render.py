"""Rendering: every valid variant of every family renders to a complete source."""
from __future__ import annotations

import math
import re

import pytest

from cc1d.generator import Family, Variant, default_variant, families, render, variants
from cc1d.generator.render import bwd_realign_max_regs, realign_max_regs, template_context
from cc1d.generator.space import occupancy_bounds


@pytest.mark.parametrize("family", families(), ids=lambda f: f.key())
def test_render_every_variant(family):
    count = 0
    for v in variants(family):
        src = render(v)
        assert src.startswith(f"// cc1d kernel {v.key()} ")
        bounds = occupancy_bounds(v.params["threads"], v.params["max_regs"])
        if family.layout == "cf" and family.op in ("fwd", "bwd"):  # the realigned build's cap is its own
            op = family.op.upper()
            cap = (realign_max_regs if family.op == "fwd" else bwd_realign_max_regs)(v.params["max_regs"])
            twin = occupancy_bounds(v.params["threads"], cap)
            head = "#if"
            if family.op == "bwd":  # the backward's realigned seq_idx build has a cap of its own
                seq_cap = bwd_realign_max_regs(v.params["max_regs"], seq_idx=True)
                seq_blocks = occupancy_bounds(v.params["threads"], seq_cap)["min_blocks"]
                head = (f"#if CC1D_BWD_REALIGN && defined(CC1D_BWD_SEQ_TILES)\n"
                        f"#define CC1D_BWD_MIN_BLOCKS {seq_blocks}\n#elif")
            assert (f"{head} CC1D_{op}_REALIGN\n#define CC1D_{op}_MIN_BLOCKS {twin['min_blocks']}\n#else\n"
                    f"#define CC1D_{op}_MIN_BLOCKS {bounds['min_blocks']}\n#endif\n") in src
            bounds = dict(bounds, min_blocks=f"CC1D_{op}_MIN_BLOCKS")
        assert ('extern "C" __global__ void CC1D_BOUNDS(THREADS, {min_blocks}, {waves_per_eu})'
                .format(**bounds)) in src
        assert "{{" not in src and "{%" not in src
        assert f"constexpr int W = {family.width};" in src
        assert f"constexpr int THREADS = {v.params['threads']};" in src
        count += 1
    assert count > 0


def test_template_context_is_strict():
    v = default_variant(Family("fwd", "cl", "f16", "f32", 3))
    ctx = template_context(v)
    assert ctx["x_ctype"] == "cc1d_f16" and ctx["w_ctype"] == "float"
    assert ctx["vec_elems"] == v.params["vec_bytes"] // 2
    assert (ctx["min_blocks"], ctx["waves_per_eu"]) == (5, 2)  # 128 threads capped at 96 registers


def test_missing_template_variable_is_an_error(monkeypatch):
    import importlib

    import jinja2
    R = importlib.import_module("cc1d.generator.render")  # the module, not the function
    v = Variant.of(Family("fwd", "cf", "f32", "f32", 2), threads=64, vec_bytes=4, nvec=1, rows=1,
                   halo="reload", max_regs=128)
    monkeypatch.setattr(R, "template_context", lambda variant: {"width": 2})
    R.render.cache_clear()
    try:
        with pytest.raises(jinja2.UndefinedError):
            R.render(v)
    finally:
        R.render.cache_clear()


def test_sources_are_vendor_neutral():
    src = render(default_variant(Family("fwd", "cf", "bf16", "bf16", 4)))
    assert "#include" not in src  # no vendor headers: both runtime compilers predefine what we use
    assert re.search(r"#if defined\(__HIPCC_RTC__\)", src)


@pytest.mark.parametrize("layout,x_dtype,w_dtype,approx", [
    ("cf", "bf16", "bf16", True),    # every output bf16: tanh.approx's error is far below their rounding
    ("cf", "bf16", "f32", False),    # fp32 dweight/dbias: it would be 8x their error
    ("cf", "f16", "f16", False),
    ("cf", "f32", "f32", False),
    ("cl", "bf16", "bf16", False),   # no faster there
])
def test_backward_sigmoid_is_approximate_only_where_outputs_are_bf16(layout, x_dtype, w_dtype, approx):
    src = render(default_variant(Family("bwd", layout, x_dtype, w_dtype, 4)))
    name = "CC1D_DEVICE float bwd_silu_g" if approx else "CC1D_DEVICE float bwd_sigmoid"
    assert ("CC1D_DEVICE float bwd_sigmoid" in src) is not approx  # one of the two, never both
    body = src[src.index(name):]
    body = body[:body.index("\n}\n")]
    cuda = body[body.index("#else"):]  # the HIP branch keeps __expf everywhere
    assert ("tanh.approx.f32" in cuda) is approx
    assert ("ex2.approx.ftz.f32" in cuda) is not approx
    assert "__expf" in body[:body.index("#else")]
    # The approximate path works in halves: weights and bias halved on load with SiLU,
    # and the block's dweight/dbias sums halved back before they are stored.
    assert ("constexpr float SILU_SCALE = 0.5f;" in src) is approx
    assert src.count("SILU_SCALE;") == (3 if approx else 0)
    # fast, edge, initial states, and channel-first's seq_idx segments (CC1D_BWD_SEQ_TILES)
    assert src.count("bwd_halve_for_silu(w, bias);") == ((3 + (layout == "cf")) if approx else 0)


def test_halved_silu_gradient_algebra():
    """bwd_silu_g's identity: with h = z/2 and t = tanh(h), 2 * s (1 + z (1 - s)) equals
    (1 + t) (1 + h (1 - t)) = 1 + t + h (1 - t^2), s the sigmoid of z (float64, z over the
    range that matters)."""
    for i in range(-3000, 3001):
        z = i / 100.0
        s = 1.0 / (1.0 + math.exp(-z))
        want = 2.0 * s * (1.0 + z * (1.0 - s))
        h = z / 2.0
        t = math.tanh(h)
        got = 1.0 + t + h * (1.0 - t * t)  # the form the kernel evaluates
        assert abs((1.0 + t) * (1.0 + h * (1.0 - t)) - got) < 1e-12
        assert abs(got - want) < 1e-12, (z, got, want)


def test_forward_sources_have_no_backward_sigmoid():
    assert "tanh.approx" not in render(default_variant(Family("fwd", "cf", "bf16", "bf16", 4)))


@pytest.mark.parametrize("op", ["fwd", "vfwd"])
def test_cut_tile_segments_move_within_their_tile_only_where_varlen_mends_in_the_kernel(op):
    """The channel-first forward's cut tile moves a segment back to end at the sequence's end,
    rewriting outputs before it. Varlen kernels that mend their sequences' first outputs in the
    same launch (mend = tile) must keep it inside their own tile: another block may already
    have mended the outputs before it."""
    fam = Family(op, "cf", "bf16", "bf16", 4)
    for v in variants(fam):
        want = "true" if v.params.get("mend") == "tile" else "false"
        assert f"constexpr bool CF_CUT_IN_TILE = {want};" in render(v), v.key()


def test_dispatchers_segment_length_is_the_kernels():
    """The dispatcher's segment length of a channel-first forward winner (runtime/src/dispatch.cpp,
    generator/variant.py cf_segment_positions, from the stored geometry) is the kernel's SEG_L:
    a row's threads in segments of one warp (32 lanes on sm_90), VE * NV positions a lane."""
    from cc1d.generator.variant import cf_segment_positions
    for fam in [f for f in families() if f.op == "fwd" and f.layout == "cf"]:
        for v in variants(fam):
            g, ctx = v.geometry(), template_context(v)
            per_row = v.params["threads"] // v.params["rows"]
            seg_l = min(per_row, 32) * ctx["vec_elems"] * v.params["nvec"]
            assert cf_segment_positions(g, "sm_90") == seg_l, v.key()


def test_backward_twins_cap_is_128_registers():
    """The realigned backward build spilled at the shipped caps of 64 and 96 (ptxas, sm_90);
    uncapped (255) it took up to 177 registers, so fewer blocks fit (render.py)."""
    assert [bwd_realign_max_regs(c) for c in (64, 96, 128, 255)] == [128, 128, 128, 128]
    assert [bwd_realign_max_regs(c, seq_idx=True) for c in (64, 96, 128, 255)] == [128, 128, 128, 255]
    v = Variant.of(Family("bwd", "cf", "bf16", "bf16", 4), threads=128, vec_bytes=16, nvec=2, rows=4,
                   max_regs=96, split_blocks=512)
    ctx = template_context(v)
    assert ctx["realign_min_blocks"] == occupancy_bounds(128, 128)["min_blocks"] < ctx["min_blocks"]
    uncapped = template_context(Variant.of(Family("bwd", "cf", "bf16", "bf16", 4), threads=128, vec_bytes=16,
                                           nvec=8, rows=4, max_regs=255, split_blocks=512))
    assert uncapped["realign_min_blocks"] == 4 > uncapped["realign_seq_min_blocks"] == uncapped["min_blocks"]
