"""Bad input through the PyTorch API, as data (issue 8, item 1).

Tables of cases per public function: a mutation of valid arguments, and either the
exception (type, and the argument the message must name) or ACCEPTED (the peer
takes it: the result must match the float64 reference). Rows marked cpu run
wherever torch is, without a GPU: the forward through ``cc1d.explain(arch=...)``
(the same ``_validate`` as ``causal_conv1d_fn``), the backward through its
validator with the device requirement off. Every row also runs on a GPU through
the public function itself (marker gpu). A hypothesis property test draws valid
shapes, strides, dtypes and features and checks both directions on the GPU.

Adding an op: a builder of valid arguments, a table of rows, a runner in RUNNERS.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import pytest

torch = pytest.importorskip("torch")

import cc1d  # noqa: E402
from cc1d import backward  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
gpu = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]
ACCEPTED = None  # `exc` of a row the peer accepts
TOL = {torch.float32: 5e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}
B, D, L, W = 2, 64, 127, 4


@dataclass(frozen=True)
class Row:
    name: str
    arg: str                         # the argument the message must name ("x" -> "x:")
    mutate: Callable[[dict, str], dict]
    exc: Optional[type]              # ACCEPTED: the peer takes it, the result must be right
    words: str = ""                  # also in the message
    cpu: bool = True                 # decidable without a device (no mixed devices, no launch)


def fwd_inputs(device: str, seed: int = 0, dtype=torch.bfloat16) -> dict:
    g = torch.Generator().manual_seed(seed)
    return dict(x=torch.randn(B, D, L, generator=g).to(dtype).to(device),
                weight=(torch.randn(D, W, generator=g) / 2).to(device),
                bias=torch.randn(D, generator=g).to(device), activation="silu")


def _rt(t: dict, **kw) -> dict:
    return {**t, **kw}


def _odd_slice(t):
    """t's values in a buffer one element further on: an odd element offset."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    return view


def _no_unit_stride(x):
    """x's values in a view where neither inner stride is 1."""
    big = torch.empty(x.shape[0], x.shape[1], 2 * x.shape[2], dtype=x.dtype, device=x.device)
    view = big[:, :, ::2]
    view.copy_(x)
    return view


def _seq_idx(t, dev, dtype=torch.int32, shape=None):
    g = torch.Generator().manual_seed(5)
    s = torch.randint(-1, 3, shape or (B, L), generator=g).sort(dim=-1).values
    return s.to(dtype).to(dev)


FWD_ROWS = [
    Row("x-not-a-tensor", "x", lambda t, d: _rt(t, x=t["x"].tolist()), TypeError, "torch.Tensor"),
    Row("x-rank-2", "x", lambda t, d: _rt(t, x=t["x"][0]), ValueError, "3-D"),
    Row("x-rank-4", "x", lambda t, d: _rt(t, x=t["x"][None]), ValueError, "3-D"),
    Row("x-float64", "x", lambda t, d: _rt(t, x=t["x"].double(), weight=t["weight"].double(),
                                           bias=t["bias"].double()), TypeError, "dtype"),
    Row("x-int32", "x", lambda t, d: _rt(t, x=t["x"].int()), TypeError, "dtype"),
    Row("x-zero-batch", "x", lambda t, d: _rt(t, x=t["x"][:0]), ValueError, ">= 1"),
    Row("x-zero-seqlen", "x", lambda t, d: _rt(t, x=t["x"][:, :, :0]), ValueError, ">= 1"),
    Row("x-zero-dim", "x", lambda t, d: _rt(t, x=t["x"][:, :0], weight=t["weight"][:0], bias=t["bias"][:0]),
        ValueError, ">= 1"),
    Row("weight-not-a-tensor", "weight", lambda t, d: _rt(t, weight=None), TypeError, "torch.Tensor"),
    Row("weight-rank-1", "weight", lambda t, d: _rt(t, weight=t["weight"][:, 0]), ValueError, "2-D"),
    Row("weight-width-0", "weight", lambda t, d: _rt(t, weight=t["weight"][:, :0]), ValueError, "width"),
    Row("weight-width-1", "weight", lambda t, d: _rt(t, weight=t["weight"][:, :1]), ValueError, "width"),
    Row("weight-width-9", "weight", lambda t, d: _rt(t, weight=torch.randn(D, 9, device=d)), ValueError, "width"),
    Row("weight-dim-mismatch", "weight", lambda t, d: _rt(t, weight=t["weight"][:10]), ValueError, "dim"),
    Row("weight-f16-for-bf16-x", "weight", lambda t, d: _rt(t, weight=t["weight"].half(), bias=t["bias"].half()),
        TypeError, "dtype"),
    Row("bias-rank-2", "bias", lambda t, d: _rt(t, bias=t["bias"][None]), ValueError, "1-D"),
    Row("bias-shape", "bias", lambda t, d: _rt(t, bias=t["bias"][:5]), ValueError, "shape"),
    Row("bias-dtype", "bias", lambda t, d: _rt(t, bias=t["bias"].half()), TypeError, "dtype"),
    Row("seq_idx-int64", "seq_idx", lambda t, d: _rt(t, seq_idx=_seq_idx(t, d, torch.int64)), TypeError, "int32"),
    Row("seq_idx-float", "seq_idx", lambda t, d: _rt(t, seq_idx=_seq_idx(t, d, torch.float32)), TypeError, "int32"),
    Row("seq_idx-shape", "seq_idx", lambda t, d: _rt(t, seq_idx=_seq_idx(t, d, shape=(B, 5))), ValueError, "shape"),
    Row("seq_idx-rank-1", "seq_idx", lambda t, d: _rt(t, seq_idx=_seq_idx(t, d)[0]), ValueError, "2-D"),
    Row("initial_states-width", "initial_states",
        lambda t, d: _rt(t, initial_states=torch.zeros(B, D, W, dtype=t["x"].dtype, device=d)), ValueError, "width-1"),
    Row("initial_states-dtype", "initial_states",
        lambda t, d: _rt(t, initial_states=torch.zeros(B, D, W - 1, device=d)), TypeError, "dtype"),
    Row("initial_states-rank", "initial_states",
        lambda t, d: _rt(t, initial_states=torch.zeros(D, W - 1, dtype=t["x"].dtype, device=d)), ValueError, "3-D"),
    Row("activation-relu", "activation", lambda t, d: _rt(t, activation="relu"), ValueError, "silu"),
    Row("activation-not-a-string", "activation", lambda t, d: _rt(t, activation=1), ValueError, "silu"),
    # need CUDA tensors (device checks) or a launch
    Row("x-on-cpu", "x", lambda t, d: _rt(t, x=t["x"].cpu()), ValueError, "CUDA", cpu=False),
    Row("weight-on-cpu", "weight", lambda t, d: _rt(t, weight=t["weight"].cpu()), ValueError, "device", cpu=False),
    Row("bias-on-cpu", "bias", lambda t, d: _rt(t, bias=t["bias"].cpu()), ValueError, "device", cpu=False),
    Row("seq_idx-on-cpu", "seq_idx", lambda t, d: _rt(t, seq_idx=_seq_idx(t, "cpu")), ValueError, "device",
        cpu=False),
    Row("initial_states-on-cpu", "initial_states",
        lambda t, d: _rt(t, initial_states=torch.zeros(B, D, W - 1, dtype=t["x"].dtype)), ValueError, "device",
        cpu=False),
    Row("final_states_out-shape", "final_states_out",
        lambda t, d: _rt(t, return_final_states=True,
                         final_states_out=torch.empty(B, D, W, dtype=t["x"].dtype, device=d)),
        ValueError, "width-1", cpu=False),
    Row("final_states_out-dtype", "final_states_out",
        lambda t, d: _rt(t, return_final_states=True, final_states_out=torch.empty(B, D, W - 1, device=d)),
        TypeError, "dtype", cpu=False),
    # the peer accepts these: the result must be right
    Row("x-channel-last", "x", lambda t, d: _rt(t, x=t["x"].transpose(1, 2).contiguous().transpose(1, 2)), ACCEPTED),
    Row("x-odd-element-offset", "x", lambda t, d: _rt(t, x=_odd_slice(t["x"])), ACCEPTED),
    Row("x-channel-last-odd-offset", "x",
        lambda t, d: _rt(t, x=_odd_slice(t["x"].transpose(1, 2).contiguous()).transpose(1, 2)), ACCEPTED),
    Row("x-no-unit-stride", "x", lambda t, d: _rt(t, x=_no_unit_stride(t["x"])), ACCEPTED),
    Row("weight-transposed", "weight", lambda t, d: _rt(t, weight=t["weight"].t().contiguous().t()), ACCEPTED),
    Row("weight-odd-offset", "weight", lambda t, d: _rt(t, weight=_odd_slice(t["weight"])), ACCEPTED),
    Row("bias-strided", "bias", lambda t, d: _rt(t, bias=torch.stack([t["bias"], t["bias"]], 1)[:, 0]), ACCEPTED),
    Row("weight-bias-bf16", "weight", lambda t, d: _rt(t, weight=t["weight"].bfloat16(), bias=t["bias"].bfloat16()),
        ACCEPTED),
    Row("x-f32", "x", lambda t, d: _rt(t, x=t["x"].float()), ACCEPTED),
    Row("x-f16-weight-f32", "x", lambda t, d: _rt(t, x=t["x"].half()), ACCEPTED),
    Row("seq_idx-any-int32-values", "seq_idx",
        lambda t, d: _rt(t, seq_idx=torch.tensor([[-5, 7, 7, 2**31 - 1] * (L // 4) + [0] * (L % 4)] * B,
                                                 dtype=torch.int32, device=d)), ACCEPTED),
    Row("seq_idx-strided", "seq_idx", lambda t, d: _rt(t, seq_idx=_seq_idx(t, d, shape=(B, 2 * L))[:, ::2]),
        ACCEPTED),
    Row("initial_states-non-contiguous", "initial_states",
        lambda t, d: _rt(t, initial_states=torch.randn(B, W - 1, D, device=d).to(t["x"].dtype).transpose(1, 2)),
        ACCEPTED),
    Row("tiny-1x1x1", "x", lambda t, d: _rt(t, x=t["x"][:1, :1, :1], weight=t["weight"][:1], bias=t["bias"][:1]),
        ACCEPTED),
]


def bwd_inputs(device: str, seed: int = 0) -> dict:
    t = fwd_inputs(device, seed)
    g = torch.Generator().manual_seed(seed + 1)
    t["dout"] = torch.randn(B, D, L, generator=g).to(t["x"].dtype).to(device)
    return t


BWD_ROWS = [
    *[Row(r.name, r.arg, r.mutate, r.exc, r.words, r.cpu) for r in FWD_ROWS
      if r.exc is not ACCEPTED and r.arg not in ("final_states_out",)],
    Row("dout-not-a-tensor", "dout", lambda t, d: _rt(t, dout=None), TypeError, "torch.Tensor"),
    Row("dout-shape", "dout", lambda t, d: _rt(t, dout=t["dout"][:, :, :5]), ValueError, "shape"),
    Row("dout-rank", "dout", lambda t, d: _rt(t, dout=t["dout"][0]), ValueError, "3-D"),
    Row("dout-dtype", "dout", lambda t, d: _rt(t, dout=t["dout"].float()), TypeError, "dtype"),
    Row("dfinal_states-shape", "dfinal_states",
        lambda t, d: _rt(t, dfinal_states=torch.zeros(B, D, W, dtype=t["x"].dtype, device=d)), ValueError, "width-1"),
    Row("dfinal_states-dtype", "dfinal_states",
        lambda t, d: _rt(t, dfinal_states=torch.zeros(B, D, W - 1, device=d)), TypeError, "dtype"),
    Row("dx-shape", "dx", lambda t, d: _rt(t, dx=torch.empty(B, D, L + 1, dtype=t["x"].dtype, device=d)),
        ValueError, "shape"),
    Row("dx-dtype", "dx", lambda t, d: _rt(t, dx=torch.empty(B, D, L, device=d)), TypeError, "dtype"),
    Row("dx-is-x", "dx", lambda t, d: _rt(t, dx=t["x"]), ValueError, "same memory as x"),
    Row("dx-is-dout", "dx", lambda t, d: _rt(t, dx=t["dout"]), ValueError, "same memory as dout"),
    Row("dout-on-cpu", "dout", lambda t, d: _rt(t, dout=t["dout"].cpu()), ValueError, "device", cpu=False),
    Row("return_dinitial_states-without-initial_states", "return_dinitial_states",
        lambda t, d: _rt(t, return_dinitial_states=True), ValueError, "initial_states", cpu=False),
    Row("dout-channel-last-x-channel-first", "dout",
        lambda t, d: _rt(t, dout=t["dout"].transpose(1, 2).contiguous().transpose(1, 2)), ACCEPTED),
    Row("dout-no-unit-stride", "dout", lambda t, d: _rt(t, dout=_no_unit_stride(t["dout"])), ACCEPTED),
    Row("x-odd-element-offset", "x", lambda t, d: _rt(t, x=_odd_slice(t["x"])), ACCEPTED),
    Row("dout-odd-element-offset", "dout", lambda t, d: _rt(t, dout=_odd_slice(t["dout"])), ACCEPTED),
    Row("x-channel-last", "x", lambda t, d: _rt(t, x=t["x"].transpose(1, 2).contiguous().transpose(1, 2),
                                               dout=t["dout"].transpose(1, 2).contiguous().transpose(1, 2)),
        ACCEPTED),
    Row("dx-given-other-layout", "dx",
        lambda t, d: _rt(t, dx=torch.full((B, L, D), float("nan"), dtype=t["x"].dtype, device=d).transpose(1, 2)),
        ACCEPTED),
    Row("weight-transposed", "weight", lambda t, d: _rt(t, weight=t["weight"].t().contiguous().t()), ACCEPTED),
]


# ---- runners: the public function on the GPU, its checks without one ---------------

def fwd_call(t: dict, on_gpu: bool):
    if on_gpu:
        return cc1d.causal_conv1d_fn(**t)
    t = dict(t)
    t.pop("final_states_out", None)
    return cc1d.explain(**t, arch="sm_90")


def bwd_call(t: dict, on_gpu: bool):
    if on_gpu:
        return cc1d.causal_conv1d_bwd(**t)
    return backward._validate_bwd(t["x"], t["weight"], t.get("bias"), t["dout"], t.get("seq_idx"),
                                  t.get("initial_states"), t.get("dfinal_states"), t.get("dx"),
                                  t.get("activation"), require_device=False)


def _double(v):
    return v.detach().double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v


def fwd_reference(t: dict):
    return cc1d.causal_conv1d_ref(_double(t["x"]), _double(t["weight"]), _double(t.get("bias")),
                                  initial_states=_double(t.get("initial_states")), activation=t.get("activation"),
                                  seq_idx=t.get("seq_idx"))


def bwd_reference(t: dict):
    leaf = lambda v: None if v is None else _double(v).requires_grad_()  # noqa: E731
    x, w, b = leaf(t["x"]), leaf(t["weight"]), leaf(t.get("bias"))
    s = _double(t.get("initial_states"))
    out = cc1d.causal_conv1d_ref(x, w, b, initial_states=s, activation=t.get("activation"),
                                 seq_idx=t.get("seq_idx"))
    (out * t["dout"].double()).sum().backward()
    return x.grad, w.grad, None if b is None else b.grad


def rel_l2(got, want) -> float:
    got, want = got.double(), want.double()
    return float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want).clamp_min(1e-30))


def check_close(name: str, got, want, dtype) -> None:
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert not torch.isnan(got).any(), f"{name}: NaN (unwritten or invalid)"
    err = rel_l2(got, want)
    assert err <= TOL[dtype], f"{name}: relative L2 error {err:.3e}"


def check_fwd(t: dict, result) -> None:
    check_close("out", result, fwd_reference(t), t["x"].dtype)


def check_bwd(t: dict, result) -> None:
    dx, dweight, dbias, _ = result
    want = bwd_reference(t)
    if t.get("dx") is not None:
        assert dx is t["dx"], "a caller's dx is written in place and returned"
    for name, got, ref in zip(("dx", "dweight", "dbias"), (dx, dweight, dbias), want):
        check_close(name, got, ref, t["x"].dtype)


@dataclass(frozen=True)
class Runner:
    inputs: Callable[[str], dict]
    rows: list
    call: Callable[[dict, bool], object]
    check: Callable[[dict, object], None]


RUNNERS = {"causal_conv1d_fn": Runner(fwd_inputs, FWD_ROWS, fwd_call, check_fwd),
           "causal_conv1d_bwd": Runner(bwd_inputs, BWD_ROWS, bwd_call, check_bwd)}


def _params(on_gpu: bool):
    out = []
    for fn, r in RUNNERS.items():
        for row in r.rows:
            if on_gpu or (row.cpu and row.exc is not ACCEPTED):
                out.append(pytest.param(fn, row, id=f"{fn}-{row.name}"))
    return out


def _expect_error(fn: str, row: Row, t: dict, on_gpu: bool) -> None:
    with pytest.raises(row.exc) as info:
        RUNNERS[fn].call(t, on_gpu)
    msg = str(info.value)
    assert f"{row.arg}:" in msg or f"{row.arg} " in msg, f"message does not name {row.arg}: {msg}"
    assert row.words in msg, msg


@pytest.mark.parametrize("fn, row", _params(on_gpu=False))
def test_bad_input_without_a_device(fn, row):
    t = row.mutate(RUNNERS[fn].inputs("cpu"), "cpu")
    _expect_error(fn, row, t, on_gpu=False)


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every buffer the API allocates starts as NaN: an unwritten element fails."""
    from cc1d import ops
    real_layout, real_like, real_new = ops._empty_like_layout, ops._empty_like, backward._new_output
    monkeypatch.setattr(ops, "_empty_like_layout",
                        lambda x, shape, dtype=None: real_layout(x, shape, dtype).fill_(float("nan")))
    monkeypatch.setattr(ops, "_empty_like", lambda x: real_like(x).fill_(float("nan")))
    monkeypatch.setattr(backward, "_new_output",
                        lambda shape, dtype, device: real_new(shape, dtype, device).fill_(float("nan")))


@pytest.mark.parametrize("fn, row", _params(on_gpu=True))
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_bad_or_odd_input_on_the_gpu(fn, row, poisoned_outputs):
    runner = RUNNERS[fn]
    t = row.mutate(runner.inputs("cuda"), "cuda")
    if row.exc is not ACCEPTED:
        _expect_error(fn, row, t, on_gpu=True)
        return
    result = runner.call(t, True)
    torch.cuda.synchronize()
    runner.check(t, result)


# ---- property-based: random valid calls against the float64 reference (GPU) ----------

try:
    from hypothesis import HealthCheck, given, settings, strategies as st
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    st = None

if st is not None:
    DTYPE_PAIRS = [(torch.float32, torch.float32), (torch.float16, torch.float16), (torch.float16, torch.float32),
                   (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)]

    @st.composite
    def calls(draw):
        xd, wd = draw(st.sampled_from(DTYPE_PAIRS))
        return dict(layout=draw(st.sampled_from(["cf", "cl"])), xd=xd, wd=wd, width=draw(st.integers(2, 8)),
                    batch=draw(st.integers(1, 3)), dim=draw(st.integers(1, 80)), seqlen=draw(st.integers(1, 300)),
                    offset=draw(st.integers(0, 3)), pad=draw(st.integers(0, 5)),
                    bias=draw(st.booleans()), silu=draw(st.booleans()), seq_idx=draw(st.booleans()),
                    states=draw(st.booleans()), final=draw(st.booleans()), backward=draw(st.booleans()),
                    seed=draw(st.integers(0, 2**31 - 1)))

    def _place(t, layout: str, offset: int, pad: int):
        """t (b, d, l) in a bigger buffer: the contiguous dim padded by `pad`, the start
        moved by `offset` elements (odd offsets and strides the kernels must cope with)."""
        b, d, l = t.shape
        if layout == "cf":
            flat = torch.empty(offset + b * d * (l + pad), dtype=t.dtype, device="cuda")
            view = flat[offset:].view(b, d, l + pad)[:, :, :l]
        else:
            flat = torch.empty(offset + b * l * (d + pad), dtype=t.dtype, device="cuda")
            view = flat[offset:].view(b, l, d + pad)[:, :, :d].transpose(1, 2)
        view.copy_(t)
        return view

    @pytest.mark.gpu
    @pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(c=calls())
    def test_random_valid_calls_match_the_reference(c):
        g = torch.Generator().manual_seed(c["seed"])
        b, d, l, w = c["batch"], c["dim"], c["seqlen"], c["width"]
        pad = c["pad"]
        if c["layout"] == "cl" and d == 1 and pad == 0:
            pad = 1  # a channel-last (b, l, 1) tensor with row stride 1 is channel-first by its strides
        x = _place(torch.randn(b, d, l, generator=g).to(c["xd"]).cuda(), c["layout"], c["offset"], pad)
        t = dict(x=x, weight=(torch.randn(d, w, generator=g) / w ** 0.5).to(c["wd"]).cuda(),
                 bias=torch.randn(d, generator=g).to(c["wd"]).cuda() if c["bias"] else None,
                 activation="silu" if c["silu"] else None)
        if c["seq_idx"]:
            starts = (torch.rand(b, l, generator=g) < 0.05).to(torch.int32)
            ids = torch.cumsum(starts, dim=1).to(torch.int32)
            t["seq_idx"] = torch.where(torch.rand(b, l, generator=g) < 0.1, -1, ids).to(torch.int32).cuda()
        if c["states"]:
            t["initial_states"] = torch.randn(b, d, w - 1, generator=g).to(c["xd"]).cuda()
        want, want_fs = cc1d.causal_conv1d_ref(
            _double(x), _double(t["weight"]), _double(t["bias"]), initial_states=_double(t.get("initial_states")),
            return_final_states=True, activation=t["activation"], seq_idx=t.get("seq_idx"))
        if c["final"]:
            out, fs = cc1d.causal_conv1d_fn(**t, return_final_states=True)
            torch.cuda.synchronize()
            check_close(f"final_states {c}", fs, want_fs, c["xd"])
        else:
            out = cc1d.causal_conv1d_fn(**t)
        torch.cuda.synchronize()
        check_close(f"out {c}", out, want, c["xd"])
        if c["backward"]:
            t["dout"] = _place(torch.randn(b, d, l, generator=g).to(c["xd"]).cuda(), c["layout"], 1 - c["offset"] % 2,
                               pad)
            dx, dweight, dbias, _ = cc1d.causal_conv1d_bwd(**t)
            torch.cuda.synchronize()
            ref = bwd_reference(t)
            check_close(f"dx {c}", dx, ref[0], c["xd"])
            check_close(f"dweight {c}", dweight, ref[1], c["xd"])
            if c["bias"]:
                check_close(f"dbias {c}", dbias, ref[2], c["xd"])
