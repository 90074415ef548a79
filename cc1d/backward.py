"""Backward of the causal depthwise conv1d and the autograd wiring.

``causal_conv1d_bwd`` is the peer's low-level backward (with a caller-provided
``dx`` for fusion); ``CausalConv1dFn`` is the autograd function eager training
goes through; the custom op ``cc1d::causal_conv1d_bwd`` plus
``register_autograd`` on the forward op make ``torch.compile`` training graphs
work. Every result is bitwise reproducible: dweight/dbias are reduced in a fixed
order (per-split fp32 partials, then an in-order sum), never with atomics.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _checks as C
from . import ops
from ._runtime import runtime

_FN = "causal_conv1d_bwd"


def _layout(t: torch.Tensor) -> Optional[str]:
    _, sd, sl = ops._inner_strides(t)
    return "cf" if sl == 1 else "cl" if sd == 1 else None


def _same_layout_as(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """t with x's memory layout (the kernels read x and dout and write dx alike)."""
    if _layout(t) == _layout(x):
        return t
    out = ops._empty_like_layout(x, x.shape)
    out.copy_(t)
    return out


def _validate_bwd(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, activation,
                  require_device: bool = True):
    silu = ops._validate(x, weight, bias, seq_idx, initial_states, None, activation, require_device)
    C.check_tensor(_FN, "dout", dout, 3)
    C.check_shape(_FN, "dout", dout, tuple(x.shape), "batch, dim, seqlen")
    C.check_device(_FN, "dout", dout, x.device)
    C.check_float_dtype(_FN, "dout", dout, (x.dtype,))
    if dfinal_states is not None:
        C.check_tensor(_FN, "dfinal_states", dfinal_states, 3)
        C.check_shape(_FN, "dfinal_states", dfinal_states, (x.shape[0], x.shape[1], weight.shape[1] - 1),
                      "batch, dim, width-1")
        C.check_device(_FN, "dfinal_states", dfinal_states, x.device)
        C.check_float_dtype(_FN, "dfinal_states", dfinal_states, (x.dtype,))
    if dx is not None:
        C.check_tensor(_FN, "dx", dx, 3)
        C.check_shape(_FN, "dx", dx, tuple(x.shape), "batch, dim, seqlen")
        C.check_device(_FN, "dx", dx, x.device)
        C.check_float_dtype(_FN, "dx", dx, (x.dtype,))
        for name, t in (("x", x), ("dout", dout)):
            if dx.data_ptr() == t.data_ptr():
                C.fail(_FN, "dx", f"a buffer apart from {name}", f"the same memory as {name}")
    return silu


def _bwd_call_args(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx, dis, dweight, dbias,
                   workspace, silu: bool) -> tuple:
    """(ptrs, sizes, strides, x_dtype, w_dtype, silu): the runtime's bwd arguments, in
    BwdParams order (runtime/include/cc1d/params.h)."""
    def ptr(t):
        return 0 if t is None else t.data_ptr()

    def st(t, n):
        return (0,) * n if t is None else tuple(t.stride())

    batch, dim, seqlen = x.shape
    ptrs = (x.data_ptr(), weight.data_ptr(), ptr(bias), ptr(seq_idx), ptr(initial_states), dout.data_ptr(),
            ptr(dfinal_states), dx.data_ptr(), ptr(dis), dweight.data_ptr(), ptr(dbias), ptr(workspace))
    strides = (*ops._inner_strides(x), *weight.stride(), 0 if bias is None else bias.stride(0),
               *ops._inner_strides(dout), *ops._inner_strides(dx), *st(seq_idx, 2), *st(initial_states, 3),
               *st(dfinal_states, 3), *st(dis, 3), *dweight.stride(), 0 if dbias is None else dbias.stride(0))
    return (ptrs, (batch, dim, seqlen, weight.shape[1]), strides, C.DTYPE_CODES[x.dtype],
            C.DTYPE_CODES[weight.dtype], silu)


def _new_output(shape, dtype, device) -> torch.Tensor:
    """Every gradient buffer but dx comes from here (tests poison them)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _backward_impl(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, silu: bool,
                   dx: Optional[torch.Tensor] = None, want_dinitial: bool = True, want_dbias: bool = True):
    """dx, dweight, dbias (None without bias), dinitial_states (None without initial_states)."""
    sb, sd, sl = ops._inner_strides(x)
    if sl != 1 and sd != 1:
        x = x.contiguous()
    dout = _same_layout_as(dout, x)
    user_dx = dx
    if dx is None or _same_layout_as(dx, x) is not dx:
        dx = ops._empty_like_layout(x, x.shape)
    batch, dim, _ = x.shape
    width = weight.shape[1]
    dweight = _new_output((dim, width), weight.dtype, x.device)
    dbias = _new_output((dim,), weight.dtype, x.device) if bias is not None and want_dbias else None
    dis = (_new_output((batch, dim, width - 1), x.dtype, x.device)
           if initial_states is not None and want_dinitial else None)
    rt = runtime()
    with torch.cuda.device(x.device):
        args = _bwd_call_args(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx, dis,
                              dweight, dbias, None, silu)
        nbytes = rt.bwd_workspace_bytes(*args)
        workspace = torch.empty(max(nbytes, 16), dtype=torch.uint8, device=x.device)
        ptrs = list(args[0])
        ptrs[11] = workspace.data_ptr()
        rt.bwd(tuple(ptrs), *args[1:], nbytes, ops._stream_handle(x.device))
    if user_dx is not None and user_dx is not dx:
        user_dx.copy_(dx)
        dx = user_dx
    return dx, dweight, dbias, dis


def causal_conv1d_bwd(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      dout: torch.Tensor, seq_idx: Optional[torch.Tensor] = None,
                      initial_states: Optional[torch.Tensor] = None,
                      dfinal_states: Optional[torch.Tensor] = None, dx: Optional[torch.Tensor] = None,
                      return_dinitial_states: bool = False, activation: Optional[str] = None):
    """Gradients of ``causal_conv1d_fn`` (the peer's ``causal_conv1d_bwd_function``).

    Returns ``(dx, dweight, dbias, dinitial_states)``: dbias is None without
    bias, dinitial_states None unless ``return_dinitial_states`` (which needs
    initial_states). dweight/dbias are summed in fp32 and returned in the
    weight's dtype. ``dx`` may be given (written in place and returned).
    """
    silu = _validate_bwd(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, activation)
    if return_dinitial_states and initial_states is None:
        C.fail(_FN, "return_dinitial_states", "initial_states to be given", "initial_states=None")
    return _backward_impl(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, silu, dx=dx,
                          want_dinitial=return_dinitial_states)


class CausalConv1dFn(torch.autograd.Function):
    """Eager autograd: saves the inputs (no activations) and recomputes the
    pre-activation in the backward kernel."""

    @staticmethod
    def forward(ctx, x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out, silu,
                plan=None):
        fs = final_states_out
        if return_final_states and fs is None:
            fs = ops._final_states_buffer(x, weight, True)
        written = fs if return_final_states else None
        if plan is None:  # not through causal_conv1d_fn (compat's subclass): no checked plan
            out = ops._forward_impl(x, weight, bias, seq_idx, initial_states, written, silu)
        else:
            out = ops._forward_planned(plan, x, weight, bias, seq_idx, initial_states, written, silu)
        ctx.save_for_backward(x, weight, bias, seq_idx, initial_states)
        ctx.silu = silu
        ctx.return_final_states = return_final_states
        if return_final_states:
            if final_states_out is not None:
                ctx.mark_dirty(final_states_out)  # written in place
            return out, fs
        return out

    @staticmethod
    def backward(ctx, dout, *rest):
        x, weight, bias, seq_idx, initial_states = ctx.saved_tensors
        dfinal = rest[0] if ctx.return_final_states and rest else None
        if dout is None:
            dout = torch.zeros_like(x)
        dx, dweight, dbias, dis = _backward_impl(
            x, weight, bias, seq_idx, initial_states, dout, dfinal, ctx.silu,
            want_dinitial=ctx.needs_input_grad[4], want_dbias=ctx.needs_input_grad[2])
        return dx, dweight, dbias, None, dis, None, None, None, None


# ---- torch.compile: a backward op and the forward op's autograd formula ------------

@torch.library.custom_op("cc1d::causal_conv1d_bwd", mutates_args=())
def _bwd_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], seq_idx: Optional[torch.Tensor],
            initial_states: Optional[torch.Tensor], dout: torch.Tensor, dfinal_states: Optional[torch.Tensor],
            silu: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dweight, dbias, dis = _backward_impl(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, silu)
    empty = x.new_empty(0)
    return dx, dweight, empty if dbias is None else dbias, empty if dis is None else dis


@_bwd_op.register_fake
def _(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, silu):
    sb, sd, sl = ops._inner_strides(x)
    if sl != 1 and sd != 1:
        x = x.contiguous()
    batch, dim, _ = x.shape
    dbias = x.new_empty(0) if bias is None else bias.new_empty(dim)
    dis = x.new_empty(0) if initial_states is None else x.new_empty(batch, dim, weight.shape[1] - 1)
    return ops._empty_like_layout(x, x.shape), weight.new_empty(weight.shape), dbias, dis


def _setup_context(ctx, inputs, output):
    x, weight, bias, seq_idx, initial_states, return_final_states, silu = inputs
    ctx.save_for_backward(x, weight, bias, seq_idx, initial_states)
    ctx.silu = silu
    ctx.return_final_states = return_final_states


def _fwd_op_backward(ctx, dout, dfinal):
    x, weight, bias, seq_idx, initial_states = ctx.saved_tensors
    if not ctx.return_final_states:
        dfinal = None
    if dout is None:
        dout = torch.zeros_like(x)
    dx, dweight, dbias, dis = _bwd_op(x, weight, bias, seq_idx, initial_states, dout, dfinal, ctx.silu)
    return (dx, dweight, None if bias is None else dbias, None,
            None if initial_states is None else dis, None, None)


ops._fwd_op.register_autograd(_fwd_op_backward, setup_context=_setup_context)
