"""NVRTC: a pairwise covering set of every family's variants, and every untuned
kernel, compile for sm_90 (every variant: opt-in --all-variants)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from cc1d.generator import default_variant, fallback_chain, families

from cc1d.generator.covering import all_covering, axis_values, covering_variants
from compile_checks import PTXAS_VERBOSE, nvidia_resources

COVERING = all_covering("sm_90")


def _compile_all(rt, variants, target="sm_90", workers=2):
    def one(v):
        try:
            _, log = rt.compile(v.source, target, PTXAS_VERBOSE)
            return v, nvidia_resources(log), None
        except RuntimeError as exc:
            return v, None, str(exc)
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, variants))


def test_covering_set_covers_every_value_and_pair():
    for op, layout in {("fwd", "cf"), ("fwd", "cl")}:
        chosen = covering_variants(op, layout)
        values = axis_values(op, layout)
        for axis, vals in values.items():
            got = {dict((("dtypes", (v.family.x_dtype, v.family.w_dtype)),
                         ("width", v.family.width), *v.config))[axis] for v in chosen}
            assert got == vals, (layout, axis)


def _check(rt, variants, may_spill):
    failures, spills = [], []
    for v, res, err in _compile_all(rt, variants):
        if err:
            failures.append(f"{v.key()}: {err[:2000]}")
        elif (res["spill_stores"] or res["spill_loads"] or res["stack"]) and not may_spill(v):
            spills.append(f"{v.key()}: {res}")
    assert not failures, "\n".join(failures)
    assert not spills, "local-memory use:\n" + "\n".join(spills)


def test_covering_set_compiles_for_sm90(nvrtc):
    # Tuning candidates may spill (a tight register cap, or many loads in flight
    # at one element per vector): spills cost speed, never correctness, and the
    # tuner times every candidate. Untuned kernels are held to no spills below.
    _check(nvrtc, COVERING, may_spill=lambda v: True)


def test_every_untuned_kernel_compiles_for_sm90_without_spills(nvrtc):
    # The defaults and their alignment fallbacks run untuned: no spills at all.
    chains = sorted({v for f in families() for v in fallback_chain(f)}, key=lambda v: v.key())
    _check(nvrtc, chains, may_spill=lambda v: False)


def test_compile_error_carries_the_log(nvrtc):
    with pytest.raises(RuntimeError, match="cc1d_kernel|error"):
        nvrtc.compile('extern "C" __global__ void cc1d_kernel() { undeclared_symbol(); }', "sm_90")


def test_only_channel_last_forward_modules_say_their_grid_is_groups_first(nvrtc):
    """The runtime launches a forward grid as (channel groups, chunks, batch) only where
    the module exports cc1d_cl_groups_first_grid: the channel-last forward's kernel, also
    varlen's channel-last one. The other kernels read their grids as before."""
    marker = b"cc1d_cl_groups_first_grid"
    for op in ("fwd", "vfwd", "bwd", "upd"):
        for layout in ("cf", "cl"):
            v = default_variant(next(f for f in families(op) if f.layout == layout), "sm_90")
            binary = bytes(nvrtc.compile(v.source, "sm_90", [])[0])
            assert (marker in binary) == (op in ("fwd", "vfwd") and layout == "cl"), v.key()


@pytest.mark.all_variants
@pytest.mark.slow
def test_every_variant_compiles_for_sm90(nvrtc):
    import os

    from cc1d.generator import variants
    every = [v for f in families() for v in variants(f)]
    results = _compile_all(nvrtc, every, workers=os.cpu_count() or 2)
    failures = [f"{v.key()}: {err[:500]}" for v, _, err in results if err]
    spills = [v.key() for v, res, err in results if not err and (res["spill_stores"] or res["stack"])]
    print(f"\ncompiled {len(results)} variants for sm_90: {len(failures)} failed, "
          f"{len(spills)} with local memory")
    assert not failures, "\n".join(failures[:50])


def test_resources_read_cc1d_kernel_whatever_the_kernel_order():
    # ptxas may report a source's second kernel (cc1d_reduce) first: its numbers are not
    # cc1d_kernel's, and local memory in either one counts.
    log = ("ptxas info    : Compiling entry function 'cc1d_reduce' for 'sm_90'\n"
           "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 26 registers, used 0 barriers\n"
           "ptxas info    : Compiling entry function 'cc1d_kernel' for 'sm_90'\n"
           "ptxas         .     80 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 124 registers, used 0 barriers\n")
    assert nvidia_resources(log) == dict(registers=124, stack=80, spill_stores=8, spill_loads=4)
    with pytest.raises(AssertionError, match="cc1d_kernel"):
        nvidia_resources(log.replace("cc1d_kernel", "other"))
