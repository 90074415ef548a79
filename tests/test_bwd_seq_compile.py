"""The backward's seq_idx build (bwd_channel_first.cu.j2 and bwd_channel_last.cu.j2 under
CC1D_BWD_SEQ_TILES, which backward.cpp loads for calls with seq_idx) compiles for every
covering variant and shipped winner of both layouts: NVRTC sm_90 and hipRTC gfx942
(marker amd). Its results on the GPU: test_bwd_seq_gpu.py."""
from __future__ import annotations

import pytest

from cc1d.generator import default_variant, families
from cc1d.generator.covering import all_covering

from compile_checks import with_defines
from test_compile_amd import compile_for_amd
from variant_sets import covering_and_shipped

SEQ_BUILD = ["-DCC1D_BWD_SEQ_TILES=1"]


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_seq_builds_compile_for_sm90(nvrtc, layout):
    """Every one compiles; and the macro changes the binary (checked on the first: a
    misspelt macro would leave every seq_idx call on the plain build's edge path)."""
    failures = []
    variants = covering_and_shipped("bwd", layout)
    for v in variants:
        try:
            nvrtc.compile(v.source, "sm_90", SEQ_BUILD)
        except RuntimeError as exc:
            failures.append(f"{v.key()}: {str(exc)[:1500]}")
    assert not failures, "\n".join(failures)
    first = variants[0]
    assert nvrtc.compile(first.source, "sm_90", SEQ_BUILD)[0] != nvrtc.compile(first.source, "sm_90", [])[0]


@pytest.mark.amd
def test_seq_builds_compile_for_gfx942(trixie):
    """Through hipRTC (the macro as a #define line: the worker passes no options)."""
    chosen = [with_defines(v, SEQ_BUILD, "seq") for v in all_covering("gfx942") if v.family.op == "bwd"]
    defaults = {f"{default_variant(f, 'gfx942').key()}+seq" for f in families("bwd")}
    compile_for_amd(trixie, "gfx942", chosen, no_scratch=defaults)
