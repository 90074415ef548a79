"""The backward's seq_idx build (CC1D_BWD_SEQ_TILES, which backward.cpp loads for calls
with seq_idx) on the GPU (marker: gpu). Channel-first (bwd_channel_first.cu.j2): full
segments that read sequence ids, taking the plain taps in warps that see no boundary and
masking them in the others. Channel-last (bwd_channel_last.cu.j2): starts and full steps
that load their ids with their rows, plain where a thread's window is one sequence, masked
elsewhere. Every covering variant and shipped winner of both layouts, against float64
autograd of the reference; and that bwd() launches it. (Not bit for bit against the plain
build: the compiler contracts the masked sums into FMAs differently.)"""
from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from fresh_process import stdout_words  # noqa: E402
from fwd_cases import Case, boundary_rich_seq_idx, make_inputs, seq_idx_on_device  # noqa: E402
from test_backward_gpu import (cf_segment_positions, check_grads, launch_bwd_variant, make_grads,  # noqa: E402
                               poison_gradient_buffers, reference_grads)  # noqa: F401 (autouse fixture)
from variant_sets import covering_and_shipped  # noqa: E402

pytestmark = pytest.mark.gpu


SEQ_BUILD_VARIANTS = [*covering_and_shipped("bwd", "cf"), *covering_and_shipped("bwd", "cl")]


@pytest.mark.parametrize("variant", SEQ_BUILD_VARIANTS, ids=lambda v: v.key())
def test_seq_builds_match_reference(rt, variant):
    """Three work items and an edge per row, rows past the last channel, warps and steps
    with and without a boundary, boundaries inside vectors and halos, padding, the final
    states' gradient, and seq_idx contiguous, strided and misaligned; gradients poisoned.
    Channel-first, the last call's last segment is cut halfway.
    Channel-last rows are longer (about one boundary per 1000 tokens outside the dense
    stretch) and two of the three calls run on one block per channel group: each thread
    then streams many steps, carrying its window's ids from step to step and across rows."""
    f = variant.family
    g = variant.geometry()
    cl = f.layout == "cl"
    gen = torch.Generator().manual_seed(zlib.crc32(variant.key().encode()))
    # the third call's last channel-first segment is cut halfway (walked: edge path above, walk below)
    cut = 0 if cl else cf_segment_positions(variant) // 2
    for k, how in enumerate(("contiguous", "strided", "misaligned")):
        case = Case(layout=f.layout, x_dtype=f.x_dtype, w_dtype=f.w_dtype, width=f.width, batch=2,
                    dim=2 * g["tile_d"] + 1,
                    seqlen=3 * g["tile_l"] + 37 + 2 * k + (1200 if cl else 0) + (cut if k == 2 else 0),
                    bias=k != 1, silu=k != 2, seq_idx=True, states=k == 1, final=k == 2,
                    align=g["align_bytes"] // f.x_bytes)
        inp = make_inputs(case, seed=int(torch.randint(0, 1 << 30, (1,), generator=gen)))
        inp["seq_idx"] = seq_idx_on_device(boundary_rich_seq_idx(case.batch, case.seqlen, gen), how)
        dout, dfinal = make_grads(case, inp, k)
        one_block = dict(variant.as_runtime_dict(), split_blocks=1) if cl and k > 0 else None
        got = launch_bwd_variant(rt, variant, case, inp, dout, dfinal, runtime_dict=one_block, as_plan=True)
        name = f"{variant.key()} {case.id()} seq_idx {how}{' one block a group' if one_block else ''}"
        check_grads(name, case, got, reference_grads(case, inp, dout, dfinal))


def test_bwd_loads_the_seq_build_for_calls_with_seq_idx(tmp_path):
    """bwd() with seq_idx loads the variant's seq_idx build beside its plain one, in both
    layouts, unless CC1D_BWD_GENERIC=1; channel-first calls without seq_idx load no second
    module, and channel-last plans load their fixed kernel too (the seq_idx build's with
    seq_idx) at their second run."""
    script = (
        "import torch, cc1d\n"
        "x = torch.randn(2, 64, 3000, device='cuda', dtype=torch.bfloat16)\n"
        "w = torch.randn(64, 4, device='cuda', dtype=torch.bfloat16)\n"
        "d = torch.randn_like(x)\n"
        "s = torch.zeros(2, 3000, dtype=torch.int32, device='cuda'); s[:, 1500:] = 1\n"
        "xl = x.transpose(1, 2).contiguous().transpose(1, 2); dl = d.transpose(1, 2).contiguous().transpose(1, 2)\n"
        "for a, b in ((x, d), (xl, dl)):\n"
        "    for _ in range(3): cc1d.causal_conv1d_bwd(a, w, None, b, activation='silu')\n"
        "    torch.cuda.synchronize(); print(cc1d.dispatch_stats()['loads'])\n"
        "    for _ in range(3): cc1d.causal_conv1d_bwd(a, w, None, b, seq_idx=s, activation='silu')\n"
        "    torch.cuda.synchronize(); print(cc1d.dispatch_stats()['loads'])\n")

    plain = [int(n) for n in stdout_words(script, tmp_path, "CC1D_BWD_GENERIC", CC1D_BWD_GENERIC="1")]
    seq = [int(n) for n in stdout_words(script, tmp_path, "CC1D_BWD_GENERIC")]
    assert seq[0] == plain[0] >= 1
    assert seq[1] - seq[0] == plain[1] - plain[0] + 1  # channel-first: the seq_idx build beside the plain one
    assert seq[2] - seq[1] == plain[2] - plain[1] + 1 >= 2  # channel-last: its plain build and the plan's fixed one
    assert seq[3] - seq[2] == plain[3] - plain[2] + 2  # the seq_idx build and the plan's fixed seq_idx build
