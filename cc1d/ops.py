"""PyTorch API: drop-in for Dao-AILab causal-conv1d's ``causal_conv1d_fn``.

Every call goes to the C++ runtime, which picks a kernel (tuned or default),
compiles it once and launches it on the current stream. The op is registered
as ``torch.ops.cc1d.causal_conv1d_fwd`` so ``torch.compile`` keeps it in the
graph; eager calls skip the dispatcher's overhead and call the runtime directly.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _checks as C
from ._planned import PlannedBuffer
from ._runtime import runtime

_FN = "causal_conv1d_fn"


# The raw handle of a device's current stream, without building a torch.cuda.Stream
# object (microseconds per call); the slow way on a torch that lacks it.
_raw_stream = (getattr(torch._C, "_cuda_getCurrentRawStream", None)
               or (lambda index: torch.cuda.current_stream(index).cuda_stream))
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
# The fast path's allocator for outputs laid out like x (tests poison it, as _empty_like_layout).
_empty_like = torch.empty_like


def _stream_handle(device: torch.device) -> int:
    if device.index is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


def _is_channel_last(x: torch.Tensor) -> bool:
    return x.stride(2) != 1 and x.stride(1) == 1


def _empty_like_layout(x: torch.Tensor, shape, dtype=None) -> torch.Tensor:
    """(batch, dim, n) tensor laid out like x: n contiguous, or dim contiguous."""
    dtype = dtype or x.dtype
    if _is_channel_last(x):
        return torch.empty(shape[0], shape[2], shape[1], dtype=dtype, device=x.device).transpose(1, 2)
    return torch.empty(shape, dtype=dtype, device=x.device)


def _validate(x, weight, bias, seq_idx, initial_states, final_states_out, activation,
              require_device: bool = True, fn: str = _FN):
    """Check a forward call's arguments (errors name `fn`, the entry point called); returns
    whether the activation is SiLU."""
    C.check_tensor(fn, "x", x, 3)
    C.check_tensor(fn, "weight", weight, 2)
    if require_device and not x.is_cuda:
        C.fail(fn, "x", "a CUDA/ROCm tensor", f"a tensor on {x.device}")
    C.check_float_dtype(fn, "x", x, tuple(C.DTYPE_CODES))
    batch, dim, seqlen = x.shape
    if batch < 1 or dim < 1 or seqlen < 1:
        C.fail(fn, "x", "batch, dim and seqlen >= 1", f"shape {tuple(x.shape)}")
    width = weight.shape[1]
    if weight.shape[0] != dim or not 2 <= width <= C.MAX_WIDTH:
        C.fail(fn, "weight", f"shape (dim={dim}, width) with width in 2..{C.MAX_WIDTH}",
               f"{tuple(weight.shape)}")
    C.check_device(fn, "weight", weight, x.device)
    if weight.dtype is not x.dtype and weight.dtype is not torch.float32:
        C.check_float_dtype(fn, "weight", weight, (x.dtype, torch.float32))
    if bias is not None:
        C.check_tensor(fn, "bias", bias, 1)
        C.check_shape(fn, "bias", bias, (dim,), "dim")
        C.check_device(fn, "bias", bias, x.device)
        C.check_float_dtype(fn, "bias", bias, (weight.dtype,))
    if seq_idx is not None:
        C.check_tensor(fn, "seq_idx", seq_idx, 2)
        C.check_shape(fn, "seq_idx", seq_idx, (batch, seqlen), "batch, seqlen")
        C.check_device(fn, "seq_idx", seq_idx, x.device)
        if seq_idx.dtype != torch.int32:
            C.fail(fn, "seq_idx", "dtype int32", str(seq_idx.dtype).replace("torch.", ""), TypeError)
    for name, t in (("initial_states", initial_states), ("final_states_out", final_states_out)):
        if t is not None:
            C.check_tensor(fn, name, t, 3)
            C.check_shape(fn, name, t, (batch, dim, width - 1), "batch, dim, width-1")
            C.check_device(fn, name, t, x.device)
            C.check_float_dtype(fn, name, t, (x.dtype,))
    return C.check_activation(fn, activation)


def _inner_strides(t: torch.Tensor):
    """Strides with size-1 inner dims normalised: their stride is meaningless, and the
    runtime tells the layout by which inner stride is 1."""
    sb, sd, sl = t.stride()
    if t.shape[2] == 1 and sd != 1:
        sl = 1
    elif t.shape[1] == 1 and sl != 1:
        sd = 1
    return sb, sd, sl


def _fwd_call_args(x, weight, bias, seq_idx, initial_states, final_states, out, silu: bool,
                   stream: int) -> tuple:
    """The runtime's fwd arguments (ptrs, sizes, strides, x_dtype, w_dtype, silu, stream).
    Reads only data_ptr(), stride() and shape, so explain() can pass _Planned stand-ins."""
    def ptr(t):
        return 0 if t is None else t.data_ptr()

    def strides(t, n):
        return (0,) * n if t is None else tuple(t.stride())

    batch, dim, seqlen = x.shape
    st = (*_inner_strides(x), *weight.stride(), 0 if bias is None else bias.stride(0),
          *_inner_strides(out), *strides(seq_idx, 2), *strides(initial_states, 3),
          *strides(final_states, 3))
    return ((x.data_ptr(), weight.data_ptr(), ptr(bias), ptr(seq_idx), ptr(initial_states),
             out.data_ptr(), ptr(final_states)),
            (batch, dim, seqlen, weight.shape[1]), st,
            C.DTYPE_CODES[x.dtype], C.DTYPE_CODES[weight.dtype], silu, stream)


def _launch(x, weight, bias, seq_idx, initial_states, final_states, out, silu: bool) -> None:
    runtime().fwd(*_fwd_call_args(x, weight, bias, seq_idx, initial_states, final_states, out, silu,
                                  _stream_handle(x.device)))


def _forward_impl(x, weight, bias, seq_idx, initial_states, final_states_out, silu: bool):
    """A call through the runtime's plain entry, no plan: the generic kernel (aiter's shim
    writing into a given out; the tests hold the plans' fixed kernels to it)."""
    sb, sd, sl = _inner_strides(x)
    if sl != 1 and sd != 1:
        x = x.contiguous()  # neither inner stride is 1: the kernels need one of them
    out = _empty_like_layout(x, x.shape)
    if x.device.index != _current_device():
        with torch.cuda.device(x.device):
            _launch(x, weight, bias, seq_idx, initial_states, final_states_out, out, silu)
    else:
        _launch(x, weight, bias, seq_idx, initial_states, final_states_out, out, silu)
    return out


# ---- the eager fast path: one plan per call signature --------------------------------
# A call whose tensors have the signature (type, shape, strides, dtype, device) of an
# earlier valid call passes the same checks and gets the same runtime arguments but
# for its pointers and stream: its plan holds those, converted once, and the call
# reads only pointers. Memos are bounded (a server sees every prompt length).
_MAX_PLANS = 4096


def _sig(t: torch.Tensor) -> tuple:
    """All that the checks and the argument building read from a tensor argument."""
    return type(t), t.shape, t.stride(), t.dtype, t.device


def _meta(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """t's shape, strides and dtype on the meta device: plans are built from metadata alone."""
    return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _is_like(t: torch.Tensor, meta: torch.Tensor, fresh: torch.Tensor, device: torch.device) -> bool:
    """Whether torch.empty_like(t) allocates the buffer `fresh` stands for (on `device`; meta:
    t's stand-in): t is a plain tensor (empty_like gives a subclass its type, torch.empty does
    not) with fresh's shape, dtype and strides, which empty_like keeps, being dense. Other
    layouts keep the slower allocators: empty_like picks strides of its own for them, and on
    the meta device not always CUDA's (dims of size 1)."""
    return ((type(t) is torch.Tensor or type(t) is torch.nn.Parameter) and t.device == device
            and (meta.shape, meta.stride(), meta.dtype) == (fresh.shape, fresh.stride(), fresh.dtype))


def _remember(memo: dict, key: Optional[tuple], plan):
    if key is not None:
        if len(memo) >= _MAX_PLANS:
            memo.clear()
        memo[key] = plan
    return plan


class _FwdPlan:
    """A checked forward signature: the runtime's arguments but pointers and stream
    (``launch[silu]``), whether x must be made contiguous, whether out is
    ``torch.empty_like(x)`` (else _empty_like_layout) and x's device index."""
    __slots__ = ("launch", "contiguous", "out_like_x", "device")

    def __init__(self, launch: tuple, contiguous: bool, out_like_x: bool, device: Optional[int]) -> None:
        self.launch = launch
        self.contiguous = contiguous
        self.out_like_x = out_like_x
        self.device = device


# causal_conv1d_fn's plans, by _fwd_key: only calls that passed _validate add one.
_FWD_PLANS: dict = {}


def _fwd_key(x, weight, bias, seq_idx, initial_states, final_states_out, return_final_states: bool) -> tuple:
    """causal_conv1d_fn's memo key: all that _validate reads but the activation (checked on
    every call) and all that its plan follows from. Raises for arguments that are not tensors.
    Built inline for the common arguments: reading the metadata is most of a planned call's
    Python cost."""
    key = (type(x), x.shape, x.stride(), x.dtype, x.device,
           type(weight), weight.shape, weight.stride(), weight.dtype, weight.device, return_final_states)
    if bias is not None:
        key += (type(bias), bias.shape, bias.stride(), bias.dtype, bias.device)
    if seq_idx is not None or initial_states is not None or final_states_out is not None:
        # The None markers keep these apart from the bias fields and from each other.
        key += (None if seq_idx is None else _sig(seq_idx), None if initial_states is None else _sig(initial_states),
                None if final_states_out is None else _sig(final_states_out))
    return key


def _make_fwd_plan(x, weight, bias, seq_idx, initial_states, final_states_out,
                   return_final_states: bool) -> _FwdPlan:
    """The plan of a checked call: causal_conv1d_fn's allocations and _fwd_call_args, run on
    meta stand-ins."""
    xm, wm = _meta(x), _meta(weight)
    fs = None
    if return_final_states:
        fs = _final_states_buffer(xm, wm, True) if final_states_out is None else _meta(final_states_out)
    sb, sd, sl = _inner_strides(xm)
    contiguous = sl != 1 and sd != 1
    if contiguous:
        xm = xm.contiguous()
    out = _empty_like_layout(xm, xm.shape)
    _, sizes, strides, x_dtype, w_dtype, _, _ = _fwd_call_args(
        xm, wm, _meta(bias), _meta(seq_idx), _meta(initial_states), fs, out, False, 0)
    launch = _fwd_launchers(sizes, strides, x_dtype, w_dtype)
    return _FwdPlan(launch, contiguous, _is_like(x, xm, out, x.device), x.device.index)


def _fwd_launchers(sizes, strides, x_dtype: int, w_dtype: int) -> tuple:
    """A forward plan's launchers for these sizes and strides (_fwd_call_args'), without and
    with SiLU (``launch[silu]``): builtin functions, called without pybind11's per-call dispatch."""
    rt = runtime()
    return tuple(rt.FwdPlan(sizes, strides, x_dtype, w_dtype, silu).launcher() for silu in (False, True))


def _fwd_plan(x, weight, bias, seq_idx, initial_states, final_states_out, want_fs: bool, activation):
    """The call's plan from the memo, or (the call checked by _validate first) a new one
    remembered; and silu. Every Python forward path takes its plan here."""
    try:
        key = _fwd_key(x, weight, bias, seq_idx, initial_states, final_states_out, want_fs)
        plan = _FWD_PLANS.get(key)
    except Exception:  # not tensors, or metadata that does not hash: _validate says what is wrong
        key = plan = None
    if plan is not None:
        # The one check the key does not cover.
        return plan, False if activation is None else C.check_activation(_FN, activation)
    silu = _validate(x, weight, bias, seq_idx, initial_states, final_states_out, activation)
    return _remember(_FWD_PLANS, key, _make_fwd_plan(x, weight, bias, seq_idx, initial_states, final_states_out,
                                                     want_fs)), silu


def _launch_planned(launch, device: Optional[int], ptrs: tuple) -> None:
    """Call a plan's launcher with the pointers and the current stream of x's device,
    making that device current for the call where it is not."""
    if device == _current_device():
        launch(*ptrs, _raw_stream(device))
    else:
        with torch.cuda.device(device):
            launch(*ptrs, _raw_stream(device))


def _forward_planned(plan: _FwdPlan, x, weight, bias, seq_idx, initial_states, final_states, silu: bool):
    """_forward_impl of a call with a plan: allocate out, read the pointers, launch."""
    if plan.contiguous:
        x = x.contiguous()  # neither inner stride is 1: the kernels need one of them
    out = _empty_like(x) if plan.out_like_x else _empty_like_layout(x, x.shape)
    ptrs = (x.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(),
            0 if seq_idx is None else seq_idx.data_ptr(),
            0 if initial_states is None else initial_states.data_ptr(), out.data_ptr(),
            0 if final_states is None else final_states.data_ptr())
    _launch_planned(plan.launch[silu], plan.device, ptrs)
    return out


def _forward_via_plan(x, weight, bias, seq_idx, initial_states, final_states, silu: bool):
    """_forward_impl through causal_conv1d_fn's plans (the call is checked on a memo miss), for
    the paths that do not plan themselves (compiled graphs, the peer-compatible autograd
    function): they launch what eager calls launch, a plan's fixed kernel where plans fix one,
    which is the kernel the tuner ranked. final_states: the buffer to write, or None."""
    plan, _ = _fwd_plan(x, weight, bias, seq_idx, initial_states, final_states, final_states is not None,
                        "silu" if silu else None)
    return _forward_planned(plan, x, weight, bias, seq_idx, initial_states, final_states, silu)


# A functional op (no mutated arguments): torch.compile handles it without
# auto-functionalization; a caller's final_states_out is filled by a copy.
@torch.library.custom_op("cc1d::causal_conv1d_fwd", mutates_args=())
def _fwd_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
            seq_idx: Optional[torch.Tensor], initial_states: Optional[torch.Tensor],
            return_final_states: bool, silu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    fs = _final_states_buffer(x, weight, return_final_states)
    out = _forward_via_plan(x, weight, bias, seq_idx, initial_states, fs if return_final_states else None,
                            silu)
    return out, fs


@_fwd_op.register_fake
def _(x, weight, bias, seq_idx, initial_states, return_final_states, silu):
    sb, sd, sl = _inner_strides(x)
    if sl != 1 and sd != 1:
        x = x.contiguous()
    return _empty_like_layout(x, x.shape), _final_states_buffer(x, weight, return_final_states)


def _final_states_buffer(x, weight, wanted: bool) -> torch.Tensor:
    if not wanted:
        return x.new_empty(0)
    return _empty_like_layout(x, (x.shape[0], x.shape[1], weight.shape[1] - 1))


def causal_conv1d_fn(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                     seq_idx: Optional[torch.Tensor] = None,
                     initial_states: Optional[torch.Tensor] = None,
                     return_final_states: bool = False,
                     final_states_out: Optional[torch.Tensor] = None,
                     activation: Optional[str] = None):
    """Causal depthwise conv1d: x (batch, dim, seqlen), weight (dim, width), width 2..8.

    x may be channel-first (seqlen contiguous) or channel-last (a transposed
    (batch, seqlen, dim) tensor); the output keeps x's layout. Returns ``out``,
    or ``(out, final_states)`` with ``return_final_states``; final_states is
    (batch, dim, width-1), written into ``final_states_out`` when given.
    """
    if _is_compiling():  # first: the memo below is no graph's business
        silu = _validate(x, weight, bias, seq_idx, initial_states, final_states_out, activation)
        out, fs = _fwd_op(x, weight, bias, seq_idx, initial_states, return_final_states, silu)
        if return_final_states and final_states_out is not None:
            final_states_out.copy_(fs)
            fs = final_states_out
        return (out, fs) if return_final_states else out
    want_fs = True if return_final_states else False
    plan, silu = _fwd_plan(x, weight, bias, seq_idx, initial_states, final_states_out, want_fs, activation)
    if _grad_enabled() and (x.requires_grad or weight.requires_grad
                            or (bias is not None and bias.requires_grad)
                            or (initial_states is not None and initial_states.requires_grad)):
        return _backward.CausalConv1dFn.apply(x, weight, bias, seq_idx, initial_states, return_final_states,
                                              final_states_out, silu, plan)
    if not want_fs:
        return _forward_planned(plan, x, weight, bias, seq_idx, initial_states, None, silu)
    if final_states_out is None:
        final_states_out = _final_states_buffer(x, weight, True)
    return _forward_planned(plan, x, weight, bias, seq_idx, initial_states, final_states_out, silu), final_states_out


class _Planned(PlannedBuffer):
    """A tensor _forward_impl would allocate (fresh, so 256-byte aligned), laid out like x:
    what explain() passes instead of allocating it (the runtime refuses out overlapping x
    or the states: each slot is its own address range)."""

    def __init__(self, like_channel_last: bool, shape, dtype: torch.dtype, slot: int) -> None:
        b, d, n = shape
        super().__init__((d * n, 1, d) if like_channel_last else (d * n, n, 1), slot, shape, dtype)


def explain(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
            seq_idx: Optional[torch.Tensor] = None, initial_states: Optional[torch.Tensor] = None,
            activation: Optional[str] = None, *, return_final_states: bool = False,
            arch: Optional[str] = None) -> dict:
    """Which kernel ``causal_conv1d_fn`` would launch for these arguments, and why.

    Returns a dict: ``key`` (the variant), ``reason`` (exact | nearest | default),
    ``source`` (the tuning DB file, or "catalog"), ``matched_shape`` (the tuned
    shape used), ``distance``, ``arch``, ``shape``, ``alignment``, ``detail`` and
    ``variant`` (all its fields). Allocates, copies and launches nothing; ``arch``
    (e.g. "sm_90") overrides the target of x's device, and lets CPU tensors be explained.
    """
    silu = _validate(x, weight, bias, seq_idx, initial_states, None, activation,
                     require_device=arch is None)
    cl = _is_channel_last(x)
    sb, sd, sl = _inner_strides(x)
    if sl != 1 and sd != 1:
        x = _Planned(False, x.shape, x.dtype, slot=0)  # _forward_impl would run x.contiguous()
        cl = False
    out = _Planned(cl, x.shape, x.dtype, slot=1)
    fs = (_Planned(cl, (x.shape[0], x.shape[1], weight.shape[1] - 1), x.dtype, slot=2)
          if return_final_states else None)
    args = _fwd_call_args(x, weight, bias, seq_idx, initial_states, fs, out, silu, 0)
    return runtime().explain_fwd(*args, arch=arch or "")


# The backward registers itself as the forward op's autograd formula (torch.compile
# training graphs); imported last because it builds on this module.
from . import backward as _backward  # noqa: E402
