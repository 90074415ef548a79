"""GPU: backward plans' fixed kernels (channel-last: the variant compiled with the call's
dim, optional inputs and outputs and the strides seqlen does not set as constants;
bwd_fixed_options). A channel-last plan's first run launches the generic kernel, its
second compiles and loads the fixed one; channel-first plans keep the generic kernel.
Every run agrees bit for bit with the runtime's one-shot entry and with float64
autograd of the reference. Capture, warm-up, autograd and CC1D_BWD_GENERIC=1 (marker: gpu)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")]

import cc1d  # noqa: E402
from cc1d import backward  # noqa: E402

from fresh_process import stdout_words  # noqa: E402
from fwd_cases import Case, make_inputs, poisoned  # noqa: E402
from test_backward_gpu import check_grads, make_grads, reference_grads  # noqa: E402
# autouse there, and here once imported: every gradient buffer the backward allocates starts as NaN
from test_backward_gpu import poison_gradient_buffers  # noqa: E402,F401

PAIRS = (("bf16", "bf16"), ("f32", "f32"), ("f16", "f16"), ("bf16", "f32"), ("f16", "f32"))


def _bits(t):
    if t is None:
        return None
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _case(i):
    """Case i: channel-last but for every sixth; dtypes, width, sizes and every optional input
    vary; dims fit no tile and differ between cases (a fixed kernel is shared by the calls
    whose constants match)."""
    xd, wd = PAIRS[i % len(PAIRS)]
    return Case(layout="cf" if i % 6 == 5 else "cl", x_dtype=xd, w_dtype=wd, width=(4, 2, 3, 4, 5, 8, 6, 7)[i % 8],
                batch=(1, 3, 2, 5)[i % 4], dim=(1288, 100, 2072, 664)[i // 4 % 4] + 2 * i,
                seqlen=(1, 127, 1000, 2049)[i // 3 % 4], bias=i % 3 != 2, silu=i % 4 != 1,
                seq_idx=i % 5 == 3, states=i % 4 == 2, final=i % 3 == 0, sliced=i % 7 == 4)


def _api(case, inp, dout, dfinal):
    return cc1d.causal_conv1d_bwd(inp["x"], inp["weight"], inp["bias"], dout, seq_idx=inp["seq_idx"],
                                  initial_states=inp["initial_states"], dfinal_states=dfinal,
                                  return_dinitial_states=inp["initial_states"] is not None,
                                  activation="silu" if case.silu else None)


def _one_shot(rt, case, inp, dout, dfinal):
    """The runtime's one-shot entry (C++ causal_conv1d_bwd, no plan): the generic kernel."""
    x, w, b, s = inp["x"], inp["weight"], inp["bias"], inp["initial_states"]
    dx = poisoned(x.shape, x.dtype, case.layout)
    dweight = backward._new_output(w.shape, w.dtype, x.device)
    dbias = None if b is None else backward._new_output(b.shape, b.dtype, x.device)
    dis = None if s is None else backward._new_output(s.shape, x.dtype, x.device)
    args = backward._bwd_call_args(x, w, b, inp["seq_idx"], s, dout, dfinal, dx, dis, dweight, dbias, None,
                                   case.silu)
    nbytes = rt.bwd_workspace_bytes(*args)
    ws = torch.empty(max(nbytes, 16), dtype=torch.uint8, device="cuda")
    ptrs = (*args[0][:11], ws.data_ptr())
    rt.bwd(ptrs, *args[1:], nbytes, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    return dx, dweight, dbias, dis


@pytest.mark.parametrize("i", range(14))
def test_a_plans_fixed_kernel_equals_the_generic_kernel_bit_for_bit(rt, i):
    case = _case(i)
    inp = make_inputs(case, seed=700 + i)
    dout, dfinal = make_grads(case, inp, seed=700 + i)
    generic = _one_shot(rt, case, inp, dout, dfinal)
    backward._CHECKED_PLANS.clear()
    torch.cuda.synchronize()
    before = cc1d.dispatch_stats()
    runs, loads = [], []
    for _ in range(3):
        runs.append(_api(case, inp, dout, dfinal))
        torch.cuda.synchronize()
        loads.append(cc1d.dispatch_stats()["loads"] - before["loads"])
    fixed = case.layout == "cl"  # the calls backward plans fix (backward.cpp, plans_fix)
    assert loads == ([0, 1, 1] if fixed else [0, 0, 0]), \
        "a channel-last plan's 2nd run loads its fixed kernel, once; a channel-first plan none"
    want = reference_grads(case, inp, dout, dfinal)
    for run in runs:
        for got, gen in zip(run, generic):
            assert (got is None) == (gen is None)
            if got is not None:
                assert torch.equal(_bits(got), _bits(gen)), case.id()
        check_grads(case.id(), case, run, want)


def test_fixed_options_follow_the_call(rt):
    """What the plan compiles in: a padded row pitch, the optional buffers, seq_idx's build."""
    case = Case(layout="cl", x_dtype="bf16", w_dtype="bf16", batch=2, dim=136, seqlen=50, seq_idx=True,
                states=True, final=True, align=8)
    inp = make_inputs(case, seed=9)
    dout, dfinal = make_grads(case, inp, seed=9)
    x = inp["x"]
    dx = poisoned(x.shape, x.dtype, "cl", 8)
    dw = backward._new_output(inp["weight"].shape, inp["weight"].dtype, x.device)
    dis = backward._new_output(inp["initial_states"].shape, x.dtype, x.device)
    args = backward._bwd_call_args(x, inp["weight"], inp["bias"], inp["seq_idx"], inp["initial_states"], dout,
                                   dfinal, dx, dis, dw, None, None, True)
    opts = rt.bwd_fixed_options(*args)
    assert rt.bwd_plan_fixes(*args)
    assert opts[:2] == ["-DCC1D_BWD_FIXED=1", *rt.bwd_seq_build_options()]
    assert f"-DCC1D_FIX_X_L_STRIDE=((long long){x.stride(2)}ULL)" in opts and x.stride(2) == 136
    assert "-DCC1D_FIX_HAS_DBIAS=((long long)0ULL)" in opts  # dbias not asked for
    assert "-DCC1D_FIX_HAS_DINITIAL_STATES=((long long)1ULL)" in opts


def test_a_capture_before_the_fixed_kernel_is_loaded_records_the_generic_one():
    """A plan loads nothing while its stream captures a graph: a capture at the plan's
    second run records the generic kernel and replays correctly; the next eager call
    loads the fixed kernel, which gives the same bits."""
    case = Case(layout="cl", x_dtype="bf16", w_dtype="bf16", batch=2, dim=776, seqlen=300)
    inp = make_inputs(case, seed=78)
    dout, _ = make_grads(case, inp, seed=78)
    backward._CHECKED_PLANS.clear()
    first = _api(case, inp, dout, None)  # generic
    torch.cuda.synchronize()
    before = cc1d.dispatch_stats()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="global"):
        captured = _api(case, inp, dout, None)
    assert cc1d.dispatch_stats() == before, "the capture compiled or loaded a kernel"
    graph.replay()
    torch.cuda.synchronize()
    again = _api(case, inp, dout, None)
    torch.cuda.synchronize()
    assert cc1d.dispatch_stats()["loads"] == before["loads"] + 1  # now the fixed kernel
    for a, b, c in zip(first, captured, again):
        if a is not None:
            assert torch.equal(_bits(a), _bits(b)) and torch.equal(_bits(a), _bits(c))
    check_grads("captured", case, captured, reference_grads(case, inp, dout, None))


def test_training_steps_load_the_fixed_kernel_at_the_second_step():
    """Autograd's backward goes through the plans: eager training steps load the backward's
    fixed kernel once, at the second step, and every step's gradients are the same bits."""
    case = Case(layout="cl", x_dtype="bf16", w_dtype="f32", batch=2, dim=1416, seqlen=333)
    inp = make_inputs(case, seed=81)
    dout, _ = make_grads(case, inp, seed=81)
    backward._PLANS.clear()
    backward._CHECKED_PLANS.clear()
    x = inp["x"].detach().requires_grad_()
    w = inp["weight"].detach().requires_grad_()
    b = inp["bias"].detach().requires_grad_()
    for _ in range(2):  # the forward plan's fixed kernel loaded first (at its own second run)
        cc1d.causal_conv1d_fn(x.detach(), w.detach(), b.detach(), activation="silu")
    torch.cuda.synchronize()
    grads, loads = [], []
    for _ in range(3):
        before = cc1d.dispatch_stats()["loads"]
        out = cc1d.causal_conv1d_fn(x, w, b, activation="silu")
        grads.append(torch.autograd.grad(out, (x, w, b), dout))
        torch.cuda.synchronize()
        loads.append(cc1d.dispatch_stats()["loads"] - before)
    assert loads[1] == 1 and loads[2] == 0, loads
    for g in grads[1:]:
        for a, c in zip(grads[0], g):
            assert torch.equal(_bits(a), _bits(c))
    check_grads("autograd", case, (*grads[0], None), reference_grads(case, inp, dout, None))


def test_warmup_loads_the_fixed_kernel_so_planned_calls_load_nothing():
    backward._CHECKED_PLANS.clear()
    batch, dim, seqlen = 2, 1352, 257
    x = torch.randn(batch, seqlen, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    w = torch.randn(dim, 4, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(dim, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn_like(x)
    cc1d.warmup([(batch, dim, seqlen)], layout="cl", backward=True)
    before = cc1d.dispatch_stats()
    runs = [cc1d.causal_conv1d_bwd(x, w, b, dout, activation="silu") for _ in range(3)]
    torch.cuda.synchronize()
    assert cc1d.dispatch_stats() == before
    assert all(torch.equal(_bits(a), _bits(c)) for a, c in zip(runs[0], runs[2]) if a is not None)


def test_cc1d_bwd_generic_turns_fixed_kernels_off(tmp_path):
    """The switch is read once per process: each setting runs in a fresh one (outside the
    source tree, whose cc1d/ would shadow the installed package)."""
    script = (
        "import torch, cc1d\n"
        "x = torch.randn(2, 100, 648, device='cuda').transpose(1, 2)\n"
        "w = torch.randn(648, 4, device='cuda')\n"
        "dout = torch.randn_like(x)\n"
        "outs = [cc1d.causal_conv1d_bwd(x, w, None, dout, activation='silu') for _ in range(3)]\n"
        "torch.cuda.synchronize()\n"
        "print(cc1d.dispatch_stats()['loads'])\n")
    assert stdout_words(script, tmp_path, "CC1D_BWD_GENERIC", CC1D_BWD_GENERIC="1") == ["1"]  # the generic only
    assert stdout_words(script, tmp_path, "CC1D_BWD_GENERIC") == ["2"]  # and the fixed one
