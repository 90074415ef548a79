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
from ._planned import PlannedBuffer
from ._runtime import runtime

_FN = "causal_conv1d_bwd"


def _layout(t: torch.Tensor) -> Optional[str]:
    _, sd, sl = ops._inner_strides(t)
    return "cf" if sl == 1 else "cl" if sd == 1 else None


def _validate_bwd(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, activation,
                  require_device: bool = True):
    silu = ops._validate(x, weight, bias, seq_idx, initial_states, None, activation, require_device, fn=_FN)
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
        _check_dx_apart(x, dout, dx)
    return silu


def _check_dx_apart(x, dout, dx) -> None:
    for name, t in (("x", x), ("dout", dout)):
        if dx.data_ptr() == t.data_ptr():
            C.fail(_FN, "dx", f"a buffer apart from {name}", f"the same memory as {name}")


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


def explain_bwd(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], dout: torch.Tensor,
                seq_idx: Optional[torch.Tensor] = None, initial_states: Optional[torch.Tensor] = None,
                dfinal_states: Optional[torch.Tensor] = None, dx: Optional[torch.Tensor] = None,
                return_dinitial_states: bool = False, activation: Optional[str] = None, *,
                arch: Optional[str] = None) -> dict:
    """Which kernel ``causal_conv1d_bwd`` would launch for these arguments, and why: the
    dict of ``cc1d.explain``. Allocates, copies and launches nothing; ``arch`` (e.g.
    "sm_90") overrides the target of x's device, and lets CPU tensors be explained. The
    autograd backward of ``causal_conv1d_fn`` takes the kernel this names for its x,
    weight, bias, seq_idx and initial_states, with dout laid out like x."""
    # The call's own plan decides which buffers it would make; each stands in a slot of its own.
    silu, plan = _checked_bwd_plan(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx,
                                   return_dinitial_states, activation, require_device=arch is None)
    if plan.contiguous:  # x.contiguous(): channel-first
        x = ops._Planned(False, x.shape, x.dtype, slot=0)
    cl = _layout(x) == "cl"
    if plan.dout_copy:  # copied to x's layout
        dout = ops._Planned(cl, x.shape, x.dtype, slot=1)
    if plan.dx_fresh:
        dx = ops._Planned(cl, x.shape, x.dtype, slot=2)
    dim, width = plan.dweight_shape
    dweight = PlannedBuffer((width, 1), slot=3)
    dbias = None if plan.dbias_shape is None else PlannedBuffer((1,), slot=4)
    dis = None if plan.dis_shape is None else PlannedBuffer((dim * (width - 1), width - 1, 1), slot=5)
    args = _bwd_call_args(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx, dis, dweight, dbias,
                          None, silu)
    return runtime().explain_bwd(*args, arch=arch or "")


def _new_output(shape, dtype, device) -> torch.Tensor:
    """Every gradient buffer but dx and those ops._empty_like gives comes from here (tests poison them)."""
    return torch.empty(*shape, dtype=dtype, device=device)  # unpacked: faster to parse than a tuple


# ---- plans (see ops: one per call signature) ----------------------------------------

class _BwdPlan:
    """What _backward_impl decides for one signature of its arguments: the runtime's
    arguments but pointers, workspace and stream (``launch[silu]``), whether x must
    be made contiguous, dout copied to x's layout, dx allocated (not the caller's),
    the gradients' shapes, and which fresh buffer is ``torch.empty_like`` of an input
    (x, weight, bias, initial_states: ``*_like``) rather than _empty_like_layout or
    _new_output."""
    __slots__ = ("launch", "contiguous", "dout_copy", "dx_fresh", "device", "x_dtype", "w_dtype",
                 "dweight_shape", "dbias_shape", "dis_shape", "x_like", "dweight_like", "dbias_like", "dis_like")


# _backward_impl's plans (its callers checked the arguments, or never did: no check is skipped).
_PLANS: dict = {}
# causal_conv1d_bwd's plans: only calls that passed _validate_bwd add one.
_CHECKED_PLANS: dict = {}


def _bwd_key(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx, want_dinitial: bool,
             want_dbias: bool) -> tuple:
    """The memo key of a backward call: all that _validate_bwd reads but the activation and dx's
    address (checked on every call), and all that its plan follows from. Raises for arguments
    that are not tensors."""
    sig = ops._sig
    return (type(x), x.shape, x.stride(), x.dtype, x.device, sig(weight),
            None if bias is None else sig(bias), None if seq_idx is None else sig(seq_idx),
            None if initial_states is None else sig(initial_states), sig(dout),
            None if dfinal_states is None else sig(dfinal_states), None if dx is None else sig(dx),
            want_dinitial, want_dbias)


def _make_bwd_plan(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx, want_dinitial: bool,
                   want_dbias: bool) -> _BwdPlan:
    """_backward_impl's decisions, allocations and _bwd_call_args, run on meta stand-ins."""
    meta = ops._meta
    xm, wm, dm, dxm = meta(x), meta(weight), meta(dout), meta(dx)
    p = _BwdPlan()
    sb, sd, sl = ops._inner_strides(xm)
    p.contiguous = sl != 1 and sd != 1
    if p.contiguous:
        xm = xm.contiguous()
    fresh = ops._empty_like_layout(xm, xm.shape)
    p.x_like = ops._is_like(x, xm, fresh, x.device)
    p.dout_copy = _layout(dm) != _layout(xm)
    if p.dout_copy:
        dm = fresh
    p.dx_fresh = dxm is None or _layout(dxm) != _layout(xm)
    if p.dx_fresh:
        dxm = fresh
    batch, dim, _ = xm.shape
    width = wm.shape[1]
    p.dweight_shape = (dim, width)
    p.dbias_shape = (dim,) if bias is not None and want_dbias else None
    p.dis_shape = (batch, dim, width - 1) if initial_states is not None and want_dinitial else None
    bm, im = meta(bias), meta(initial_states)
    dwm, dbm, dism = (None if shape is None else _new_output(shape, dtype, "meta")
                      for shape, dtype in ((p.dweight_shape, wm.dtype), (p.dbias_shape, wm.dtype),
                                           (p.dis_shape, xm.dtype)))
    # A gradient is empty_like(its input) wherever that allocates the same buffer.
    p.dweight_like = ops._is_like(weight, wm, dwm, x.device)
    p.dbias_like = dbm is not None and ops._is_like(bias, bm, dbm, x.device)
    p.dis_like = dism is not None and ops._is_like(initial_states, im, dism, x.device)
    _, sizes, strides, x_dtype, w_dtype, _ = _bwd_call_args(
        xm, wm, bm, meta(seq_idx), im, dm, meta(dfinal_states), dxm, dism, dwm, dbm, None, False)
    rt = runtime()
    p.launch = tuple(rt.BwdPlan(sizes, strides, x_dtype, w_dtype, silu) for silu in (False, True))
    p.device, p.x_dtype, p.w_dtype = x.device, x.dtype, weight.dtype
    return p


def _backward_impl(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, silu: bool,
                   dx: Optional[torch.Tensor] = None, want_dinitial: bool = True, want_dbias: bool = True):
    """dx, dweight, dbias (None without bias), dinitial_states (None without initial_states)."""
    want_dinitial = True if want_dinitial else False
    want_dbias = True if want_dbias else False
    try:
        key = _bwd_key(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx, want_dinitial, want_dbias)
        plan = _PLANS.get(key)
    except Exception:  # metadata that does not hash: no memo
        key = plan = None
    if plan is None:
        plan = ops._remember(_PLANS, key, _make_bwd_plan(x, weight, bias, seq_idx, initial_states, dout,
                                                         dfinal_states, dx, want_dinitial, want_dbias))
    return _backward_planned(plan, x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx, silu)


def _backward_planned(plan: _BwdPlan, x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx, silu: bool):
    """_backward_impl of a call with a plan: allocate, read the pointers, launch."""
    if plan.contiguous:
        x = x.contiguous()
    if plan.dout_copy:  # the kernels read x and dout and write dx alike
        fresh = ops._empty_like(x) if plan.x_like else ops._empty_like_layout(x, x.shape)
        fresh.copy_(dout)
        dout = fresh
    user_dx = dx
    if plan.dx_fresh:
        dx = ops._empty_like(x) if plan.x_like else ops._empty_like_layout(x, x.shape)
    device = plan.device
    dweight = ops._empty_like(weight) if plan.dweight_like else _new_output(plan.dweight_shape, plan.w_dtype, device)
    dbias = dis = None
    if plan.dbias_shape is not None:
        dbias = ops._empty_like(bias) if plan.dbias_like else _new_output(plan.dbias_shape, plan.w_dtype, device)
    if plan.dis_shape is not None:
        dis = (ops._empty_like(initial_states) if plan.dis_like
               else _new_output(plan.dis_shape, plan.x_dtype, device))
    ptrs = (x.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(),
            0 if seq_idx is None else seq_idx.data_ptr(),
            0 if initial_states is None else initial_states.data_ptr(), dout.data_ptr(),
            0 if dfinal_states is None else dfinal_states.data_ptr(), dx.data_ptr(),
            0 if dis is None else dis.data_ptr(), dweight.data_ptr(), 0 if dbias is None else dbias.data_ptr())
    if device.index == ops._current_device():
        _launch_with_workspace(plan.launch[silu], ptrs, device)
    else:
        with torch.cuda.device(device):
            _launch_with_workspace(plan.launch[silu], ptrs, device)
    if user_dx is not None and user_dx is not dx:
        user_dx.copy_(dx)
        dx = user_dx
    return dx, dweight, dbias, dis


def _launch_with_workspace(launch, ptrs: tuple, device: torch.device) -> None:
    """The workspace the dispatched variant needs (its size follows from the pointers'
    alignment too), then the launch."""
    nbytes = launch.workspace_bytes(*ptrs, 0)
    workspace = torch.empty(max(nbytes, 16), dtype=torch.uint8, device=device)
    launch(*ptrs, workspace.data_ptr(), nbytes, ops._raw_stream(device.index))


def _checked_bwd_plan(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, return_dinitial_states,
                      activation, require_device: bool = True) -> tuple[bool, _BwdPlan]:
    """A backward call's checks (_validate_bwd, then return_dinitial_states') and its plan, with
    silu: causal_conv1d_bwd's first call of a key, and explain_bwd."""
    silu = _validate_bwd(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx, activation,
                         require_device)
    if return_dinitial_states and initial_states is None:
        C.fail(_FN, "return_dinitial_states", "initial_states to be given", "initial_states=None")
    want_dinitial = True if return_dinitial_states else False
    return silu, _make_bwd_plan(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx, want_dinitial,
                                True)


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
    try:
        key = _bwd_key(x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx,
                       True if return_dinitial_states else False, True)
        plan = _CHECKED_PLANS.get(key)
    except Exception:  # not tensors, or metadata that does not hash: _validate_bwd says what is wrong
        key = plan = None
    if plan is not None:  # the checks the key does not cover, in _validate_bwd's order
        silu = C.check_activation(_FN, activation)
        if dx is not None:
            _check_dx_apart(x, dout, dx)
    else:  # (a remembered plan's key holds return_dinitial_states and initial_states: checked when made)
        silu, plan = _checked_bwd_plan(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx,
                                       return_dinitial_states, activation)
        plan = ops._remember(_CHECKED_PLANS, key, plan)
    return _backward_planned(plan, x, weight, bias, seq_idx, initial_states, dout, dfinal_states, dx, silu)


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
        if plan is None:  # not through causal_conv1d_fn (compat's subclass): no plan at hand
            out = ops._forward_via_plan(x, weight, bias, seq_idx, initial_states, written, silu)
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
