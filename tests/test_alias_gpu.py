"""The causal_conv1d alias's functions and cc1d.aiter.causal_conv1d_fwd on the GPU against
the float64 reference (marker: gpu). The decode/varlen shims run only where this cc1d
has cc1d.causal_conv1d_update / cc1d.causal_conv1d_varlen_states."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cc1d  # noqa: E402
from cc1d import compat  # noqa: E402
from cc1d.aiter import causal_conv1d_fwd  # noqa: E402
from cc1d.reference import causal_conv1d_ref  # noqa: E402

from fwd_cases import rel_l2  # noqa: E402

pytestmark = pytest.mark.gpu


def _inputs(seed, batch=2, dim=67, seqlen=301, width=4, dtype=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(batch, dim, seqlen, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(dim, width, device="cuda", dtype=dtype, generator=g)
    b = torch.randn(dim, device="cuda", dtype=dtype, generator=g)
    return x, w, b


@pytest.mark.parametrize("silu", [False, True])
def test_cpp_functions_forward_and_backward(silu):
    x, w, b = _inputs(1)
    act = "silu" if silu else None
    fs = torch.full((2, 67, 3), float("nan"), device="cuda")
    out = compat.causal_conv1d_fwd_function(x, w, b, None, None, fs, silu)
    want, want_fs = causal_conv1d_ref(x.double(), w.double(), b.double(), return_final_states=True, activation=act)
    assert rel_l2(out, want) < 1e-5 and torch.equal(fs.double(), want_fs)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
    dout = torch.randn_like(x)
    causal_conv1d_ref(xd, wd, bd, activation=act).backward(dout.double())
    dx_buf = torch.full_like(x, float("nan"))
    dx, dw, db, dis = compat.causal_conv1d_bwd_function(x, w, b, dout, None, None, None, dx_buf, False, silu)
    assert dx is dx_buf and dis is None
    for got, ref in ((dx, xd.grad), (dw, wd.grad), (db, bd.grad)):
        assert rel_l2(got, ref) < 1e-5


def test_peer_autograd_function():
    CausalConv1dFn = compat.autograd_fn()
    x, w, b = _inputs(4)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    out = CausalConv1dFn.apply(*leaves, None, None, False, None, "silu")  # the peer's argument list
    dout = torch.randn_like(out)
    out.backward(dout)
    refs = [t.double().requires_grad_() for t in (x, w, b)]
    want = causal_conv1d_ref(*refs, activation="silu")
    want.backward(dout.double())
    assert rel_l2(out, want) < 1e-5
    for got, ref in zip(leaves, refs):
        assert rel_l2(got.grad, ref.grad) < 1e-5


@pytest.mark.parametrize("layout", ["same", "other", "empty_bias"])
def test_aiter_forward_writes_out(layout):
    x, w, b = _inputs(2)
    if layout == "empty_bias":
        b_arg, b_ref = torch.empty(0, device="cuda"), None
    else:
        b_arg, b_ref = b, b.double()
    out = torch.full_like(x, float("nan"))
    if layout == "other":  # out channel-last while x is channel-first: written through a copy
        out = torch.full((2, 301, 67), float("nan"), device="cuda").transpose(1, 2)
    assert causal_conv1d_fwd(out, x, w, b_arg, True) is None
    want = causal_conv1d_ref(x.double(), w.double(), b_ref, activation="silu")
    assert rel_l2(out, want) < 1e-5
    with pytest.raises(ValueError, match="out: expected shape"):
        causal_conv1d_fwd(out[:, :, :5], x, w, b_arg, True)


def test_aiter_forward_names_its_bad_arguments():
    x, w, b = _inputs(4)
    out = torch.empty_like(x)
    with pytest.raises(TypeError, match="causal_conv1d_fwd: bias: expected a torch.Tensor, got int"):
        causal_conv1d_fwd(out, x, w, 3, True)
    with pytest.raises(ValueError, match=r"causal_conv1d_fwd: weight: expected shape \(dim=67, width\)"):
        causal_conv1d_fwd(out, x, w[:5], b, True)
    causal_conv1d_fwd(out, x, w, b, True)  # planned now: the checks still run for other signatures
    with pytest.raises(ValueError, match="causal_conv1d_fwd: out: expected a tensor on cuda:0"):
        causal_conv1d_fwd(out.cpu(), x, w, b, True)


def test_update_and_varlen_shims():
    missing = [n for n in ("causal_conv1d_update", "causal_conv1d_varlen_states") if not hasattr(cc1d, n)]
    if missing:
        pytest.skip(f"not in this cc1d build (other issues add them): {', '.join(missing)}")
    x, w, b = _inputs(3, seqlen=9)
    state = torch.randn(2, 67, 5, device="cuda")
    ref_state = state.double()  # the reference updates its own float64 copy in place
    for t in range(9):
        got = compat.causal_conv1d_update(x[:, :, t], state, w, b, "silu")
        want = compat.causal_conv1d_update_ref(x[:, :, t].double(), ref_state, w.double(), b.double(), "silu")
        assert got.shape == (2, 67) and rel_l2(got, want) < 1e-5
    assert torch.equal(state.double(), ref_state)
    tokens = torch.randn(40, 67, device="cuda")
    cu = torch.tensor([0, 7, 8, 30, 40], device="cuda", dtype=torch.int32)
    got = compat.causal_conv1d_varlen_states(tokens, cu, 4)
    assert torch.equal(got, compat.causal_conv1d_varlen_states_ref(tokens, cu, 4))
    assert torch.equal(compat.causal_conv1d_update_function(x[:, :, :1], state.clone(), w, b, True, None, None),
                       compat.causal_conv1d_update(x[:, :, :1], state.clone(), w, b, "silu"))
