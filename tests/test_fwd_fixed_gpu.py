"""GPU: forward plans' fixed kernels (the variant compiled with the call's dim, activation,
optional inputs and the strides seqlen does not set as constants; fwd_fixed_options).
A channel-last plan's first run launches the generic kernel, its second compiles and
loads the fixed one; so does a channel-first plan from width 5 or with seq_idx, and other
channel-first plans keep the generic kernel. Channel-first fixed kernels with seq_idx take
full tiles through their own path: every covering and shipped variant is checked there. Every run agrees bit
for bit with the runtime's plain entry, and with the float64 reference. Capture,
warm-up and CC1D_FWD_GENERIC=1 (marker: gpu)."""
from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")]

import cc1d  # noqa: E402
from cc1d import ops  # noqa: E402

from fresh_process import stdout_words  # noqa: E402
from fwd_cases import (Case, assert_close, boundary_rich_seq_idx, launch_variant, make_inputs, poisoned,  # noqa: E402
                       reference, seq_idx_on_device)
from variant_sets import covering_and_shipped  # noqa: E402

PAIRS = (("f32", "f32"), ("f16", "f16"), ("f16", "f32"), ("bf16", "bf16"), ("bf16", "f32"))


@pytest.fixture(autouse=True)
def poison_api_outputs(monkeypatch):
    """Every output the API allocates starts as NaN: an element a kernel skips fails."""
    real, real_like = ops._empty_like_layout, ops._empty_like
    monkeypatch.setattr(ops, "_empty_like_layout", lambda x, shape, dtype=None: real(x, shape, dtype).fill_(float("nan")))
    monkeypatch.setattr(ops, "_empty_like", lambda x: real_like(x).fill_(float("nan")))


def _bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _case(i):
    """Case i: layout, dtypes, width, sizes and every optional input vary; dims fit no tile
    and differ between cases (a fixed kernel is shared by the calls whose constants match)."""
    xd, wd = PAIRS[i % len(PAIRS)]
    return Case(layout=("cl", "cf")[i % 2], x_dtype=xd, w_dtype=wd, width=(4, 2, 3, 4, 5, 8)[i % 6],
                batch=(1, 3, 2, 5)[i % 4], dim=(5128, 100, 2072, 664)[i // 4 % 4] + 2 * i,
                seqlen=(1, 127, 1000, 4097)[i // 3 % 4], bias=i % 3 != 2, silu=i % 4 != 1,
                seq_idx=i % 5 == 3, states=i % 4 == 2, final=i % 3 == 0, sliced=i % 7 == 4)


def _api(case, inp, fs_out):
    res = cc1d.causal_conv1d_fn(inp["x"], inp["weight"], inp["bias"], seq_idx=inp["seq_idx"],
                                initial_states=inp["initial_states"], return_final_states=case.final,
                                final_states_out=fs_out, activation="silu" if case.silu else None)
    return res if case.final else (res, None)


@pytest.mark.parametrize("i", range(16))
def test_a_plans_fixed_kernel_equals_the_generic_kernel_bit_for_bit(i):
    case = _case(i)
    inp = make_inputs(case, seed=500 + i)
    fs_shape = (case.batch, case.dim, case.width - 1)
    fs_generic = poisoned(fs_shape, inp["x"].dtype) if case.final else None
    generic = ops._forward_impl(inp["x"], inp["weight"], inp["bias"], inp["seq_idx"], inp["initial_states"],
                                fs_generic, case.silu)  # the runtime's plain entry (no plan)
    ops._FWD_PLANS.clear()
    torch.cuda.synchronize()
    before = cc1d.dispatch_stats()
    runs = []
    for _ in range(3):
        fs = poisoned(fs_shape, inp["x"].dtype) if case.final else None
        runs.append(_api(case, inp, fs))
        torch.cuda.synchronize()
        runs[-1] += (cc1d.dispatch_stats()["loads"] - before["loads"],)
    fixed = case.layout == "cl" or case.width >= 5 or case.seq_idx  # the calls plans fix (forward.cpp, plans_fix)
    assert [r[2] for r in runs] == ([0, 1, 1] if fixed else [0, 0, 0]), \
        "a channel-last (channel-first width >= 5 or with seq_idx) plan's 2nd run loads its fixed kernel, once"
    ref_out, ref_fs = reference(case, inp)
    for out, fs, _ in runs:
        assert torch.equal(_bits(out), _bits(generic)), case.id()
        assert_close(f"{case.id()} out", out, ref_out, case.x_dtype)
        if case.final:
            assert torch.equal(_bits(fs), _bits(fs_generic))
            assert_close(f"{case.id()} final_states", fs, ref_fs, case.x_dtype)


def test_a_capture_before_the_fixed_kernel_is_loaded_records_the_generic_one():
    """A plan loads nothing while its stream captures a graph (capture_error_mode "global"
    refuses module loads): a capture at the plan's second run records the generic kernel
    and replays correctly; the next eager call loads the fixed kernel."""
    case = Case(layout="cl", x_dtype="bf16", w_dtype="bf16", batch=2, dim=776, seqlen=300)
    inp = make_inputs(case, seed=78)
    ops._FWD_PLANS.clear()
    first = cc1d.causal_conv1d_fn(inp["x"], inp["weight"], inp["bias"], activation="silu")  # generic
    torch.cuda.synchronize()
    before = cc1d.dispatch_stats()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="global"):
        out = cc1d.causal_conv1d_fn(inp["x"], inp["weight"], inp["bias"], activation="silu")
    assert cc1d.dispatch_stats() == before, "the capture compiled or loaded a kernel"
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first)
    assert_close("replayed", out, reference(case, inp)[0], case.x_dtype)
    again = cc1d.causal_conv1d_fn(inp["x"], inp["weight"], inp["bias"], activation="silu")
    torch.cuda.synchronize()
    assert cc1d.dispatch_stats()["loads"] == before["loads"] + 1  # now the fixed kernel
    assert torch.equal(again, first)


def test_a_compiled_graph_launches_the_plans_fixed_kernel():
    """torch.compile's op runs through causal_conv1d_fn's plans: a channel-last graph loads the
    fixed kernel at its second run, as eager calls do, and every run equals the generic
    kernel bit for bit (and the reference)."""
    case = Case(layout="cl", x_dtype="bf16", w_dtype="f32", batch=3, dim=1224, seqlen=333)
    inp = make_inputs(case, seed=79)
    ops._FWD_PLANS.clear()
    generic = ops._forward_impl(inp["x"], inp["weight"], inp["bias"], None, None, None, True)
    compiled = torch.compile(lambda x, w, b: cc1d.causal_conv1d_fn(x, w, b, activation="silu") * 1,
                             fullgraph=True)
    torch.cuda.synchronize()
    before = cc1d.dispatch_stats()
    outs, loads = [], []
    for _ in range(3):
        outs.append(compiled(inp["x"], inp["weight"], inp["bias"]))
        torch.cuda.synchronize()
        loads.append(cc1d.dispatch_stats()["loads"] - before["loads"])
    assert loads == [0, 1, 1], "the graph's op did not go through a plan"
    for out in outs:
        assert torch.equal(_bits(out), _bits(generic))
    assert_close("compiled", outs[-1], reference(case, inp)[0], case.x_dtype)


@pytest.mark.parametrize("out_layout", ["like_x", "other"])
def test_the_aiter_entry_launches_the_plans_fixed_kernel(out_layout):
    """cc1d.aiter.causal_conv1d_fwd writes the caller's out through a plan: out laid out like
    x by a plan for out's own strides, another layout through causal_conv1d_fn's plan and a
    copy. Either loads the fixed kernel at its second call, and every call equals the
    generic kernel bit for bit (and the reference)."""
    from cc1d import aiter
    from cc1d.aiter import causal_conv1d_fwd
    dim = 1288 if out_layout == "like_x" else 1304  # a fixed kernel per test
    case = Case(layout="cl", x_dtype="bf16", w_dtype="bf16", batch=2, dim=dim, seqlen=333)
    inp = make_inputs(case, seed=80)
    ops._FWD_PLANS.clear()
    aiter._DIRECT_PLANS.clear()
    generic = ops._forward_impl(inp["x"], inp["weight"], inp["bias"], None, None, None, True)
    torch.cuda.synchronize()
    before = cc1d.dispatch_stats()
    loads = []
    for _ in range(3):
        if out_layout == "like_x":
            out = torch.full_like(inp["x"], float("nan"))
            assert out.stride() == inp["x"].stride()
        else:
            out = torch.full(inp["x"].shape, float("nan"), device="cuda", dtype=inp["x"].dtype)
        assert causal_conv1d_fwd(out, inp["x"], inp["weight"], inp["bias"], True) is None
        torch.cuda.synchronize()
        loads.append(cc1d.dispatch_stats()["loads"] - before["loads"])
        assert torch.equal(_bits(out), _bits(generic))
    assert loads == [0, 1, 1], "the aiter entry did not go through a plan"
    assert_close("aiter", out, reference(case, inp)[0], case.x_dtype)


def test_warmup_loads_the_fixed_kernel_so_planned_calls_load_nothing():
    ops._FWD_PLANS.clear()
    batch, dim, seqlen = 2, 1352, 257
    cc1d.warmup([(batch, dim, seqlen)], layout="cl")
    x = torch.randn(batch, seqlen, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    w = torch.randn(dim, 4, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(dim, device="cuda", dtype=torch.bfloat16)
    before = cc1d.dispatch_stats()
    outs = [cc1d.causal_conv1d_fn(x, w, b, activation="silu") for _ in range(3)]
    torch.cuda.synchronize()
    assert cc1d.dispatch_stats() == before
    assert torch.equal(outs[0], outs[2])


def test_cc1d_fwd_generic_turns_fixed_kernels_off(tmp_path):
    """The switch is read once per process: each setting runs in a fresh one (outside the
    source tree, whose cc1d/ would shadow the installed package)."""
    script = (
        "import torch, cc1d\n"
        "x = torch.randn(2, 100, 640, device='cuda').transpose(1, 2)\n"
        "w = torch.randn(640, 4, device='cuda')\n"
        "outs = [cc1d.causal_conv1d_fn(x, w, activation='silu') for _ in range(3)]\n"
        "torch.cuda.synchronize()\n"
        "print(cc1d.dispatch_stats()['loads'])\n")
    assert stdout_words(script, tmp_path, "CC1D_FWD_GENERIC", CC1D_FWD_GENERIC="1") == ["1"]  # the generic only
    assert stdout_words(script, tmp_path, "CC1D_FWD_GENERIC") == ["2"]  # and the fixed one


@pytest.mark.parametrize("variant", covering_and_shipped("fwd", "cf"), ids=lambda v: v.key())
def test_channel_first_fixed_kernels_with_seq_idx_match_reference(rt, variant):
    """A plan's channel-first kernel with seq_idx, whose full tiles take the plain taps in
    warps that see no boundary and mask them by sequence id in the others (fwd_cf_tiles.cuh.j2,
    cf_tile_full_seq): three full tiles and an edge per row, rows past the last channel, both
    kinds of warp, boundaries inside vectors and halos, padding, and seq_idx contiguous,
    strided and misaligned; against the float64 reference, outputs poisoned."""
    f = variant.family
    g = variant.geometry()
    gen = torch.Generator().manual_seed(zlib.crc32(variant.key().encode()))
    for k, how in enumerate(("contiguous", "strided", "misaligned")):
        case = Case(layout="cf", x_dtype=f.x_dtype, w_dtype=f.w_dtype, width=f.width, batch=2,
                    dim=2 * g["tile_d"] + 1, seqlen=3 * g["tile_l"] + 37 + 2 * k, bias=k != 1, silu=k != 2,
                    seq_idx=True, states=k == 1, final=k == 2,
                    align=g["align_bytes"] // f.x_bytes)
        inp = make_inputs(case, seed=int(torch.randint(0, 1 << 30, (1,), generator=gen)))
        inp["seq_idx"] = seq_idx_on_device(boundary_rich_seq_idx(case.batch, case.seqlen, gen), how)
        out, fs = launch_variant(rt, variant, case, inp, as_plan=True)
        ref_out, ref_fs = reference(case, inp)
        assert_close(f"{variant.key()} {case.id()} seq_idx {how} out", out, ref_out, case.x_dtype)
        if case.final:
            assert_close(f"{variant.key()} {case.id()} final_states", fs, ref_fs, case.x_dtype)


@pytest.mark.parametrize("variant", covering_and_shipped("fwd", "cl"), ids=lambda v: v.key())
def test_channel_last_fixed_kernels_match_reference_and_the_generic_kernel(rt, variant):
    """A plan's channel-last kernel, whose threads with a whole vector and whole tile of
    rows take the full-tile path (no per-row checks; fwd_channel_last.cu.j2, only in fixed
    kernels without seq_idx) and the rest the checked one: two full tiles and an edge per
    row, a channel group past dim, with and without bias, SiLU and the states; against the
    float64 reference and bit for bit against the generic kernel, outputs poisoned."""
    f = variant.family
    g = variant.geometry()
    for k in range(2):
        case = Case(layout="cl", x_dtype=f.x_dtype, w_dtype=f.w_dtype, width=f.width, batch=2,
                    dim=2 * g["tile_d"] + 1, seqlen=(2 + k) * g["tile_l"] + 37 + 2 * k, bias=k == 0, silu=k == 0,
                    states=k == 1, final=k == 1, align=g["align_bytes"] // f.x_bytes)
        inp = make_inputs(case, seed=zlib.crc32(f"{variant.key()} {k}".encode()))
        out, fs = launch_variant(rt, variant, case, inp, as_plan=True)
        generic_out, generic_fs = launch_variant(rt, variant, case, inp)
        ref_out, ref_fs = reference(case, inp)
        assert_close(f"{variant.key()} {case.id()} out", out, ref_out, case.x_dtype)
        assert torch.equal(_bits(out), _bits(generic_out)), f"{variant.key()} {case.id()}: fixed != generic"
        if case.final:
            assert_close(f"{variant.key()} {case.id()} final_states", fs, ref_fs, case.x_dtype)
            assert torch.equal(_bits(fs), _bits(generic_fs))
