"""The decode update's kernels compile: the pairwise covering set of both upd
spaces and every untuned (catalog) upd kernel for NVRTC sm_90, the latter with
no local memory; hipRTC gfx942/gfx90a through rocm-trixie.sh (marker amd).
test_compile_nvidia/amd cover every op together; these run the update alone."""
from __future__ import annotations

import pytest

from cc1d.generator import default_variant, fallback_chain, families

from cc1d.generator.covering import axis_values, covering_variants
from test_compile_amd import AMD_TARGETS, _assert_no_scratch, _compile_batch, trixie  # noqa: F401 (fixture)
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


def test_sm90_update_and_forward_kernels_say_they_wait_for_the_previous_grid(nvrtc):
    """The runtime launches a kernel early (programmatic dependent launch) only where its
    module exports cc1d_waits_for_previous_grid: sm_90 update, forward and varlen kernels
    do (they start with griddepcontrol.wait); sm_80 ones cannot, and the backward's do not
    wait."""
    from cc1d.generator.render import render
    marker = b"cc1d_waits_for_previous_grid"
    for op in ("upd", "fwd", "vfwd"):
        for layout in ("cf", "cl"):  # one family per op and layout: the code is shared
            v = default_variant(next(f for f in families(op) if f.layout == layout), "sm_90")
            assert marker in bytes(nvrtc.compile(render(v), "sm_90", [])[0]), v.key()
            assert marker not in bytes(nvrtc.compile(render(v), "sm_80", [])[0]), v.key()
    bwd = default_variant(families("bwd")[0], "sm_90")
    assert marker not in bytes(nvrtc.compile(render(bwd), "sm_90", [])[0])


@pytest.mark.amd
@pytest.mark.parametrize("target", AMD_TARGETS)
def test_upd_covering_set_and_defaults_compile_for_amd(trixie, target):  # noqa: F811
    chosen = [*covering_variants("upd", "cf", target), *covering_variants("upd", "cl", target)]
    defaults = {default_variant(f, target).key() for f in UPD}
    chosen += [v for f in UPD for v in fallback_chain(f, target) if v not in chosen]
    results = _compile_batch(trixie, target, chosen)
    failed = [f"{r['key']}: {r['log'][-1500:]}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    _assert_no_scratch([r for r in results if r["key"] in defaults])
