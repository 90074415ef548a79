"""The varlen prefill's kernels (op vfwd) compile: NVRTC sm_90 (pairwise covering
set, and every untuned kernel without spills) and hipRTC gfx942/gfx90a (covering
set; defaults without scratch). test_compile_nvidia.py / test_compile_amd.py cover
every op together; this file runs the vfwd part alone."""
from __future__ import annotations

import pytest

from cc1d.generator import default_variant, fallback_chain, families

from cc1d.generator.covering import axis_values, covering_variants
from test_compile_amd import AMD_TARGETS

LAYOUTS = ("cf", "cl")


def test_vfwd_covering_set_covers_every_value():
    for layout in LAYOUTS:
        chosen = covering_variants("vfwd", layout)
        for axis, vals in axis_values("vfwd", layout).items():
            got = {dict((("dtypes", (v.family.x_dtype, v.family.w_dtype)), ("width", v.family.width),
                         *v.config))[axis] for v in chosen}
            assert got == vals, (layout, axis)


def test_vfwd_covering_set_compiles_for_sm90(nvrtc):
    from test_compile_nvidia import _check
    chosen = [v for lay in LAYOUTS for v in covering_variants("vfwd", lay)]
    _check(nvrtc, chosen, may_spill=lambda v: True)


def test_vfwd_untuned_kernels_compile_for_sm90_without_spills(nvrtc):
    from test_compile_nvidia import _check
    chains = sorted({v for f in families("vfwd") for v in fallback_chain(f)}, key=lambda v: v.key())
    assert len(chains) >= 70
    _check(nvrtc, chains, may_spill=lambda v: False)


@pytest.mark.amd
@pytest.mark.parametrize("target", AMD_TARGETS)
def test_vfwd_compiles_for_amd(trixie, target):
    from test_compile_amd import compile_for_amd
    defaults = {default_variant(f, target) for f in families("vfwd")}
    chosen = sorted({*(v for lay in LAYOUTS for v in covering_variants("vfwd", lay, target)), *defaults},
                    key=lambda v: v.key())
    compile_for_amd(trixie, target, chosen, no_scratch={v.key() for v in defaults})
