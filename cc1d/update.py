"""Decode update: ``causal_conv1d_update``, the peer's (Dao-AILab causal-conv1d)
single/multi-token step against a conv_state, with vLLM's state pools, padded
slots and speculative decoding.

Registered as ``torch.ops.cc1d.causal_conv1d_update`` (mutating conv_state) so
``torch.compile`` keeps it in the graph; eager calls go to the runtime directly.
Every launch is asynchronous and allocates only ``out``: calls can be captured
in a CUDA graph once their kernel is loaded (a first call, or ``warmup_update``).
An eager call whose tensors match an earlier valid call's signature skips the
Python checks and argument building (its plan holds them; the runtime still
checks every call's pointers).
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from . import _checks as C
from ._runtime import runtime
from .ops import _current_device, _launch_planned, _remember, _sig, _stream_handle

_FN = "causal_conv1d_update"
_is_compiling = torch.compiler.is_compiling


def _activation(activation: Union[None, bool, str]) -> bool:
    """True for SiLU: None/False, or "silu"/"swish"/True as the peer takes them."""
    if activation is None or activation is False:
        return False
    if activation is True:
        return True
    return C.check_activation(_FN, activation)


def _check_index(name: str, t: Optional[torch.Tensor], batch: int, device: torch.device) -> None:
    if t is None:
        return
    C.check_tensor(_FN, name, t, 1)
    C.check_shape(_FN, name, t, (batch,), "batch")
    C.check_device(_FN, name, t, device)
    if t.dtype != torch.int32:
        C.fail(_FN, name, "dtype int32", str(t.dtype).replace("torch.", ""), TypeError)


def _validate(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, num_accepted_tokens,
              pad_slot_id, require_device: bool = True) -> None:
    if not isinstance(x, torch.Tensor):
        C.fail(_FN, "x", "a torch.Tensor", type(x).__name__, TypeError)
    if x.dim() not in (2, 3):
        C.fail(_FN, "x", "a 2-D (batch, dim) or 3-D (batch, dim, seqlen) tensor", f"shape {tuple(x.shape)}")
    if require_device and not x.is_cuda:
        C.fail(_FN, "x", "a CUDA/ROCm tensor", f"a tensor on {x.device}")
    C.check_float_dtype(_FN, "x", x, tuple(C.DTYPE_CODES))
    batch, dim = x.shape[:2]
    seqlen = x.shape[2] if x.dim() == 3 else 1
    if batch < 1 or dim < 1 or seqlen < 1:
        C.fail(_FN, "x", "batch, dim and seqlen >= 1", f"shape {tuple(x.shape)}")
    C.check_tensor(_FN, "weight", weight, 2)
    width = weight.shape[1]
    if weight.shape[0] != dim or not 2 <= width <= C.MAX_WIDTH:
        C.fail(_FN, "weight", f"shape (dim={dim}, width) with width in 2..{C.MAX_WIDTH}", f"{tuple(weight.shape)}")
    C.check_device(_FN, "weight", weight, x.device)
    if weight.dtype is not x.dtype and weight.dtype is not torch.float32:
        C.check_float_dtype(_FN, "weight", weight, (x.dtype, torch.float32))
    C.check_tensor(_FN, "conv_state", conv_state, 3)
    if conv_state.shape[0] < 1 or conv_state.shape[1] != dim or conv_state.shape[2] < width - 1:
        C.fail(_FN, "conv_state", f"shape (batch or pool >= 1, dim={dim}, state_len >= width-1={width - 1})",
               f"{tuple(conv_state.shape)}")
    if conv_state_indices is None and conv_state.shape[0] < batch:
        C.fail(_FN, "conv_state", f"a first dimension >= batch={batch} (no conv_state_indices given)",
               f"{tuple(conv_state.shape)}")
    C.check_device(_FN, "conv_state", conv_state, x.device)
    C.check_float_dtype(_FN, "conv_state", conv_state, (x.dtype,))
    if bias is not None:
        C.check_tensor(_FN, "bias", bias, 1)
        C.check_shape(_FN, "bias", bias, (dim,), "dim")
        C.check_device(_FN, "bias", bias, x.device)
        C.check_float_dtype(_FN, "bias", bias, (weight.dtype,))
    _check_index("cache_seqlens", cache_seqlens, batch, x.device)
    _check_index("conv_state_indices", conv_state_indices, batch, x.device)
    _check_index("num_accepted_tokens", num_accepted_tokens, batch, x.device)
    if cache_seqlens is not None and num_accepted_tokens is not None:
        C.fail(_FN, "num_accepted_tokens", "None when cache_seqlens is given (a circular buffer or vLLM's "
               "speculative window, not both)", "a tensor")
    if isinstance(pad_slot_id, bool) or not isinstance(pad_slot_id, int):
        C.fail(_FN, "pad_slot_id", "an int", repr(pad_slot_id), TypeError)


def _strides3(t) -> tuple:
    """(batch, dim, l) strides of a 2-D or 3-D tensor; size-1 axes get stride 0 (never
    stepped over), so they do not lower the alignment class or hide the layout."""
    shape = tuple(t.shape) + ((1,) if len(t.shape) == 2 else ())
    st = tuple(t.stride()) + ((0,) if len(t.shape) == 2 else ())
    return tuple(0 if n == 1 else s for n, s in zip(shape, st))


def _state_strides(s) -> tuple:
    sb, sd, sl = _strides3(s)
    if s.shape[1] == 1:
        sd = 1  # one channel: dim counts as contiguous
    return sb, sd, sl


def _upd_call_args(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, num_accepted_tokens,
                   out, pad_slot_id: int, silu: bool) -> tuple:
    """(ptrs, sizes, strides, pad_slot_id, x_dtype, w_dtype, silu): the runtime's upd arguments in
    UpdParams order (runtime/include/cc1d/params.h). Reads only data_ptr(), stride() and shape."""
    def ptr(t):
        return 0 if t is None else t.data_ptr()

    def st1(t):
        return 0 if t is None else t.stride(0)

    batch, dim = x.shape[:2]
    seqlen = x.shape[2] if len(x.shape) == 3 else 1
    ptrs = (x.data_ptr(), weight.data_ptr(), ptr(bias), conv_state.data_ptr(), ptr(cache_seqlens),
            ptr(conv_state_indices), ptr(num_accepted_tokens), out.data_ptr())
    sizes = (batch, dim, seqlen, conv_state.shape[2], conv_state.shape[0], weight.shape[1])
    strides = (*_strides3(x), *weight.stride(), st1(bias), *_state_strides(conv_state), *_strides3(out),
               st1(cache_seqlens), st1(conv_state_indices), st1(num_accepted_tokens))
    return (ptrs, sizes, strides, pad_slot_id, C.DTYPE_CODES[x.dtype], C.DTYPE_CODES[weight.dtype], silu)


def _new_out(x: torch.Tensor) -> torch.Tensor:
    """The output, x's shape and (when dense) strides; the one allocation (tests poison it)."""
    return torch.empty_like(x)


def _update_impl(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices, num_accepted_tokens,
                 pad_slot_id) -> torch.Tensor:
    """A call through the runtime's plain entry, no plan: the generic kernel (the tests hold the
    plans' fixed kernels to it)."""
    out = _new_out(x)
    args = _upd_call_args(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, num_accepted_tokens,
                          out, pad_slot_id, silu)
    if x.device.index != _current_device():
        with torch.cuda.device(x.device):
            runtime().upd(*args, _stream_handle(x.device))
    else:
        runtime().upd(*args, _stream_handle(x.device))
    return out


@torch.library.custom_op("cc1d::causal_conv1d_update", mutates_args=("conv_state",))
def _update_op(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
               silu: bool, cache_seqlens: Optional[torch.Tensor], conv_state_indices: Optional[torch.Tensor],
               num_accepted_tokens: Optional[torch.Tensor], pad_slot_id: int) -> torch.Tensor:
    return _update_via_plan(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices,
                            num_accepted_tokens, pad_slot_id)


@_update_op.register_fake
def _(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices, num_accepted_tokens, pad_slot_id):
    return torch.empty_like(x)


class _UpdPlan:
    """A checked update signature: the runtime's launchers for it (``launch[silu]``: UpdPlan's,
    taking the pointers and the stream) and x's device index."""
    __slots__ = ("launch", "device")

    def __init__(self, launch: tuple, device: Optional[int]) -> None:
        self.launch = launch
        self.device = device


# causal_conv1d_update's plans, by _upd_key: only calls that passed _validate add one.
_UPD_PLANS: dict = {}


def _upd_key(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, num_accepted_tokens,
             pad_slot_id) -> tuple:
    """causal_conv1d_update's memo key: all that _validate reads but the activation (checked on
    every call). pad_slot_id's type is in it (True == 1 and hash alike; _validate refuses a bool).
    Raises for arguments that are not tensors or do not hash."""
    key = (type(x), x.shape, x.stride(), x.dtype, x.device,
           type(conv_state), conv_state.shape, conv_state.stride(), conv_state.dtype, conv_state.device,
           type(weight), weight.shape, weight.stride(), weight.dtype, weight.device,
           type(pad_slot_id), pad_slot_id, None if bias is None else _sig(bias))
    if cache_seqlens is not None or conv_state_indices is not None or num_accepted_tokens is not None:
        key += (None if cache_seqlens is None else _sig(cache_seqlens),
                None if conv_state_indices is None else _sig(conv_state_indices),
                None if num_accepted_tokens is None else _sig(num_accepted_tokens))
    return key


def _make_upd_plan(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, num_accepted_tokens, out,
                   pad_slot_id: int) -> _UpdPlan:
    """The plan of a checked call, from its arguments and its out (_new_out's: every call of the
    signature gets out with these strides)."""
    _, sizes, strides, pad, x_dtype, w_dtype, _ = _upd_call_args(
        x, conv_state, weight, bias, cache_seqlens, conv_state_indices, num_accepted_tokens, out, pad_slot_id, False)
    rt = runtime()
    launch = tuple(rt.UpdPlan(sizes, strides, pad, x_dtype, w_dtype, silu).launcher() for silu in (False, True))
    return _UpdPlan(launch, x.device.index)


def _update_planned(plan: _UpdPlan, x, conv_state, weight, bias, cache_seqlens, conv_state_indices,
                    num_accepted_tokens, out, silu: bool) -> torch.Tensor:
    """Launch a call with a plan: read the pointers and the stream."""
    ptrs = (x.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(), conv_state.data_ptr(),
            0 if cache_seqlens is None else cache_seqlens.data_ptr(),
            0 if conv_state_indices is None else conv_state_indices.data_ptr(),
            0 if num_accepted_tokens is None else num_accepted_tokens.data_ptr(), out.data_ptr())
    _launch_planned(plan.launch[silu], plan.device, ptrs)
    return out


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                         bias: Optional[torch.Tensor] = None, activation: Union[None, bool, str] = None,
                         cache_seqlens: Optional[torch.Tensor] = None,
                         conv_state_indices: Optional[torch.Tensor] = None,
                         num_accepted_tokens: Optional[torch.Tensor] = None,
                         pad_slot_id: int = -1) -> torch.Tensor:
    """One decode step: x (batch, dim) or (batch, dim, seqlen) new tokens; returns out of x's shape
    and updates ``conv_state`` (batch or pool, dim, state_len >= width-1; x's dtype; any strides) in place.

    - Default (the peer's): the window is the state's last width-1 entries; the state becomes
      the last state_len entries of (state, x).
    - ``cache_seqlens`` (int32, (batch,)): conv_state is a circular buffer; token t is written at
      (cache_seqlens + t) % state_len and the window is the width-1 entries before cache_seqlens.
    - ``conv_state_indices`` (int32, (batch,)): row b uses pool row conv_state_indices[b]; an index
      equal to ``pad_slot_id``, negative or past the pool marks a padded row: out is 0 there and
      no state is touched. Rows naming the same slot run one after another in batch order.
    - ``num_accepted_tokens`` (int32, (batch,); vLLM's speculative decoding): with a = its value
      (clamped to [1, min(seqlen, state_len-width+2)]) the window is state[a-1 : a+width-2] and the
      state becomes state[a : a+state_len-seqlen] followed by x's tokens.
    """
    silu = _activation(activation)
    if _is_compiling():  # first: the memo below is no graph's business
        _validate(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, num_accepted_tokens, pad_slot_id)
        return _update_op(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices,
                          num_accepted_tokens, pad_slot_id)
    return _update_via_plan(x, conv_state, weight, bias, silu, cache_seqlens, conv_state_indices,
                            num_accepted_tokens, pad_slot_id)


def _update_via_plan(x, conv_state, weight, bias, silu: bool, cache_seqlens, conv_state_indices,
                     num_accepted_tokens, pad_slot_id) -> torch.Tensor:
    """A call through its plan, memoised by signature and checked on a memo miss: eager calls
    and compiled graphs (_update_op) alike launch the plan's fixed kernel, the one the tuner
    ranked."""
    try:
        key = _upd_key(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, num_accepted_tokens,
                       pad_slot_id)
        plan = _UPD_PLANS.get(key)
    except Exception:  # not tensors, or an argument that does not hash: _validate says what is wrong
        key = plan = None
    if plan is None:
        _validate(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, num_accepted_tokens, pad_slot_id)
        out = _new_out(x)
        plan = _remember(_UPD_PLANS, key, _make_upd_plan(x, conv_state, weight, bias, cache_seqlens,
                                                         conv_state_indices, num_accepted_tokens, out, pad_slot_id))
    else:
        out = _new_out(x)
    return _update_planned(plan, x, conv_state, weight, bias, cache_seqlens, conv_state_indices,
                           num_accepted_tokens, out, silu)


def explain_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                   conv_state_indices=None, num_accepted_tokens=None, pad_slot_id: int = -1, *,
                   arch: Optional[str] = None) -> dict:
    """Which kernel ``causal_conv1d_update`` would launch, and why (as ``cc1d.explain``).
    Allocates and launches nothing; ``arch`` lets CPU tensors be explained."""
    silu = _activation(activation)
    _validate(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, num_accepted_tokens, pad_slot_id,
              require_device=arch is None)
    out = _Fresh(x)
    args = _upd_call_args(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, num_accepted_tokens,
                          out, pad_slot_id, silu)
    return runtime().explain_upd(*args, 0, arch or "")


class _Fresh:
    """The ``out`` _update_impl would allocate (torch.empty_like(x): x's strides when dense, a
    fresh allocation so 256-byte aligned), without allocating it."""

    def __init__(self, x: torch.Tensor) -> None:
        self.shape = tuple(x.shape)
        self._stride = tuple(torch.empty_like(x, device="meta").stride())

    def data_ptr(self) -> int:
        return 1 << 40

    def stride(self, dim: Optional[int] = None):
        return self._stride if dim is None else self._stride[dim]


def warmup_update(batch: int, dim: int, *, seqlen: int = 1, state_len: Optional[int] = None,
                  dtype: torch.dtype = torch.bfloat16, weight_dtype: Optional[torch.dtype] = None,
                  width: int = 4, bias: bool = True, activation: Union[None, bool, str] = "silu",
                  state_layout: str = "cl", state_indices: bool = False, pool: Optional[int] = None,
                  device=None) -> dict:
    """Decide, compile and load the kernel of ``causal_conv1d_update`` calls with fresh contiguous
    tensors of these sizes (x (batch, dim) when seqlen is 1, else (batch, dim, seqlen); conv_state
    (batch, dim, state_len) with state_len contiguous ("cf") or a (batch, state_len, dim) tensor
    viewed by .transpose(1, 2) ("cl", vLLM's)), so they can be captured in a CUDA graph.
    ``state_indices``: the calls pass conv_state_indices (a state pool of ``pool`` rows, default
    batch), which is a tuned feature with kernels of its own. cache_seqlens and
    num_accepted_tokens do not change the kernel."""
    from ._warmup import _StandIn, _check_device, _contiguous
    dev = _check_device(device)
    w_dtype = weight_dtype or dtype
    state_len = width - 1 if state_len is None else state_len
    if state_layout not in ("cf", "cl"):
        C.fail("warmup_update", "state_layout", "'cf' or 'cl'", repr(state_layout))
    x = _contiguous(batch, dim, dtype=dtype) if seqlen == 1 else _contiguous(batch, dim, seqlen, dtype=dtype)
    out = _contiguous(*x.shape, dtype=dtype)
    if not isinstance(state_indices, bool):
        C.fail("warmup_update", "state_indices", "a bool", repr(state_indices), TypeError)
    rows = batch if pool is None else pool
    if pool is not None and (isinstance(pool, bool) or not isinstance(pool, int) or pool < 1 or not state_indices):
        C.fail("warmup_update", "pool", "an int >= 1, with state_indices=True", repr(pool))
    state = (_contiguous(rows, dim, state_len, dtype=dtype) if state_layout == "cf" else
             _StandIn((rows, dim, state_len), (dim * state_len, 1, dim), dtype))
    indices = _contiguous(batch, dtype=torch.int32) if state_indices else None
    args = _upd_call_args(x, state, _contiguous(dim, width, dtype=w_dtype),
                          _contiguous(dim, dtype=w_dtype) if bias else None, None, indices, None, out, -1,
                          _activation(activation))
    with torch.cuda.device(dev):
        return runtime().prepare_upd(*args, device=dev.index)
