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
from ._runtime import runtime

_FN = "causal_conv1d_fn"


# The raw handle without building a torch.cuda.Stream object (microseconds per call).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def _stream_handle(device: torch.device) -> int:
    if _raw_stream is not None and device.index is not None:
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
              require_device: bool = True):
    C.check_tensor(_FN, "x", x, 3)
    C.check_tensor(_FN, "weight", weight, 2)
    if require_device and not x.is_cuda:
        C.fail(_FN, "x", "a CUDA/ROCm tensor", f"a tensor on {x.device}")
    C.check_float_dtype(_FN, "x", x, tuple(C.DTYPE_CODES))
    batch, dim, seqlen = x.shape
    if batch < 1 or dim < 1 or seqlen < 1:
        C.fail(_FN, "x", "batch, dim and seqlen >= 1", f"shape {tuple(x.shape)}")
    width = weight.shape[1]
    if weight.shape[0] != dim or not 2 <= width <= C.MAX_WIDTH:
        C.fail(_FN, "weight", f"shape (dim={dim}, width) with width in 2..{C.MAX_WIDTH}",
               f"{tuple(weight.shape)}")
    C.check_device(_FN, "weight", weight, x.device)
    if weight.dtype is not x.dtype and weight.dtype is not torch.float32:
        C.check_float_dtype(_FN, "weight", weight, (x.dtype, torch.float32))
    if bias is not None:
        C.check_tensor(_FN, "bias", bias, 1)
        C.check_shape(_FN, "bias", bias, (dim,), "dim")
        C.check_device(_FN, "bias", bias, x.device)
        C.check_float_dtype(_FN, "bias", bias, (weight.dtype,))
    if seq_idx is not None:
        C.check_tensor(_FN, "seq_idx", seq_idx, 2)
        C.check_shape(_FN, "seq_idx", seq_idx, (batch, seqlen), "batch, seqlen")
        C.check_device(_FN, "seq_idx", seq_idx, x.device)
        if seq_idx.dtype != torch.int32:
            C.fail(_FN, "seq_idx", "dtype int32", str(seq_idx.dtype).replace("torch.", ""), TypeError)
    for name, t in (("initial_states", initial_states), ("final_states_out", final_states_out)):
        if t is not None:
            C.check_tensor(_FN, name, t, 3)
            C.check_shape(_FN, name, t, (batch, dim, width - 1), "batch, dim, width-1")
            C.check_device(_FN, name, t, x.device)
            C.check_float_dtype(_FN, name, t, (x.dtype,))
    return C.check_activation(_FN, activation)


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


# A functional op (no mutated arguments): torch.compile handles it without
# auto-functionalization; a caller's final_states_out is filled by a copy.
@torch.library.custom_op("cc1d::causal_conv1d_fwd", mutates_args=())
def _fwd_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
            seq_idx: Optional[torch.Tensor], initial_states: Optional[torch.Tensor],
            return_final_states: bool, silu: bool) -> tuple[torch.Tensor, torch.Tensor]:
    fs = _final_states_buffer(x, weight, return_final_states)
    out = _forward_impl(x, weight, bias, seq_idx, initial_states, fs if return_final_states else None,
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
    silu = _validate(x, weight, bias, seq_idx, initial_states, final_states_out, activation)
    if torch.compiler.is_compiling():
        out, fs = _fwd_op(x, weight, bias, seq_idx, initial_states, return_final_states, silu)
        if return_final_states and final_states_out is not None:
            final_states_out.copy_(fs)
            fs = final_states_out
        return (out, fs) if return_final_states else out
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x, weight, bias, initial_states)):
        return _backward.CausalConv1dFn.apply(x, weight, bias, seq_idx, initial_states, return_final_states,
                                    final_states_out, silu)
    if return_final_states and final_states_out is None:
        final_states_out = _final_states_buffer(x, weight, True)
    fs = final_states_out if return_final_states else None
    out = _forward_impl(x, weight, bias, seq_idx, initial_states, fs, silu)
    return (out, final_states_out) if return_final_states else out


class _Planned:
    """A tensor _forward_impl would allocate (fresh, so 256-byte aligned), laid out like x:
    what explain() passes instead of allocating it. Each slot is its own address range
    (the runtime refuses out overlapping x or the states), all far below real allocations."""

    def __init__(self, like_channel_last: bool, shape, dtype: torch.dtype, slot: int) -> None:
        b, d, n = shape
        self.shape = tuple(shape)
        self.dtype = dtype
        self._stride = (d * n, 1, d) if like_channel_last else (d * n, n, 1)
        self._address = 256 + slot * (1 << 40)

    def data_ptr(self) -> int:
        return self._address

    def stride(self):
        return self._stride


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
