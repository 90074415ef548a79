"""Generator: the variant space, its constraints and variant identity."""
from __future__ import annotations

import dataclasses

import pytest

from cc1d.generator import (ARCHS, EPOCH, Family, Variant, arch_info, default_variant,
                            fallback_chain, families, space_for, variants)
from cc1d.generator.space import BWD_CF_WALK_STAGES, bwd_cf_smem_bytes, bwd_cf_walked

FAMILIES = families()


def test_family_count_and_keys_unique():
    assert len(FAMILIES) == 4 * 2 * 5 * 7  # ops (fwd, bwd, vfwd, upd) x layouts x dtype pairs x widths
    assert len({f.key() for f in FAMILIES}) == len(FAMILIES)


@pytest.mark.parametrize("kwargs, field", [
    (dict(op="update"), "op"), (dict(layout="nhwc"), "layout"), (dict(x_dtype="f64"), "dtypes"),
    (dict(x_dtype="f16", w_dtype="bf16"), "dtypes"), (dict(width=1), "width"), (dict(width=9), "width"),
])
def test_family_rejects_bad_fields(kwargs, field):
    base = dict(op="fwd", layout="cf", x_dtype="bf16", w_dtype="f32", width=4)
    with pytest.raises(ValueError, match=field):
        Family(**{**base, **kwargs})


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.key())
def test_every_family_has_valid_variants_and_a_general_fallback(family):
    found = list(variants(family))
    assert found, family.key()
    chain = fallback_chain(family)
    assert chain[0] == default_variant(family)
    assert [v.why_invalid() for v in chain] == [None] * len(chain)
    aligns = [v.geometry()["align_bytes"] for v in chain]
    assert aligns == sorted(aligns, reverse=True) and aligns[-1] == family.x_bytes


def test_key_and_hash_change_with_every_field():
    base = default_variant(Family("fwd", "cf", "bf16", "f32", 4), threads=128)  # every field can move
    others = [dataclasses.replace(base, family=dataclasses.replace(base.family, **change))
              for change in (dict(layout="cl"), dict(x_dtype="f16"), dict(w_dtype="bf16"),
                             dict(width=5))]
    others = [o if o.family.layout == "cf" else default_variant(o.family) for o in others]
    space = space_for(base.family)
    for p in space.params:
        for value in p.values:
            if value != base.params[p.name]:
                v = Variant.of(base.family, **{**base.params, p.name: value})
                if v.why_invalid() is None:
                    others.append(v)
                    break
    assert len(others) >= 4 + len(space.params)
    for o in others:
        assert o.key() != base.key(), o
        assert o.hash() != base.hash(), o.key()


def test_key_is_readable_and_complete():
    v = Variant.of(Family("fwd", "cf", "bf16", "f32", 4), threads=128, vec_bytes=16, nvec=2,
                   rows=1, halo="shfl", max_regs=96)
    assert v.key() == "fwd.cf.bf16wf32.w4.t128.v16.n2.r1.hshfl.g96"
    assert f"generator epoch {EPOCH}" in v.source.splitlines()[0]


def test_config_must_name_every_parameter():
    fam = Family("fwd", "cl", "f32", "f32", 3)
    with pytest.raises(ValueError, match="missing"):
        Variant.of(fam, threads=128)
    with pytest.raises(ValueError, match="unknown"):
        Variant.of(fam, threads=128, vec_bytes=16, tile_d=64, rows_per_thread=8, max_regs=128, bogus=1)


@pytest.mark.parametrize("config, reason", [
    (dict(threads=128, vec_bytes=2, nvec=2, rows=1, halo="shfl", max_regs=128), "element size"),
    (dict(threads=64, vec_bytes=16, nvec=2, rows=4, halo="shfl", max_regs=128), "32 threads"),
    (dict(threads=96, vec_bytes=16, nvec=2, rows=1, halo="shfl", max_regs=128), "not in"),
    (dict(threads=256, vec_bytes=16, nvec=2, rows=1, halo="shfl", max_regs=96), "no tighter"),
])
def test_constraints_prune_with_reasons(config, reason):
    v = Variant.of(Family("fwd", "cf", "f32", "f32", 4), **config)
    assert reason in (v.why_invalid() or "")


def test_channel_last_register_budget_prunes_wide_tiles():
    # bf16 width 8 with 16-byte vectors: 8 channels x (2 * 8 + 1) floats, more than
    # 9/16 of even no cap's 255
    fam = Family("fwd", "cl", "bf16", "bf16", 8)
    v = Variant.of(fam, threads=128, vec_bytes=16, tile_d=128, rows_per_thread=8, max_regs=128)
    assert "registers" in v.why_invalid()
    # a tighter cap leaves less room for the window: width 4, 16-byte vectors need 72
    fam4 = Family("fwd", "cl", "bf16", "bf16", 4)
    ok = dict(threads=128, vec_bytes=16, tile_d=128, rows_per_thread=8)
    assert Variant.of(fam4, **ok, max_regs=128).why_invalid() is None
    assert "(> 54," in Variant.of(fam4, **ok, max_regs=96).why_invalid()


def test_channel_last_tile_fits_shared_memory():
    fam = Family("fwd", "cl", "f32", "f32", 4)
    # 256 threads of 1-float vectors over 32 channels: 8 x 32 rows of 32 positions
    v = Variant.of(fam, threads=256, vec_bytes=4, tile_d=32, rows_per_thread=32, max_regs=255)
    assert v.why_invalid() is None and v.geometry()["tile_l"] == 256
    # 4-float vectors: 32 x 32 rows of 32 positions, 1027 rows of 128 bytes
    big = Variant.of(fam, threads=256, vec_bytes=16, tile_d=32, rows_per_thread=32, max_regs=255)
    assert "shared memory" in big.why_invalid()


def test_warp_size_constraint_depends_on_arch():
    fam = Family("fwd", "cf", "f32", "f32", 4)
    v = Variant.of(fam, threads=64, vec_bytes=16, nvec=1, rows=1, halo="shfl", max_regs=128)
    assert v.why_invalid("sm_90") is None and v.why_invalid("gfx942") is None
    assert arch_info("gfx942").warp_size == 64 and arch_info("sm_90").warp_size == 32
    assert arch_info("gfx1100").warp_size == 32 and "gfx90a" in ARCHS
    with pytest.raises(ValueError, match="arch"):
        arch_info("tpu_v5")


@pytest.mark.parametrize("family", FAMILIES[::7], ids=lambda f: f.key())
def test_geometry_tiles_cover_whole_blocks(family):
    for v in variants(family):
        g = v.geometry()
        assert g["threads"] in (64, 128, 256)
        assert g["tile_l"] >= 1 and g["tile_d"] >= 1
        assert g["align_bytes"] == v.params.get("vec_bytes", family.x_bytes)


def test_backward_channel_first_register_rule_prunes_capped_candidates():
    base = dict(threads=128, vec_bytes=16, nvec=2, rows=1, split_blocks=2048)
    wide = Family("bwd", "cf", "bf16", "bf16", 8)
    assert Variant.of(wide, **base, max_regs=255).why_invalid() is None
    assert Variant.of(wide, **base, max_regs=128).why_invalid() is None
    assert "at most width 5" in Variant.of(wide, **base, max_regs=96).why_invalid()
    narrow = Family("bwd", "cf", "bf16", "bf16", 2)
    assert Variant.of(narrow, **base, max_regs=64).why_invalid() is None
    assert "in flight" in Variant.of(narrow, **{**base, "nvec": 4}, max_regs=64).why_invalid()
    assert "at most width 2" in Variant.of(Family("bwd", "cf", "f32", "f32", 3), **base, max_regs=64).why_invalid()


def test_backward_channel_first_walked_segments_hold_three_vectors_and_a_ring():
    """Above 4 vectors a segment is walked: three packed vectors a step in registers
    (what the register rule counts), its loads staged through a ring in shared memory
    (what the shared-memory rule counts, beside the dweight sums)."""
    fam = Family("bwd", "cf", "bf16", "bf16", 2)
    base = dict(threads=128, vec_bytes=16, rows=1, split_blocks=2048, max_regs=64)
    assert "in flight" in Variant.of(fam, **base, nvec=4).why_invalid()  # 8 vectors held: 32 words
    for nvec in (8, 16):
        v = Variant.of(fam, **base, nvec=nvec)
        assert bwd_cf_walked(v.params) and v.why_invalid() is None
        assert v.geometry()["tile_l"] == 128 * 8 * nvec
        assert "WALK_STAGES = 4;" in v.source and "cp.async" in v.source
    wide = Family("bwd", "cf", "bf16", "bf16", 4)  # its walk loop fits 64 registers; a held one's edge path does not
    assert Variant.of(wide, **base, nvec=8).why_invalid() is None
    assert "at most width 2" in Variant.of(wide, **base, nvec=1).why_invalid()
    assert "at most width 4" in Variant.of(Family("bwd", "cf", "bf16", "bf16", 5), **base, nvec=8).why_invalid()
    held = Variant.of(fam, **base, nvec=2)
    assert not bwd_cf_walked(held.params) and "WALK_STAGES" not in held.source
    assert bwd_cf_smem_bytes(fam, held.params) == 128 * 3 * 4
    assert bwd_cf_smem_bytes(fam, {**held.params, "nvec": 8}) == 128 * 3 * 4 + 128 * BWD_CF_WALK_STAGES * 2 * 16
    small = dataclasses.replace(ARCHS["sm_90"], smem_bytes=16 * 1024)
    assert "shared memory" in Variant.of(fam, **{**base, "max_regs": 255}, nvec=8).why_invalid(small)


def test_backward_channel_first_tile_counts_every_vector():
    # tile_l is what the runtime divides the sequence by: threads per row x vector x nvec.
    fam = Family("bwd", "cf", "bf16", "bf16", 4)
    v = Variant.of(fam, threads=128, vec_bytes=16, nvec=4, rows=4, max_regs=255, split_blocks=512)
    assert v.key() == "bwd.cf.bf16wbf16.w4.t128.v16.n4.r4.g255.s512"
    assert v.geometry()["tile_l"] == 32 * 8 * 4 and v.geometry()["tile_d"] == 4
    assert default_variant(fam).params["max_regs"] == 128
    assert default_variant(Family("bwd", "cf", "bf16", "bf16", 8)).params["max_regs"] == 255


def test_preferred_configs_can_be_limited_to_x_dtypes():
    bf16 = default_variant(Family("bwd", "cf", "bf16", "bf16", 4))
    f16 = default_variant(Family("bwd", "cf", "f16", "f16", 4))
    assert (bf16.params["threads"], bf16.params["nvec"]) == (64, 4)
    assert (f16.params["threads"], f16.params["nvec"]) == (128, 2)
