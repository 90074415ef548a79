"""Varlen prefill for serving engines: packed sequences with a state pool.

``causal_conv1d_varlen_fn`` convolves every sequence of a packed batch alone,
starting from (and updating in place) its row of a state pool, as vLLM's
varlen ``causal_conv1d_fn`` does; ``causal_conv1d_varlen_states`` is the
peer's (Dao-AILab) helper returning each sequence's last ``state_len``
tokens. Both read no device value on the host (no synchronisation), so they
can be captured in a CUDA graph once a first call (or ``prepare_varlen``)
has compiled and loaded the kernel. Both are torch custom ops
(``torch.ops.cc1d.causal_conv1d_varlen`` mutates ``conv_states``), so
``torch.compile`` keeps them in the graph.
"""
from __future__ import annotations

from typing import Optional

import torch

from . import _checks as C
from ._planned import PlannedBuffer
from ._runtime import runtime
from .ops import _current_device, _stream_handle

_FN = "causal_conv1d_varlen_fn"
_FN_STATES = "causal_conv1d_varlen_states"
_HIS_DTYPES = {torch.bool: 1, torch.uint8: 1, torch.int8: 1, torch.int32: 4}


def _inner_strides_2d(x: torch.Tensor) -> tuple[int, int]:
    """(dim stride, token stride), with the stride of a size-1 dim normalised: the
    runtime tells the layout by which one is 1."""
    sd, sl = x.stride()
    if x.shape[1] == 1 and sd != 1:
        sl = 1
    elif x.shape[0] == 1 and sl != 1:
        sd = 1
    return sd, sl


def _is_channel_last(x: torch.Tensor) -> bool:
    sd, sl = _inner_strides_2d(x)
    return sl != 1 and sd == 1


def _usable_layout(x: torch.Tensor) -> torch.Tensor:
    sd, sl = _inner_strides_2d(x)
    return x if sl == 1 or sd == 1 else x.contiguous()


def _empty_like_layout(x: torch.Tensor) -> torch.Tensor:
    """(dim, total) laid out like x: tokens contiguous, or channels contiguous."""
    if _is_channel_last(x):
        return torch.empty(x.shape[1], x.shape[0], dtype=x.dtype, device=x.device).t()
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _check_cu_seqlens(fn: str, cu_seqlens, device) -> int:
    C.check_tensor(fn, "cu_seqlens", cu_seqlens, 1)
    if cu_seqlens.dtype != torch.int32:
        C.fail(fn, "cu_seqlens", "dtype int32", str(cu_seqlens.dtype).replace("torch.", ""), TypeError)
    if cu_seqlens.shape[0] < 2:
        C.fail(fn, "cu_seqlens", "shape (num_seqs + 1,) with num_seqs >= 1", f"{tuple(cu_seqlens.shape)}")
    C.check_device(fn, "cu_seqlens", cu_seqlens, device)
    return cu_seqlens.shape[0] - 1


def _validate(x, weight, bias, cu_seqlens, conv_states, cache_indices, has_initial_state, activation,
              max_seqlen, pad_slot_id, require_device: bool = True) -> bool:
    C.check_tensor(_FN, "x", x, 2)
    C.check_tensor(_FN, "weight", weight, 2)
    if require_device and not x.is_cuda:
        C.fail(_FN, "x", "a CUDA/ROCm tensor", f"a tensor on {x.device}")
    C.check_float_dtype(_FN, "x", x, tuple(C.DTYPE_CODES))
    dim, total = x.shape
    if dim < 1 or total < 1:
        C.fail(_FN, "x", "shape (dim, total_tokens) with dim and total_tokens >= 1", f"{tuple(x.shape)}")
    width = weight.shape[1]
    if weight.shape[0] != dim or not 2 <= width <= C.MAX_WIDTH:
        C.fail(_FN, "weight", f"shape (dim={dim}, width) with width in 2..{C.MAX_WIDTH}", f"{tuple(weight.shape)}")
    C.check_device(_FN, "weight", weight, x.device)
    if weight.dtype is not x.dtype and weight.dtype is not torch.float32:
        C.check_float_dtype(_FN, "weight", weight, (x.dtype, torch.float32))
    if bias is not None:
        C.check_tensor(_FN, "bias", bias, 1)
        C.check_shape(_FN, "bias", bias, (dim,), "dim")
        C.check_device(_FN, "bias", bias, x.device)
        C.check_float_dtype(_FN, "bias", bias, (weight.dtype,))
    num_seqs = _check_cu_seqlens(_FN, cu_seqlens, x.device)
    if conv_states is None:
        for name, t in (("cache_indices", cache_indices), ("has_initial_state", has_initial_state)):
            if t is not None:
                C.fail(_FN, name, "None when conv_states is None (it addresses rows of the state pool)",
                       "a tensor")
    else:
        C.check_tensor(_FN, "conv_states", conv_states, 3)
        pool, sdim, state_len = conv_states.shape
        if sdim != dim or state_len < width - 1 or pool < 1:
            C.fail(_FN, "conv_states", f"shape (pool >= 1, dim={dim}, state_len >= width-1={width - 1})",
                   f"{tuple(conv_states.shape)}")
        C.check_device(_FN, "conv_states", conv_states, x.device)
        C.check_float_dtype(_FN, "conv_states", conv_states, (x.dtype,))
        if cache_indices is None and pool < num_seqs:
            C.fail(_FN, "conv_states", f"at least num_seqs={num_seqs} rows without cache_indices "
                   "(sequence i uses row i)", f"{pool} rows")
    if cache_indices is not None:
        C.check_tensor(_FN, "cache_indices", cache_indices, 1)
        C.check_shape(_FN, "cache_indices", cache_indices, (num_seqs,), "num_seqs")
        C.check_device(_FN, "cache_indices", cache_indices, x.device)
        if cache_indices.dtype != torch.int32:
            C.fail(_FN, "cache_indices", "dtype int32", str(cache_indices.dtype).replace("torch.", ""), TypeError)
    if has_initial_state is not None:
        C.check_tensor(_FN, "has_initial_state", has_initial_state, 1)
        C.check_shape(_FN, "has_initial_state", has_initial_state, (num_seqs,), "num_seqs")
        C.check_device(_FN, "has_initial_state", has_initial_state, x.device)
        if has_initial_state.dtype not in _HIS_DTYPES:
            C.fail(_FN, "has_initial_state", "dtype bool, uint8, int8 or int32",
                   str(has_initial_state.dtype).replace("torch.", ""), TypeError)
    if max_seqlen is not None and (isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int)
                                   or max_seqlen < 1):
        C.fail(_FN, "max_seqlen", "None or an int >= 1 bounding the longest sequence", repr(max_seqlen))
    if isinstance(pad_slot_id, bool) or not isinstance(pad_slot_id, int):
        C.fail(_FN, "pad_slot_id", "an int", repr(pad_slot_id), TypeError)
    return C.check_activation(_FN, activation)


def _check_values(x, cu_seqlens, conv_states, cache_indices, max_seqlen, pad_slot_id) -> None:
    """validate_data=True: the checks that read device values (one synchronisation)."""
    cu = cu_seqlens.tolist()
    total = x.shape[1]
    if cu[0] != 0:
        C.fail(_FN, "cu_seqlens", "first value 0", cu[0])
    if any(b < a for a, b in zip(cu, cu[1:])):
        C.fail(_FN, "cu_seqlens", "non-decreasing values", cu)
    if cu[-1] != total:
        C.fail(_FN, "cu_seqlens", f"last value total_tokens={total}", cu[-1])
    longest = max(b - a for a, b in zip(cu, cu[1:]))
    if max_seqlen is not None and longest > max_seqlen:
        C.fail(_FN, "max_seqlen", f">= the longest sequence ({longest})", max_seqlen)
    if cache_indices is not None:
        pool = conv_states.shape[0]
        bad = [i for i in cache_indices.tolist() if i != pad_slot_id and i >= 0 and i >= pool]
        if bad:
            C.fail(_FN, "cache_indices", f"rows in [0, pool={pool}) or pad_slot_id={pad_slot_id} or negative",
                   bad[:8])


def _call_args(x, weight, bias, cu_seqlens, conv_states, cache_indices, has_initial_state, out, silu: bool,
               pad_slot_id: int, max_seqlen: int, width: int, stream: int) -> tuple:
    """The runtime's varlen arguments (ptrs, sizes, strides, x_dtype, w_dtype, silu, stream), in
    VarlenParams order (runtime/include/cc1d/params.h). out None: states only."""
    def ptr(t):
        return 0 if t is None else t.data_ptr()

    def st(t, n):
        return (0,) * n if t is None else tuple(t.stride())

    dim, total = x.shape
    pool, state_len = (0, 0) if conv_states is None else (conv_states.shape[0], conv_states.shape[2])
    his_bytes = 0 if has_initial_state is None else _HIS_DTYPES[has_initial_state.dtype]
    ptrs = (x.data_ptr(), ptr(weight), ptr(bias), cu_seqlens.data_ptr(), ptr(cache_indices),
            ptr(has_initial_state), ptr(conv_states), ptr(out))
    sizes = (cu_seqlens.shape[0] - 1, dim, total, max_seqlen, state_len, pool, pad_slot_id, his_bytes, width)
    strides = (*_inner_strides_2d(x), *st(weight, 2), 0 if bias is None else bias.stride(0),
               *((0, 0) if out is None else _inner_strides_2d(out)), *st(conv_states, 3),
               cu_seqlens.stride(0), *st(cache_indices, 1), *st(has_initial_state, 1))
    w_dtype = x.dtype if weight is None else weight.dtype
    return ptrs, sizes, strides, C.DTYPE_CODES[x.dtype], C.DTYPE_CODES[w_dtype], silu, stream


def _run(args_without_stream: tuple, device: torch.device) -> None:
    if device.index != _current_device():
        with torch.cuda.device(device):
            runtime().varlen(*args_without_stream, _stream_handle(device))
    else:
        runtime().varlen(*args_without_stream, _stream_handle(device))


def _varlen_impl(x, weight, bias, cu_seqlens, conv_states, cache_indices, has_initial_state, silu: bool,
                 pad_slot_id: int, max_seqlen: int) -> torch.Tensor:
    x = _usable_layout(x)
    out = _empty_like_layout(x)
    _run(_call_args(x, weight, bias, cu_seqlens, conv_states, cache_indices, has_initial_state, out, silu,
                    pad_slot_id, max_seqlen, weight.shape[1], 0)[:-1], x.device)
    return out


@torch.library.custom_op("cc1d::causal_conv1d_varlen", mutates_args=("conv_states",))
def _varlen_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], cu_seqlens: torch.Tensor,
               conv_states: Optional[torch.Tensor], cache_indices: Optional[torch.Tensor],
               has_initial_state: Optional[torch.Tensor], silu: bool, pad_slot_id: int,
               max_seqlen: int) -> torch.Tensor:
    return _varlen_impl(x, weight, bias, cu_seqlens, conv_states, cache_indices, has_initial_state, silu,
                        pad_slot_id, max_seqlen)


@_varlen_op.register_fake
def _(x, weight, bias, cu_seqlens, conv_states, cache_indices, has_initial_state, silu, pad_slot_id, max_seqlen):
    return _empty_like_layout(_usable_layout(x))


def causal_conv1d_varlen_fn(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                            cu_seqlens: torch.Tensor, conv_states: Optional[torch.Tensor] = None,
                            cache_indices: Optional[torch.Tensor] = None,
                            has_initial_state: Optional[torch.Tensor] = None,
                            activation: Optional[str] = None, pad_slot_id: int = -1,
                            max_seqlen: Optional[int] = None, validate_data: bool = False) -> torch.Tensor:
    """Causal depthwise conv1d over packed sequences, each alone, with a state pool.

    x: (dim, total_tokens), tokens contiguous, or the transposed view of a
    (total_tokens, dim) tensor (channels contiguous); the output keeps x's layout.
    cu_seqlens: int32 (num_seqs + 1,), 0 first, non-decreasing, total_tokens last:
    sequence i is tokens [cu_seqlens[i], cu_seqlens[i+1]) (it may be empty).
    conv_states: (pool, dim, state_len >= width-1) in x's dtype, any strides, updated in
    place. cache_indices: int32 (num_seqs,) pool rows (None: row i); a row equal to
    pad_slot_id, negative or >= pool pads the sequence (zero output, no state read or
    written). has_initial_state: (num_seqs,) bool/uint8/int8/int32 (None: all false):
    sequence i's inputs before its first token are the last width-1 columns of its row
    (zeros when false). Afterwards every non-padded row holds the last state_len inputs
    of (the row's old state_len columns, or zeros without an initial state, then the
    sequence's tokens), as vLLM's ``causal_conv1d_fn`` leaves it.

    max_seqlen: a bound on the longest sequence, checked with ``validate_data`` (kept for
    callers that pass it: no kernel needs it, the stream is convolved whole).
    Nothing is read back from the device (CUDA-graph capturable): cu_seqlens and
    cache_indices are trusted; ``validate_data=True`` checks their values at the cost
    of one synchronisation. Rows shared by two sequences give undefined states.
    """
    silu = _validate(x, weight, bias, cu_seqlens, conv_states, cache_indices, has_initial_state, activation,
                     max_seqlen, pad_slot_id)
    if validate_data:
        _check_values(x, cu_seqlens, conv_states, cache_indices, max_seqlen, pad_slot_id)
    bound = 0 if max_seqlen is None else min(max_seqlen, x.shape[1])  # 0: total_tokens
    if torch.compiler.is_compiling():
        return _varlen_op(x, weight, bias, cu_seqlens, conv_states, cache_indices, has_initial_state, silu,
                          pad_slot_id, bound)
    return _varlen_impl(x, weight, bias, cu_seqlens, conv_states, cache_indices, has_initial_state, silu,
                        pad_slot_id, bound)


def _validate_states(x, cu_seqlens, state_len, require_device: bool = True) -> int:
    C.check_tensor(_FN_STATES, "x", x, 2)
    if require_device and not x.is_cuda:
        C.fail(_FN_STATES, "x", "a CUDA/ROCm tensor", f"a tensor on {x.device}")
    C.check_float_dtype(_FN_STATES, "x", x, tuple(C.DTYPE_CODES))
    total, dim = x.shape
    if dim < 1 or total < 1:
        C.fail(_FN_STATES, "x", "shape (total_tokens, dim) with both >= 1", f"{tuple(x.shape)}")
    if isinstance(state_len, bool) or not isinstance(state_len, int) or state_len < 0:
        C.fail(_FN_STATES, "state_len", "an int >= 0", repr(state_len))
    return _check_cu_seqlens(_FN_STATES, cu_seqlens, x.device)


def _new_states(batch: int, state_len: int, x: torch.Tensor) -> torch.Tensor:
    # The peer's layout: (batch, state_len, dim) memory viewed as (batch, dim, state_len).
    return torch.empty(batch, state_len, x.shape[1], dtype=x.dtype, device=x.device).transpose(1, 2)


def _states_impl(x: torch.Tensor, cu_seqlens: torch.Tensor, state_len: int) -> torch.Tensor:
    states = _new_states(cu_seqlens.shape[0] - 1, state_len, x)
    if state_len == 0:
        return states
    xt = _usable_layout(x.t())  # (dim, total)
    # States only: out is None, weight unused; width 2 names the family (its window is not used).
    _run(_call_args(xt, None, None, cu_seqlens, states, None, None, None, False, -1, 0, 2, 0)[:-1], x.device)
    return states


@torch.library.custom_op("cc1d::causal_conv1d_varlen_states", mutates_args=())
def _states_op(x: torch.Tensor, cu_seqlens: torch.Tensor, state_len: int) -> torch.Tensor:
    return _states_impl(x, cu_seqlens, state_len)


@_states_op.register_fake
def _(x, cu_seqlens, state_len):
    return _new_states(cu_seqlens.shape[0] - 1, state_len, x)


def causal_conv1d_varlen_states(x: torch.Tensor, cu_seqlens: torch.Tensor, state_len: int) -> torch.Tensor:
    """x (total_tokens, dim), cu_seqlens int32 (batch + 1,) -> states (batch, dim, state_len):
    the last state_len tokens of each sequence, zero-padded in front (the peer's
    ``causal_conv1d_varlen_states``; its (batch, state_len, dim) memory layout)."""
    _validate_states(x, cu_seqlens, state_len)
    if torch.compiler.is_compiling():
        return _states_op(x, cu_seqlens, state_len)
    return _states_impl(x, cu_seqlens, state_len)


def explain_varlen(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], cu_seqlens: torch.Tensor,
                   conv_states: Optional[torch.Tensor] = None, cache_indices: Optional[torch.Tensor] = None,
                   has_initial_state: Optional[torch.Tensor] = None, activation: Optional[str] = None,
                   pad_slot_id: int = -1, max_seqlen: Optional[int] = None, validate_data: bool = False, *,
                   arch: Optional[str] = None) -> dict:
    """Which kernel ``causal_conv1d_varlen_fn`` would launch, and why (as ``cc1d.explain``), after
    the same checks (``validate_data`` too). Allocates and launches nothing; ``arch`` (e.g.
    "sm_90") lets CPU tensors be explained."""
    silu = _validate(x, weight, bias, cu_seqlens, conv_states, cache_indices, has_initial_state, activation,
                     max_seqlen, pad_slot_id, require_device=arch is None)
    if validate_data:
        _check_values(x, cu_seqlens, conv_states, cache_indices, max_seqlen, pad_slot_id)
    sd, sl = _inner_strides_2d(x)
    if sl != 1 and sd != 1:
        x = _Planned2d(x.shape, x.dtype, False, slot=0)  # _varlen_impl would run x.contiguous()
    out = _Planned2d(x.shape, x.dtype, _is_channel_last(x), slot=1)
    bound = 0 if max_seqlen is None else min(max_seqlen, x.shape[1])
    args = _call_args(x, weight, bias, cu_seqlens, conv_states, cache_indices, has_initial_state, out, silu,
                      pad_slot_id, bound, weight.shape[1], 0)
    return runtime().explain_varlen(*args, arch=arch or "")


class _Planned2d(PlannedBuffer):
    """A (dim, total) tensor _varlen_impl would allocate (fresh, so 256-byte aligned; tokens or
    channels contiguous), without allocating it (the runtime refuses out overlapping x or
    conv_states: each slot is its own address range)."""

    def __init__(self, shape, dtype: torch.dtype, channel_last: bool, slot: int) -> None:
        super().__init__((1, shape[0]) if channel_last else (shape[1], 1), slot, shape, dtype)


def prepare_varlen(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], cu_seqlens: torch.Tensor,
                   conv_states: Optional[torch.Tensor] = None, cache_indices: Optional[torch.Tensor] = None,
                   has_initial_state: Optional[torch.Tensor] = None, activation: Optional[str] = None,
                   pad_slot_id: int = -1, max_seqlen: Optional[int] = None) -> dict:
    """Decide, compile and load the kernel such a call uses, launching nothing (warm-up
    before CUDA-graph capture). Returns the decision as ``cc1d.explain`` does."""
    silu = _validate(x, weight, bias, cu_seqlens, conv_states, cache_indices, has_initial_state, activation,
                     max_seqlen, pad_slot_id)
    x = _usable_layout(x)
    out = _empty_like_layout(x)
    args = _call_args(x, weight, bias, cu_seqlens, conv_states, cache_indices, has_initial_state, out, silu,
                      pad_slot_id, 0 if max_seqlen is None else min(max_seqlen, x.shape[1]), weight.shape[1],
                      0)[:-1]
    with torch.cuda.device(x.device):
        return runtime().prepare_varlen(*args, device=x.device.index)
