"""Bad input through the PyTorch API, as data (issue 8, item 1).

Tables of cases per public function (the forward, the backward, the decode update,
the varlen prefill and its states helper): a mutation of valid arguments, and
either the exception (type, and the argument the message must name) or ACCEPTED
(the peer takes it: the result must match the float64 reference, and states the
reference's bit for bit). Rows marked cpu run wherever torch is, without a GPU:
the forward, the update and the varlen prefill through their explain functions
with an arch (the same checks as the calls, the runtime's included), the backward
and varlen_states through their validators with the device requirement off; there
an error row must raise, and an accepted row must pass the checks.
Every row also runs on a GPU through the public function itself (marker gpu), with
every buffer the API allocates poisoned. Hypothesis property tests draw valid
shapes, strides, dtypes and features of each op and check them on the GPU.

Adding an op: a builder of valid arguments, a table of rows, a runner in RUNNERS.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Optional

import pytest

torch = pytest.importorskip("torch")

import cc1d  # noqa: E402
from cc1d import backward, update, varlen  # noqa: E402
from cc1d.reference import causal_conv1d_varlen_ref, causal_conv1d_varlen_states_ref  # noqa: E402

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
    """x's values in a view where no stride is 1 (the last one is 2)."""
    big = torch.empty(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype, device=x.device)
    view = big[..., ::2]
    view.copy_(x)
    return view


def _seq_idx(t, dev, dtype=torch.int32, shape=None):
    g = torch.Generator().manual_seed(5)
    s = torch.randint(-1, 3, shape or (B, L), generator=g).sort(dim=-1).values
    return s.to(dtype).to(dev)


# weight and bias rows every op taking (x, weight, bias) shares: the same arguments, the same checks.
WEIGHT_BIAS_ROWS = [
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
]

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
    *WEIGHT_BIAS_ROWS,
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


# ---- decode update (cc1d.update) -----------------------------------------------------

UB, UL, UM, UPOOL = 3, 2, 5, 6  # batch, seqlen, state_len, pool (rows past the batch stay as they were)


def upd_inputs(device: str, seed: int = 0, dtype=torch.bfloat16) -> dict:
    """conv_state as vLLM allocates it: (pool, state_len, dim) memory viewed as (pool, dim, state_len)."""
    g = torch.Generator().manual_seed(seed)
    return dict(x=torch.randn(UB, D, UL, generator=g).to(dtype).to(device),
                conv_state=torch.randn(UPOOL, UM, D, generator=g).to(dtype).to(device).transpose(1, 2),
                weight=(torch.randn(D, W, generator=g) / 2).to(device),
                bias=torch.randn(D, generator=g).to(device), activation="silu")


def _i32(values, dev, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype, device=dev)


def _strided_i32(values, dev):
    """values in an int32 tensor of stride 2."""
    return torch.tensor([v for v in values for _ in (0, 1)], dtype=torch.int32, device=dev)[::2]


def _cast(t: dict, dtype) -> dict:
    """x, conv_state in dtype; weight and bias too unless float32."""
    out = _rt(t, x=t["x"].to(dtype), conv_state=t["conv_state"].to(dtype))
    if dtype is not torch.float32:
        out = _rt(out, weight=t["weight"].to(dtype), bias=t["bias"].to(dtype))
    return out


def _upd_narrow_dim(t: dict, n: int) -> dict:
    return _rt(t, x=t["x"][:, :n], conv_state=t["conv_state"][:, :n], weight=t["weight"][:n], bias=t["bias"][:n])


UPD_ROWS = [
    Row("x-not-a-tensor", "x", lambda t, d: _rt(t, x=t["x"].tolist()), TypeError, "torch.Tensor"),
    Row("x-rank-1", "x", lambda t, d: _rt(t, x=t["x"][0, :, 0]), ValueError, "2-D"),
    Row("x-rank-4", "x", lambda t, d: _rt(t, x=t["x"][None]), ValueError, "3-D"),
    Row("x-float64", "x", lambda t, d: _cast(t, torch.float64), TypeError, "dtype"),
    Row("x-int32", "x", lambda t, d: _rt(t, x=t["x"].int()), TypeError, "dtype"),
    Row("x-zero-batch", "x", lambda t, d: _rt(t, x=t["x"][:0]), ValueError, ">= 1"),
    Row("x-zero-seqlen", "x", lambda t, d: _rt(t, x=t["x"][:, :, :0]), ValueError, ">= 1"),
    Row("x-zero-dim", "x", lambda t, d: _upd_narrow_dim(t, 0), ValueError, ">= 1"),
    *WEIGHT_BIAS_ROWS,
    Row("bias-not-a-tensor", "bias", lambda t, d: _rt(t, bias=t["bias"].tolist()), TypeError, "torch.Tensor"),
    Row("conv_state-not-a-tensor", "conv_state", lambda t, d: _rt(t, conv_state=None), TypeError, "torch.Tensor"),
    Row("conv_state-rank-2", "conv_state", lambda t, d: _rt(t, conv_state=t["conv_state"][0]), ValueError, "3-D"),
    Row("conv_state-dim-mismatch", "conv_state", lambda t, d: _rt(t, conv_state=t["conv_state"][:, :10]),
        ValueError, f"dim={D}"),
    Row("conv_state-shorter-than-width-1", "conv_state",
        lambda t, d: _rt(t, conv_state=t["conv_state"][:, :, :W - 2]), ValueError, "width-1"),
    Row("conv_state-fewer-rows-than-batch", "conv_state", lambda t, d: _rt(t, conv_state=t["conv_state"][:UB - 1]),
        ValueError, f"batch={UB}"),
    Row("conv_state-no-rows-with-indices", "conv_state",
        lambda t, d: _rt(t, conv_state=t["conv_state"][:0], conv_state_indices=_i32([-1] * UB, d)),
        ValueError, "pool >= 1"),
    Row("conv_state-f32-for-bf16-x", "conv_state", lambda t, d: _rt(t, conv_state=t["conv_state"].float()),
        TypeError, "dtype"),
    Row("conv_state-overlaps-x", "conv_state", lambda t, d: _rt(t, x=t["conv_state"][:UB, :, :UL]),
        ValueError, "overlap"),
    Row("cache_seqlens-not-a-tensor", "cache_seqlens", lambda t, d: _rt(t, cache_seqlens=[0] * UB),
        TypeError, "torch.Tensor"),
    Row("cache_seqlens-int64", "cache_seqlens", lambda t, d: _rt(t, cache_seqlens=_i32([0, 1, 2], d, torch.int64)),
        TypeError, "int32"),
    Row("cache_seqlens-float", "cache_seqlens",
        lambda t, d: _rt(t, cache_seqlens=_i32([0, 1, 2], d, torch.float32)), TypeError, "int32"),
    Row("cache_seqlens-shape", "cache_seqlens", lambda t, d: _rt(t, cache_seqlens=_i32([0] * (UB + 1), d)),
        ValueError, "shape"),
    Row("cache_seqlens-rank-2", "cache_seqlens", lambda t, d: _rt(t, cache_seqlens=_i32([[0]] * UB, d)),
        ValueError, "1-D"),
    Row("conv_state_indices-int64", "conv_state_indices",
        lambda t, d: _rt(t, conv_state_indices=_i32([0, 1, 2], d, torch.int64)), TypeError, "int32"),
    Row("conv_state_indices-shape", "conv_state_indices",
        lambda t, d: _rt(t, conv_state_indices=_i32([0, 1], d)), ValueError, "shape"),
    Row("conv_state_indices-rank-0", "conv_state_indices",
        lambda t, d: _rt(t, conv_state_indices=_i32(0, d)), ValueError, "1-D"),
    Row("num_accepted_tokens-int64", "num_accepted_tokens",
        lambda t, d: _rt(t, num_accepted_tokens=_i32([1] * UB, d, torch.int64)), TypeError, "int32"),
    Row("num_accepted_tokens-shape", "num_accepted_tokens",
        lambda t, d: _rt(t, num_accepted_tokens=_i32([1] * (UB - 1), d)), ValueError, "shape"),
    Row("num_accepted_tokens-with-cache_seqlens", "num_accepted_tokens",
        lambda t, d: _rt(t, cache_seqlens=_i32([0] * UB, d), num_accepted_tokens=_i32([1] * UB, d)),
        ValueError, "cache_seqlens"),
    Row("pad_slot_id-float", "pad_slot_id", lambda t, d: _rt(t, pad_slot_id=-1.0), TypeError, "int"),
    Row("pad_slot_id-bool", "pad_slot_id", lambda t, d: _rt(t, pad_slot_id=True), TypeError, "int"),
    Row("activation-relu", "activation", lambda t, d: _rt(t, activation="relu"), ValueError, "silu"),
    Row("activation-not-a-string", "activation", lambda t, d: _rt(t, activation=1), ValueError, "silu"),
    # need CUDA tensors (device checks) or a launch
    Row("x-on-cpu", "x", lambda t, d: _rt(t, x=t["x"].cpu()), ValueError, "CUDA", cpu=False),
    Row("weight-on-cpu", "weight", lambda t, d: _rt(t, weight=t["weight"].cpu()), ValueError, "device", cpu=False),
    Row("bias-on-cpu", "bias", lambda t, d: _rt(t, bias=t["bias"].cpu()), ValueError, "device", cpu=False),
    Row("conv_state-on-cpu", "conv_state", lambda t, d: _rt(t, conv_state=t["conv_state"].cpu()), ValueError,
        "device", cpu=False),
    Row("cache_seqlens-on-cpu", "cache_seqlens", lambda t, d: _rt(t, cache_seqlens=_i32([0] * UB, "cpu")),
        ValueError, "device", cpu=False),
    Row("conv_state_indices-on-cpu", "conv_state_indices",
        lambda t, d: _rt(t, conv_state_indices=_i32([0, 1, 2], "cpu")), ValueError, "device", cpu=False),
    Row("num_accepted_tokens-on-cpu", "num_accepted_tokens",
        lambda t, d: _rt(t, num_accepted_tokens=_i32([1] * UB, "cpu")), ValueError, "device", cpu=False),
    # the peer (or vLLM) accepts these: outputs against float64, the state bit for bit
    Row("state-dim-contiguous", "conv_state", lambda t, d: t, ACCEPTED),
    Row("state-state_len-contiguous", "conv_state", lambda t, d: _rt(t, conv_state=t["conv_state"].contiguous()),
        ACCEPTED),
    Row("state-dim-contiguous-odd-offset", "conv_state",
        lambda t, d: _rt(t, conv_state=_odd_slice(t["conv_state"].transpose(1, 2)).transpose(1, 2)), ACCEPTED),
    Row("state-state_len-contiguous-odd-offset", "conv_state",
        lambda t, d: _rt(t, conv_state=_odd_slice(t["conv_state"].contiguous())), ACCEPTED),
    Row("state-no-unit-stride", "conv_state", lambda t, d: _rt(t, conv_state=_no_unit_stride(t["conv_state"])),
        ACCEPTED),
    Row("state-width-1-long", "conv_state", lambda t, d: _rt(t, conv_state=t["conv_state"][:, :, UM - (W - 1):]),
        ACCEPTED),
    Row("x-2d", "x", lambda t, d: _rt(t, x=t["x"][:, :, 0].contiguous()), ACCEPTED),
    Row("x-2d-strided", "x", lambda t, d: _rt(t, x=t["x"][:, :, 1]), ACCEPTED),
    Row("x-odd-element-offset", "x", lambda t, d: _rt(t, x=_odd_slice(t["x"])), ACCEPTED),
    Row("x-dim-contiguous", "x", lambda t, d: _rt(t, x=t["x"].transpose(1, 2).contiguous().transpose(1, 2)),
        ACCEPTED),
    Row("x-dim-contiguous-odd-offset", "x",
        lambda t, d: _rt(t, x=_odd_slice(t["x"].transpose(1, 2).contiguous()).transpose(1, 2)), ACCEPTED),
    Row("x-no-unit-stride", "x", lambda t, d: _rt(t, x=_no_unit_stride(t["x"])), ACCEPTED),
    Row("x-broadcast-over-batch", "x", lambda t, d: _rt(t, x=t["x"][:1].expand(UB, D, UL)), ACCEPTED),
    Row("x-longer-than-the-state", "x", lambda t, d: _rt(t, x=torch.randn(UB, D, 2 * UM + 1, device=d).bfloat16()),
        ACCEPTED),
    Row("dim-not-a-multiple-of-a-vector", "x", lambda t, d: _upd_narrow_dim(t, 13), ACCEPTED),
    Row("weight-transposed", "weight", lambda t, d: _rt(t, weight=t["weight"].t().contiguous().t()), ACCEPTED),
    Row("weight-odd-offset", "weight", lambda t, d: _rt(t, weight=_odd_slice(t["weight"])), ACCEPTED),
    Row("bias-strided", "bias", lambda t, d: _rt(t, bias=torch.stack([t["bias"], t["bias"]], 1)[:, 0]), ACCEPTED),
    Row("bias-none", "bias", lambda t, d: _rt(t, bias=None), ACCEPTED),
    Row("weight-bias-bf16", "weight", lambda t, d: _cast(t, torch.bfloat16), ACCEPTED),
    Row("x-f32", "x", lambda t, d: _cast(t, torch.float32), ACCEPTED),
    Row("x-f16-weight-f32", "x", lambda t, d: _rt(t, x=t["x"].half(), conv_state=t["conv_state"].half()), ACCEPTED),
    Row("x-f16", "x", lambda t, d: _cast(t, torch.float16), ACCEPTED),
    Row("activation-none", "activation", lambda t, d: _rt(t, activation=None), ACCEPTED),
    Row("activation-true", "activation", lambda t, d: _rt(t, activation=True), ACCEPTED),
    Row("activation-false", "activation", lambda t, d: _rt(t, activation=False), ACCEPTED),
    Row("activation-swish", "activation", lambda t, d: _rt(t, activation="swish"), ACCEPTED),
    Row("cache_seqlens", "cache_seqlens", lambda t, d: _rt(t, cache_seqlens=_i32([0, 4, 13], d)), ACCEPTED),
    Row("cache_seqlens-negative-and-huge", "cache_seqlens",
        lambda t, d: _rt(t, cache_seqlens=_i32([-1, -13, 2**31 - 1], d)), ACCEPTED),
    Row("cache_seqlens-strided", "cache_seqlens", lambda t, d: _rt(t, cache_seqlens=_strided_i32([3, 1, 7], d)),
        ACCEPTED),
    Row("cache_seqlens-longer-x", "cache_seqlens",
        lambda t, d: _rt(t, x=torch.randn(UB, D, UM + 2, device=d).bfloat16(), cache_seqlens=_i32([2, 0, 9], d)),
        ACCEPTED),
    Row("conv_state_indices", "conv_state_indices", lambda t, d: _rt(t, conv_state_indices=_i32([4, 0, 2], d)),
        ACCEPTED),
    Row("conv_state_indices-pad_slot_id", "conv_state_indices",
        lambda t, d: _rt(t, conv_state_indices=_i32([-1, 3, -1], d)), ACCEPTED),
    Row("conv_state_indices-negative-and-past-the-pool", "conv_state_indices",
        lambda t, d: _rt(t, conv_state_indices=_i32([-5, UPOOL, 1], d)), ACCEPTED),
    Row("conv_state_indices-custom-pad_slot_id", "conv_state_indices",
        lambda t, d: _rt(t, conv_state_indices=_i32([2, 0, 1], d), pad_slot_id=2), ACCEPTED),
    Row("conv_state_indices-repeated-slot", "conv_state_indices",
        lambda t, d: _rt(t, conv_state_indices=_i32([1, 1, 4], d)), ACCEPTED),
    Row("conv_state_indices-strided", "conv_state_indices",
        lambda t, d: _rt(t, conv_state_indices=_strided_i32([5, 2, 0], d)), ACCEPTED),
    Row("conv_state_indices-pool-smaller-than-batch", "conv_state_indices",
        lambda t, d: _rt(t, conv_state=t["conv_state"][:2], conv_state_indices=_i32([1, -1, 0], d)), ACCEPTED),
    Row("conv_state_indices-with-cache_seqlens", "conv_state_indices",
        lambda t, d: _rt(t, conv_state_indices=_i32([3, -1, 0], d), cache_seqlens=_i32([6, 2, -3], d)), ACCEPTED),
    Row("num_accepted_tokens", "num_accepted_tokens", lambda t, d: _rt(t, num_accepted_tokens=_i32([1, 2, 1], d)),
        ACCEPTED),
    Row("num_accepted_tokens-out-of-range", "num_accepted_tokens",
        lambda t, d: _rt(t, num_accepted_tokens=_i32([0, -3, 2**31 - 1], d)), ACCEPTED),
    Row("num_accepted_tokens-with-indices", "num_accepted_tokens",
        lambda t, d: _rt(t, conv_state_indices=_i32([5, -1, 2], d), num_accepted_tokens=_i32([2, 1, 1], d)),
        ACCEPTED),
    Row("tiny-1x1", "x", lambda t, d: _rt(_upd_narrow_dim(t, 1), x=t["x"][:1, :1, 0],
                                          conv_state=t["conv_state"][:1, :1, :W - 1]), ACCEPTED),
]

# ---- varlen prefill (cc1d.varlen) ----------------------------------------------------

# An empty sequence and one shorter than width-1 among them; the pool is in shuffled order.
VLENS, VM, VPOOL = (5, 0, 37, 1, 21), 5, 8
VN, VT = len(VLENS), sum(VLENS)
VCU = [0, *itertools.accumulate(VLENS)]
VROWS = [6, 2, 0, 5, 3, 7, 1, 4]  # pool rows of the sequences in turn: no two share one


def varlen_inputs(device: str, seed: int = 0, dtype=torch.bfloat16) -> dict:
    """x (dim, total_tokens) tokens contiguous; the pool as vLLM allocates it ((pool, state_len, dim)
    memory viewed as (pool, dim, state_len))."""
    g = torch.Generator().manual_seed(seed)
    return dict(x=torch.randn(D, VT, generator=g).to(dtype).to(device),
                weight=(torch.randn(D, W, generator=g) / 2).to(device),
                bias=torch.randn(D, generator=g).to(device), cu_seqlens=_i32(VCU, device),
                conv_states=torch.randn(VPOOL, VM, D, generator=g).to(dtype).to(device).transpose(1, 2),
                cache_indices=_i32(VROWS[:VN], device),
                has_initial_state=torch.tensor([True, False, True, True, False], device=device),
                activation="silu")


def _vcast(t: dict, dtype) -> dict:
    """x, conv_states in dtype; weight and bias too unless float32."""
    out = _rt(t, x=t["x"].to(dtype), conv_states=t["conv_states"].to(dtype))
    if dtype is not torch.float32:
        out = _rt(out, weight=t["weight"].to(dtype), bias=t["bias"].to(dtype))
    return out


def _vl_narrow_dim(t: dict, n: int) -> dict:
    return _rt(t, x=t["x"][:n], conv_states=t["conv_states"][:, :n], weight=t["weight"][:n], bias=t["bias"][:n])


def _vl_lens(t: dict, d: str, lens) -> dict:
    """The same tokens cut into other sequences (at most VPOOL), each with its own pool row."""
    n = len(lens)
    return _rt(t, cu_seqlens=_i32([0, *itertools.accumulate(lens)], d), cache_indices=_i32(VROWS[:n], d),
               has_initial_state=torch.tensor([i % 2 == 0 for i in range(n)], device=d))


def _checked(t: dict, **kw) -> dict:
    return _rt(t, validate_data=True, **kw)


VARLEN_ROWS = [
    Row("x-not-a-tensor", "x", lambda t, d: _rt(t, x=t["x"].tolist()), TypeError, "torch.Tensor"),
    Row("x-rank-1", "x", lambda t, d: _rt(t, x=t["x"][0]), ValueError, "2-D"),
    Row("x-rank-3", "x", lambda t, d: _rt(t, x=t["x"][None]), ValueError, "2-D"),
    Row("x-float64", "x", lambda t, d: _vcast(t, torch.float64), TypeError, "dtype"),
    Row("x-int32", "x", lambda t, d: _rt(t, x=t["x"].int()), TypeError, "dtype"),
    Row("x-zero-tokens", "x", lambda t, d: _rt(t, x=t["x"][:, :0], cu_seqlens=_i32([0] * (VN + 1), d)),
        ValueError, ">= 1"),
    Row("x-zero-dim", "x", lambda t, d: _vl_narrow_dim(t, 0), ValueError, ">= 1"),
    *WEIGHT_BIAS_ROWS,
    Row("cu_seqlens-not-a-tensor", "cu_seqlens", lambda t, d: _rt(t, cu_seqlens=VCU), TypeError, "torch.Tensor"),
    Row("cu_seqlens-int64", "cu_seqlens", lambda t, d: _rt(t, cu_seqlens=_i32(VCU, d, torch.int64)),
        TypeError, "int32"),
    Row("cu_seqlens-float", "cu_seqlens", lambda t, d: _rt(t, cu_seqlens=_i32(VCU, d, torch.float32)),
        TypeError, "int32"),
    Row("cu_seqlens-rank-2", "cu_seqlens", lambda t, d: _rt(t, cu_seqlens=t["cu_seqlens"][None]), ValueError, "1-D"),
    Row("cu_seqlens-one-value", "cu_seqlens", lambda t, d: _rt(t, cu_seqlens=t["cu_seqlens"][:1]),
        ValueError, "num_seqs >= 1"),
    # cu_seqlens' values are on the device: checked with validate_data=True (one synchronisation)
    Row("cu_seqlens-not-starting-at-0", "cu_seqlens", lambda t, d: _checked(t, cu_seqlens=_i32([2, *VCU[1:]], d)),
        ValueError, "first value 0"),
    Row("cu_seqlens-decreasing", "cu_seqlens",
        lambda t, d: _checked(t, cu_seqlens=_i32([0, 5, 3, 42, 43, VT], d)), ValueError, "non-decreasing"),
    Row("cu_seqlens-ending-short-of-the-tokens", "cu_seqlens",
        lambda t, d: _checked(t, cu_seqlens=_i32([*VCU[:-1], VT - 1], d)), ValueError, f"total_tokens={VT}"),
    Row("cu_seqlens-ending-past-the-tokens", "cu_seqlens",
        lambda t, d: _checked(t, cu_seqlens=_i32([*VCU[:-1], VT + 5], d)), ValueError, f"total_tokens={VT}"),
    Row("max_seqlen-below-the-longest", "max_seqlen", lambda t, d: _checked(t, max_seqlen=max(VLENS) - 1),
        ValueError, f"longest sequence ({max(VLENS)})"),
    Row("max_seqlen-zero", "max_seqlen", lambda t, d: _rt(t, max_seqlen=0), ValueError, "int >= 1"),
    Row("max_seqlen-float", "max_seqlen", lambda t, d: _rt(t, max_seqlen=37.0), ValueError, "int >= 1"),
    Row("max_seqlen-bool", "max_seqlen", lambda t, d: _rt(t, max_seqlen=True), ValueError, "int >= 1"),
    Row("conv_states-not-a-tensor", "conv_states", lambda t, d: _rt(t, conv_states=[]), TypeError, "torch.Tensor"),
    Row("conv_states-rank-2", "conv_states", lambda t, d: _rt(t, conv_states=t["conv_states"][0]),
        ValueError, "3-D"),
    Row("conv_states-dim-mismatch", "conv_states", lambda t, d: _rt(t, conv_states=t["conv_states"][:, :10]),
        ValueError, f"dim={D}"),
    Row("conv_states-shorter-than-width-1", "conv_states",
        lambda t, d: _rt(t, conv_states=t["conv_states"][:, :, :W - 2]), ValueError, "width-1"),
    Row("conv_states-no-rows", "conv_states", lambda t, d: _rt(t, conv_states=t["conv_states"][:0]),
        ValueError, "pool >= 1"),
    Row("conv_states-fewer-rows-than-sequences", "conv_states",
        lambda t, d: _rt(t, conv_states=t["conv_states"][:VN - 1], cache_indices=None), ValueError,
        f"num_seqs={VN}"),
    Row("conv_states-f32-for-bf16-x", "conv_states", lambda t, d: _rt(t, conv_states=t["conv_states"].float()),
        TypeError, "dtype"),
    Row("conv_states-overlaps-x", "conv_states",
        lambda t, d: _rt(t, conv_states=t["x"].reshape(-1)[:VPOOL * VM * D].view(VPOOL, VM, D).transpose(1, 2)),
        ValueError, "overlap"),
    Row("cache_indices-without-conv_states", "cache_indices",
        lambda t, d: _rt(t, conv_states=None), ValueError, "conv_states is None"),
    Row("has_initial_state-without-conv_states", "has_initial_state",
        lambda t, d: _rt(t, conv_states=None, cache_indices=None), ValueError, "conv_states is None"),
    Row("cache_indices-int64", "cache_indices", lambda t, d: _rt(t, cache_indices=t["cache_indices"].long()),
        TypeError, "int32"),
    Row("cache_indices-shape", "cache_indices", lambda t, d: _rt(t, cache_indices=t["cache_indices"][:-1]),
        ValueError, "shape"),
    Row("cache_indices-rank-2", "cache_indices", lambda t, d: _rt(t, cache_indices=t["cache_indices"][None]),
        ValueError, "1-D"),
    Row("cache_indices-past-the-pool", "cache_indices",
        lambda t, d: _checked(t, cache_indices=_i32([6, 2, VPOOL, 5, 3], d)), ValueError, f"pool={VPOOL}"),
    Row("has_initial_state-float", "has_initial_state",
        lambda t, d: _rt(t, has_initial_state=t["has_initial_state"].float()), TypeError, "bool"),
    Row("has_initial_state-int64", "has_initial_state",
        lambda t, d: _rt(t, has_initial_state=t["has_initial_state"].long()), TypeError, "bool"),
    Row("has_initial_state-shape", "has_initial_state",
        lambda t, d: _rt(t, has_initial_state=t["has_initial_state"][:2]), ValueError, "shape"),
    Row("pad_slot_id-float", "pad_slot_id", lambda t, d: _rt(t, pad_slot_id=-1.0), TypeError, "int"),
    Row("activation-relu", "activation", lambda t, d: _rt(t, activation="relu"), ValueError, "silu"),
    # need CUDA tensors (device checks) or a launch
    Row("x-on-cpu", "x", lambda t, d: _rt(t, x=t["x"].cpu()), ValueError, "CUDA", cpu=False),
    Row("weight-on-cpu", "weight", lambda t, d: _rt(t, weight=t["weight"].cpu()), ValueError, "device", cpu=False),
    Row("bias-on-cpu", "bias", lambda t, d: _rt(t, bias=t["bias"].cpu()), ValueError, "device", cpu=False),
    Row("cu_seqlens-on-cpu", "cu_seqlens", lambda t, d: _rt(t, cu_seqlens=t["cu_seqlens"].cpu()), ValueError,
        "device", cpu=False),
    Row("conv_states-on-cpu", "conv_states", lambda t, d: _rt(t, conv_states=t["conv_states"].cpu()), ValueError,
        "device", cpu=False),
    Row("cache_indices-on-cpu", "cache_indices", lambda t, d: _rt(t, cache_indices=t["cache_indices"].cpu()),
        ValueError, "device", cpu=False),
    Row("has_initial_state-on-cpu", "has_initial_state",
        lambda t, d: _rt(t, has_initial_state=t["has_initial_state"].cpu()), ValueError, "device", cpu=False),
    # vLLM accepts these: outputs against float64, the pool bit for bit
    Row("x-tokens-contiguous", "x", lambda t, d: t, ACCEPTED),
    Row("x-channels-contiguous", "x", lambda t, d: _rt(t, x=t["x"].t().contiguous().t()), ACCEPTED),
    Row("x-odd-element-offset", "x", lambda t, d: _rt(t, x=_odd_slice(t["x"])), ACCEPTED),
    Row("x-channels-contiguous-odd-offset", "x", lambda t, d: _rt(t, x=_odd_slice(t["x"].t().contiguous()).t()),
        ACCEPTED),
    Row("x-odd-row-stride", "x",
        lambda t, d: _rt(t, x=torch.cat([t["x"], t["x"][:, :1]], 1)[:, :VT]), ACCEPTED),
    Row("x-no-unit-stride", "x", lambda t, d: _rt(t, x=_no_unit_stride(t["x"])), ACCEPTED),
    Row("dim-not-a-multiple-of-a-vector", "x", lambda t, d: _vl_narrow_dim(t, 13), ACCEPTED),
    Row("pool-state_len-contiguous", "conv_states", lambda t, d: _rt(t, conv_states=t["conv_states"].contiguous()),
        ACCEPTED),
    Row("pool-dim-contiguous-odd-offset", "conv_states",
        lambda t, d: _rt(t, conv_states=_odd_slice(t["conv_states"].transpose(1, 2)).transpose(1, 2)), ACCEPTED),
    Row("pool-state_len-contiguous-odd-offset", "conv_states",
        lambda t, d: _rt(t, conv_states=_odd_slice(t["conv_states"].contiguous())), ACCEPTED),
    Row("pool-no-unit-stride", "conv_states", lambda t, d: _rt(t, conv_states=_no_unit_stride(t["conv_states"])),
        ACCEPTED),
    Row("pool-width-1-long", "conv_states",
        lambda t, d: _rt(t, conv_states=t["conv_states"][:, :, VM - (W - 1):]), ACCEPTED),
    Row("no-pool", "conv_states", lambda t, d: _rt(t, conv_states=None, cache_indices=None, has_initial_state=None),
        ACCEPTED),
    Row("cache_indices-none", "cache_indices", lambda t, d: _rt(t, cache_indices=None), ACCEPTED),
    Row("cache_indices-pad_slot_id", "cache_indices", lambda t, d: _rt(t, cache_indices=_i32([6, -1, 0, 5, -1], d)),
        ACCEPTED),
    Row("cache_indices-negative-and-past-the-pool", "cache_indices",
        lambda t, d: _rt(t, cache_indices=_i32([-7, 2, VPOOL, 5, 100], d)), ACCEPTED),
    Row("cache_indices-custom-pad_slot_id", "cache_indices", lambda t, d: _rt(t, pad_slot_id=0), ACCEPTED),
    Row("cache_indices-strided", "cache_indices", lambda t, d: _rt(t, cache_indices=_strided_i32([7, 1, 4, 0, 2], d)),
        ACCEPTED),
    Row("has_initial_state-none", "has_initial_state", lambda t, d: _rt(t, has_initial_state=None), ACCEPTED),
    *[Row(f"has_initial_state-{str(dt).replace('torch.', '')}", "has_initial_state",
          lambda t, d, dt=dt: _rt(t, has_initial_state=t["has_initial_state"].to(dt)), ACCEPTED)
      for dt in (torch.uint8, torch.int8, torch.int32)],
    Row("has_initial_state-strided", "has_initial_state",
        lambda t, d: _rt(t, has_initial_state=torch.stack([t["has_initial_state"]] * 2, 1)[:, 1]), ACCEPTED),
    Row("cu_seqlens-strided", "cu_seqlens", lambda t, d: _rt(t, cu_seqlens=_strided_i32(VCU, d)), ACCEPTED),
    Row("one-sequence", "cu_seqlens", lambda t, d: _vl_lens(t, d, [VT]), ACCEPTED),
    Row("empty-sequences-around-one", "cu_seqlens", lambda t, d: _vl_lens(t, d, [0, 0, VT, 0]), ACCEPTED),
    Row("one-token-sequences", "cu_seqlens", lambda t, d: _vl_lens(t, d, [1] * 7 + [VT - 7]), ACCEPTED),
    Row("max_seqlen-the-longest", "max_seqlen", lambda t, d: _rt(t, max_seqlen=max(VLENS)), ACCEPTED),
    Row("max_seqlen-past-the-tokens", "max_seqlen", lambda t, d: _rt(t, max_seqlen=10**6), ACCEPTED),
    Row("validate_data-valid", "cu_seqlens", lambda t, d: _checked(t, max_seqlen=max(VLENS)), ACCEPTED),
    Row("validate_data-padded-rows", "cache_indices",
        lambda t, d: _checked(t, cache_indices=_i32([-1, 2, -9, 5, 3], d)), ACCEPTED),
    Row("weight-transposed", "weight", lambda t, d: _rt(t, weight=t["weight"].t().contiguous().t()), ACCEPTED),
    Row("weight-odd-offset", "weight", lambda t, d: _rt(t, weight=_odd_slice(t["weight"])), ACCEPTED),
    Row("bias-strided", "bias", lambda t, d: _rt(t, bias=torch.stack([t["bias"], t["bias"]], 1)[:, 0]), ACCEPTED),
    Row("bias-none", "bias", lambda t, d: _rt(t, bias=None), ACCEPTED),
    Row("weight-bias-bf16", "weight", lambda t, d: _vcast(t, torch.bfloat16), ACCEPTED),
    Row("x-f32", "x", lambda t, d: _vcast(t, torch.float32), ACCEPTED),
    Row("x-f16", "x", lambda t, d: _vcast(t, torch.float16), ACCEPTED),
    Row("x-f16-weight-f32", "x", lambda t, d: _rt(t, x=t["x"].half(), conv_states=t["conv_states"].half()),
        ACCEPTED),
    Row("activation-none", "activation", lambda t, d: _rt(t, activation=None), ACCEPTED),
    Row("tiny-1x1", "x", lambda t, d: _rt(_vl_narrow_dim(_vl_lens(t, d, [1]), 1), x=t["x"][:1, :1]), ACCEPTED),
]


def states_inputs(device: str, seed: int = 0, dtype=torch.bfloat16) -> dict:
    """causal_conv1d_varlen_states' x is (total_tokens, dim), channels contiguous."""
    g = torch.Generator().manual_seed(seed)
    return dict(x=torch.randn(VT, D, generator=g).to(dtype).to(device), cu_seqlens=_i32(VCU, device),
                state_len=VM)


STATES_ROWS = [
    Row("x-not-a-tensor", "x", lambda t, d: _rt(t, x=t["x"].tolist()), TypeError, "torch.Tensor"),
    Row("x-rank-1", "x", lambda t, d: _rt(t, x=t["x"][:, 0]), ValueError, "2-D"),
    Row("x-rank-3", "x", lambda t, d: _rt(t, x=t["x"][None]), ValueError, "2-D"),
    Row("x-float64", "x", lambda t, d: _rt(t, x=t["x"].double()), TypeError, "dtype"),
    Row("x-int32", "x", lambda t, d: _rt(t, x=t["x"].int()), TypeError, "dtype"),
    Row("x-zero-tokens", "x", lambda t, d: _rt(t, x=t["x"][:0], cu_seqlens=_i32([0] * (VN + 1), d)),
        ValueError, ">= 1"),
    Row("x-zero-dim", "x", lambda t, d: _rt(t, x=t["x"][:, :0]), ValueError, ">= 1"),
    Row("state_len-negative", "state_len", lambda t, d: _rt(t, state_len=-1), ValueError, "int >= 0"),
    Row("state_len-float", "state_len", lambda t, d: _rt(t, state_len=5.0), ValueError, "int >= 0"),
    Row("state_len-bool", "state_len", lambda t, d: _rt(t, state_len=True), ValueError, "int >= 0"),
    Row("cu_seqlens-not-a-tensor", "cu_seqlens", lambda t, d: _rt(t, cu_seqlens=VCU), TypeError, "torch.Tensor"),
    Row("cu_seqlens-int64", "cu_seqlens", lambda t, d: _rt(t, cu_seqlens=_i32(VCU, d, torch.int64)),
        TypeError, "int32"),
    Row("cu_seqlens-rank-2", "cu_seqlens", lambda t, d: _rt(t, cu_seqlens=t["cu_seqlens"][None]), ValueError, "1-D"),
    Row("cu_seqlens-one-value", "cu_seqlens", lambda t, d: _rt(t, cu_seqlens=t["cu_seqlens"][:1]),
        ValueError, "num_seqs >= 1"),
    Row("x-on-cpu", "x", lambda t, d: _rt(t, x=t["x"].cpu()), ValueError, "CUDA", cpu=False),
    Row("cu_seqlens-on-cpu", "cu_seqlens", lambda t, d: _rt(t, cu_seqlens=t["cu_seqlens"].cpu()), ValueError,
        "device", cpu=False),
    # the peer accepts these: the states bit for bit
    Row("x-channels-contiguous", "x", lambda t, d: t, ACCEPTED),
    Row("x-tokens-contiguous", "x", lambda t, d: _rt(t, x=t["x"].t().contiguous().t()), ACCEPTED),
    Row("x-odd-element-offset", "x", lambda t, d: _rt(t, x=_odd_slice(t["x"])), ACCEPTED),
    Row("x-no-unit-stride", "x", lambda t, d: _rt(t, x=_no_unit_stride(t["x"])), ACCEPTED),
    Row("x-f32", "x", lambda t, d: _rt(t, x=t["x"].float()), ACCEPTED),
    Row("x-f16", "x", lambda t, d: _rt(t, x=t["x"].half()), ACCEPTED),
    Row("state_len-0", "state_len", lambda t, d: _rt(t, state_len=0), ACCEPTED),
    Row("state_len-1", "state_len", lambda t, d: _rt(t, state_len=1), ACCEPTED),
    Row("state_len-past-every-sequence", "state_len", lambda t, d: _rt(t, state_len=max(VLENS) + 3), ACCEPTED),
    Row("cu_seqlens-strided", "cu_seqlens", lambda t, d: _rt(t, cu_seqlens=_strided_i32(VCU, d)), ACCEPTED),
    Row("tiny-1x1", "x", lambda t, d: _rt(t, x=t["x"][:1, :1], cu_seqlens=_i32([0, 1], d), state_len=3), ACCEPTED),
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
    return cc1d.explain_bwd(**t, arch="sm_90")


def upd_call(t: dict, on_gpu: bool):
    if on_gpu:
        before = _snapshot(t.get("conv_state"))
        return cc1d.causal_conv1d_update(**t), before
    return cc1d.explain_update(**t, arch="sm_90")


def varlen_call(t: dict, on_gpu: bool):
    if on_gpu:
        before = _snapshot(t.get("conv_states"))
        return cc1d.causal_conv1d_varlen_fn(**t), before
    return cc1d.explain_varlen(**t, arch="sm_90")


def states_call(t: dict, on_gpu: bool):
    if on_gpu:
        return cc1d.causal_conv1d_varlen_states(**t)
    return varlen._validate_states(t["x"], t["cu_seqlens"], t["state_len"], require_device=False)


def _snapshot(state):
    """A copy of a state the call updates in place: the reference starts from it."""
    return state.clone() if isinstance(state, torch.Tensor) else None


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


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def check_state(name: str, got, want) -> None:
    """States hold copies of inputs: bit for bit (a poisoned, stale or misplaced element fails)."""
    assert got.shape == want.shape, (name, got.shape, want.shape)
    differ = _bits(got) != _bits(want)
    assert not differ.any(), f"{name}: {int(differ.sum())} of {differ.numel()} elements differ from the reference"


def _padded(slot: int, pool: int, pad_slot_id: int) -> bool:
    return slot == pad_slot_id or slot < 0 or slot >= pool


def check_upd(t: dict, result) -> None:
    out, before = result
    x, state = t["x"], before.clone()
    kw = {k: t[k] for k in ("cache_seqlens", "conv_state_indices", "num_accepted_tokens", "pad_slot_id") if k in t}
    want = cc1d.causal_conv1d_update_ref(x, state, _double(t["weight"]), _double(t.get("bias")),
                                         activation=t.get("activation"), out_dtype=torch.float64, **kw)
    assert out.dtype == x.dtype, out.dtype
    check_close("out", out, want, x.dtype)
    if t.get("conv_state_indices") is not None:
        for b, slot in enumerate(t["conv_state_indices"].tolist()):
            if _padded(slot, before.shape[0], t.get("pad_slot_id", -1)):
                assert torch.count_nonzero(out[b]) == 0, f"out: padded row {b} (slot {slot}) is not zero"
    check_state("conv_state", t["conv_state"], state)


def check_varlen(t: dict, result) -> None:
    out, before = result
    x, cu = t["x"], t["cu_seqlens"]
    kw = dict(cache_indices=t.get("cache_indices"), has_initial_state=t.get("has_initial_state"),
              activation=t.get("activation"), pad_slot_id=t.get("pad_slot_id", -1))
    want, _ = causal_conv1d_varlen_ref(_double(x), _double(t["weight"]), _double(t.get("bias")), cu,
                                       _double(before), **kw)
    assert out.dtype == x.dtype, out.dtype
    if min(x.shape) > 1:  # (a single channel or token is either layout)
        assert varlen._is_channel_last(out) == varlen._is_channel_last(x), "out does not keep x's layout"
    check_close("out", out, want, x.dtype)
    if before is None:
        return
    _, want_pool = causal_conv1d_varlen_ref(x, t["weight"], t.get("bias"), cu, before, **kw)  # native: copies
    bounds = cu.tolist()
    rows = range(len(bounds) - 1) if kw["cache_indices"] is None else kw["cache_indices"].tolist()
    for i, row in enumerate(rows):
        a, b = bounds[i], bounds[i + 1]
        if _padded(row, before.shape[0], kw["pad_slot_id"]) and b > a:
            assert torch.count_nonzero(out[:, a:b]) == 0, f"out: padded sequence {i} (row {row}) is not zero"
    check_state("conv_states", t["conv_states"], want_pool)


def check_states(t: dict, result) -> None:
    want = causal_conv1d_varlen_states_ref(t["x"], t["cu_seqlens"], t["state_len"])
    assert result.dtype == t["x"].dtype, result.dtype
    assert result.transpose(1, 2).is_contiguous(), "states: not the peer's (batch, state_len, dim) memory"
    check_state("states", result, want)


@dataclass(frozen=True)
class Runner:
    inputs: Callable[[str], dict]
    rows: list
    call: Callable[[dict, bool], object]
    check: Callable[[dict, object], None]


RUNNERS = {"causal_conv1d_fn": Runner(fwd_inputs, FWD_ROWS, fwd_call, check_fwd),
           "causal_conv1d_bwd": Runner(bwd_inputs, BWD_ROWS, bwd_call, check_bwd),
           "causal_conv1d_update": Runner(upd_inputs, UPD_ROWS, upd_call, check_upd),
           "causal_conv1d_varlen_fn": Runner(varlen_inputs, VARLEN_ROWS, varlen_call, check_varlen),
           "causal_conv1d_varlen_states": Runner(states_inputs, STATES_ROWS, states_call, check_states)}


def _params(on_gpu: bool):
    out = []
    for fn, r in RUNNERS.items():
        for row in r.rows:
            if on_gpu or row.cpu:
                out.append(pytest.param(fn, row, id=f"{fn}-{row.name}"))
    return out


def _expect_error(fn: str, row: Row, t: dict, on_gpu: bool) -> None:
    with pytest.raises(row.exc) as info:
        RUNNERS[fn].call(t, on_gpu)
    msg = str(info.value)
    # a message from the Python checks starts with the function called, never with another one
    # (the runtime's own messages name the argument only)
    assert not any(msg.startswith(f"{other}:") for other in RUNNERS if other != fn), f"{fn} called: {msg}"
    assert f"{row.arg}:" in msg or f"{row.arg} " in msg, f"message does not name {row.arg}: {msg}"
    assert row.words in msg, msg


@pytest.mark.parametrize("fn, row", _params(on_gpu=False))
def test_bad_input_without_a_device(fn, row):
    t = row.mutate(RUNNERS[fn].inputs("cpu"), "cpu")
    if row.exc is not ACCEPTED:
        _expect_error(fn, row, t, on_gpu=False)
        return
    decision = RUNNERS[fn].call(t, False)  # passes every check; an explain names the kernel
    assert not isinstance(decision, dict) or decision["key"], decision


def _poison(mp: pytest.MonkeyPatch) -> None:
    """Every buffer the API allocates starts as NaN: an unwritten element fails."""
    from cc1d import ops
    nan = float("nan")
    real_layout, real_like, real_new = ops._empty_like_layout, ops._empty_like, backward._new_output
    real_upd, real_vl, real_states = update._new_out, varlen._empty_like_layout, varlen._new_states
    mp.setattr(ops, "_empty_like_layout", lambda x, shape, dtype=None: real_layout(x, shape, dtype).fill_(nan))
    mp.setattr(ops, "_empty_like", lambda x: real_like(x).fill_(nan))
    mp.setattr(backward, "_new_output", lambda shape, dtype, device: real_new(shape, dtype, device).fill_(nan))
    mp.setattr(update, "_new_out", lambda x: real_upd(x).fill_(nan))
    mp.setattr(varlen, "_empty_like_layout", lambda x: real_vl(x).fill_(nan))
    mp.setattr(varlen, "_new_states", lambda b, s, x: real_states(b, s, x).fill_(nan))


@pytest.fixture
def poisoned_outputs(monkeypatch):
    _poison(monkeypatch)


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
            flat = torch.empty(offset + b * d * (l + pad), dtype=t.dtype, device=t.device)
            view = flat[offset:].view(b, d, l + pad)[:, :, :l]
        else:
            flat = torch.empty(offset + b * l * (d + pad), dtype=t.dtype, device=t.device)
            view = flat[offset:].view(b, l, d + pad)[:, :, :d].transpose(1, 2)
        view.copy_(t)
        return view

    @pytest.mark.gpu
    @pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(c=calls())
    def test_random_valid_calls_match_the_reference(c):
        with pytest.MonkeyPatch.context() as mp:
            _poison(mp)
            _fwd_bwd_case(c)

    def _fwd_bwd_case(c):
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

    @st.composite
    def update_calls(draw):
        xd, wd = draw(st.sampled_from(DTYPE_PAIRS))
        width, batch, seqlen = draw(st.integers(2, 8)), draw(st.integers(1, 6)), draw(st.integers(1, 6))
        mode = draw(st.sampled_from(["plain", "cache_seqlens", "accepted", "indices", "indices+cache_seqlens",
                                     "indices+accepted"]))
        pool = draw(st.integers(1, batch + 4)) if "indices" in mode else batch + draw(st.integers(0, 3))
        return dict(xd=xd, wd=wd, width=width, batch=batch, dim=draw(st.integers(1, 300)), seqlen=seqlen,
                    two_d=seqlen == 1 and draw(st.booleans()), state_len=width - 1 + draw(st.integers(0, 6)),
                    mode=mode, pool=pool, pad_slot_id=draw(st.sampled_from([-1, 0, 3])),
                    x_layout=draw(st.sampled_from(["cf", "cl"])), state_layout=draw(st.sampled_from(["cf", "cl"])),
                    x_offset=draw(st.integers(0, 3)), state_offset=draw(st.integers(0, 3)),
                    pad=draw(st.integers(0, 5)), bias=draw(st.booleans()), silu=draw(st.booleans()),
                    seed=draw(st.integers(0, 2**31 - 1)))

    def update_case(c: dict, dev: str) -> dict:
        """The arguments of a valid causal_conv1d_update call drawn as c says: x and the state
        placed at element offsets in padded buffers, indices that repeat, pad or leave the pool."""
        g = torch.Generator().manual_seed(c["seed"])
        b, d, l, m, w, pool = c["batch"], c["dim"], c["seqlen"], c["state_len"], c["width"], c["pool"]
        x = _place(torch.randn(b, d, l, generator=g).to(c["xd"]).to(dev), c["x_layout"], c["x_offset"], c["pad"])
        state = _place(torch.randn(pool, d, m, generator=g).to(c["xd"]).to(dev), c["state_layout"],
                       c["state_offset"], c["pad"])
        t = dict(x=x[:, :, 0] if c["two_d"] else x, conv_state=state,
                 weight=(torch.randn(d, w, generator=g) / w ** 0.5).to(c["wd"]).to(dev),
                 bias=torch.randn(d, generator=g).to(c["wd"]).to(dev) if c["bias"] else None,
                 activation="silu" if c["silu"] else None, pad_slot_id=c["pad_slot_id"])
        index = lambda lo, hi: torch.randint(lo, hi, (b,), generator=g, dtype=torch.int32).to(dev)  # noqa: E731
        if "indices" in c["mode"]:
            t["conv_state_indices"] = index(-2, pool + 2)
        if "cache_seqlens" in c["mode"]:
            t["cache_seqlens"] = index(-20, 60)
        if "accepted" in c["mode"]:
            t["num_accepted_tokens"] = index(-1, l + 3)
        return t

    @pytest.mark.gpu
    @pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
    @given(c=update_calls())
    def test_random_valid_update_calls_match_the_reference(c):
        t = update_case(c, "cuda")
        with pytest.MonkeyPatch.context() as mp:
            _poison(mp)
            before = t["conv_state"].clone()
            out = cc1d.causal_conv1d_update(**t)
            torch.cuda.synchronize()
        check_upd(t, (out, before))

    @st.composite
    def varlen_calls(draw):
        xd, wd = draw(st.sampled_from(DTYPE_PAIRS))
        width = draw(st.integers(2, 8))
        lens = draw(st.lists(st.integers(0, 300), min_size=1, max_size=6))
        if sum(lens) == 0:
            lens[0] = 1
        return dict(xd=xd, wd=wd, width=width, dim=draw(st.integers(1, 200)), lens=lens,
                    layout=draw(st.sampled_from(["cf", "cl"])), offset=draw(st.integers(0, 3)),
                    pad=draw(st.integers(0, 5)), pool=draw(st.sampled_from(["none", "rows", "indices"])),
                    extra_rows=draw(st.integers(0, 3)), pool_layout=draw(st.sampled_from(["cf", "cl"])),
                    pool_offset=draw(st.integers(0, 3)), state_len=width - 1 + draw(st.integers(0, 4)),
                    his=draw(st.sampled_from([None, torch.bool, torch.uint8, torch.int8, torch.int32])),
                    pad_slot_id=draw(st.sampled_from([-1, 1])),
                    max_seqlen=draw(st.sampled_from(["none", "exact", "more"])),
                    validate_data=draw(st.booleans()), bias=draw(st.booleans()), silu=draw(st.booleans()),
                    states_len=draw(st.integers(0, 10)), seed=draw(st.integers(0, 2**31 - 1)))

    def varlen_case(c: dict, dev: str) -> dict:
        """The arguments of a valid causal_conv1d_varlen_fn call drawn as c says: x and the pool
        placed at element offsets in padded buffers; pool rows distinct, some padded."""
        g = torch.Generator().manual_seed(c["seed"])
        lens, d, w, m = c["lens"], c["dim"], c["width"], c["state_len"]
        n = len(lens)
        x = _place(torch.randn(1, d, sum(lens), generator=g).to(c["xd"]).to(dev), c["layout"], c["offset"],
                   c["pad"])[0]
        t = dict(x=x, weight=(torch.randn(d, w, generator=g) / w ** 0.5).to(c["wd"]).to(dev),
                 bias=torch.randn(d, generator=g).to(c["wd"]).to(dev) if c["bias"] else None,
                 cu_seqlens=torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=dev),
                 activation="silu" if c["silu"] else None, pad_slot_id=c["pad_slot_id"],
                 max_seqlen={"none": None, "exact": max(lens), "more": max(lens) + 7}[c["max_seqlen"]],
                 validate_data=c["validate_data"])
        if c["pool"] != "none":
            pool = n + c["extra_rows"]
            t["conv_states"] = _place(torch.randn(pool, d, m, generator=g).to(c["xd"]).to(dev), c["pool_layout"],
                                      c["pool_offset"], c["pad"])
            if c["his"] is not None:
                t["has_initial_state"] = (torch.rand(n, generator=g) < 0.6).to(c["his"]).to(dev)
            if c["pool"] == "indices":
                rows = torch.randperm(pool, generator=g)[:n]
                rows = torch.where(torch.rand(n, generator=g) < 0.2, -1, rows)
                t["cache_indices"] = rows.to(torch.int32).to(dev)
        return t

    @pytest.mark.gpu
    @pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
    @given(c=varlen_calls())
    def test_random_valid_varlen_calls_match_the_reference(c):
        t = varlen_case(c, "cuda")
        states_args = dict(x=t["x"].t(), cu_seqlens=t["cu_seqlens"], state_len=c["states_len"])
        with pytest.MonkeyPatch.context() as mp:
            _poison(mp)
            before = _snapshot(t.get("conv_states"))
            out = cc1d.causal_conv1d_varlen_fn(**t)
            states = cc1d.causal_conv1d_varlen_states(**states_args)
            torch.cuda.synchronize()
        check_varlen(t, (out, before))
        check_states(states_args, states)
