"""``cc1d.warmup``: decide, compile and load ahead of time the kernels that calls
of given shapes will use, so that those calls do no dispatch, compile or load
work: they can be captured in a CUDA graph, and the first one is not slow."""
from __future__ import annotations

import itertools
import operator
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence, Union

import torch

from . import _checks as C
from ._runtime import runtime
from .backward import _bwd_call_args
from .ops import _fwd_call_args, _is_channel_last

_FN = "warmup"
_LAYOUTS = ("cf", "cl")
# A fresh torch allocation is at least 512-byte aligned; the runtime caps the
# alignment it uses at 256 bytes, so this address stands for any fresh buffer.
_FRESH_ADDRESS = 256


_SPACING = 1 << 40  # stand-ins get disjoint address ranges (the backward refuses overlaps)
_next_slot = itertools.count()


class _StandIn:
    """A contiguous tensor a call would pass, as the runtime sees it: address
    (never dereferenced), shape, strides and dtype. No memory behind it."""

    def __init__(self, shape: Sequence[int], strides: Sequence[int], dtype: torch.dtype) -> None:
        self.shape = tuple(shape)
        self._strides = tuple(strides)
        self.dtype = dtype
        self._address = _FRESH_ADDRESS + (next(_next_slot) % (1 << 20)) * _SPACING

    def data_ptr(self) -> int:
        return self._address

    def stride(self, dim: Optional[int] = None):
        return self._strides if dim is None else self._strides[dim]


def _contiguous(*shape: int, dtype: torch.dtype) -> _StandIn:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return _StandIn(shape, tuple(reversed(strides)), dtype)


def _activations(b: int, d: int, n: int, dtype: torch.dtype, layout: str) -> _StandIn:
    """(b, d, n) laid out channel-first, or a (b, n, d) tensor viewed by .transpose(1, 2)."""
    return _StandIn((b, d, n), (d * n, n, 1) if layout == "cf" else (d * n, 1, d), dtype)


def _positive_int(arg: str, value: object) -> int:
    if isinstance(value, bool):
        C.fail(_FN, arg, "an int", repr(value), TypeError)
    try:
        n = operator.index(value)
    except TypeError:
        C.fail(_FN, arg, "an int", f"{type(value).__name__} {value!r}", TypeError)
    if n < 1:
        C.fail(_FN, arg, "an int >= 1", n)
    return n


def _check_shapes(shapes: object) -> list[tuple[int, int, int]]:
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Iterable):
        C.fail(_FN, "shapes", "an iterable of (batch, dim, seqlen) tuples", type(shapes).__name__, TypeError)
    out = []
    for i, shape in enumerate(shapes):
        arg = f"shapes[{i}]"
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
            C.fail(_FN, arg, "a (batch, dim, seqlen) tuple of 3 ints", type(shape).__name__, TypeError)
        parts = tuple(shape)
        if len(parts) != 3:
            C.fail(_FN, arg, "a (batch, dim, seqlen) tuple of 3 ints", repr(shape))
        out.append(tuple(_positive_int(f"{arg}[{k}] ({name})", v)
                         for k, (name, v) in enumerate(zip(("batch", "dim", "seqlen"), parts))))
    return out


def _check_bool(arg: str, value: object) -> bool:
    if not isinstance(value, bool):
        C.fail(_FN, arg, "True or False", repr(value), TypeError)
    return value


def _check_dtype(arg: str, value: object, allowed: Sequence[torch.dtype]) -> torch.dtype:
    if value not in allowed:  # also rejects what is not a torch.dtype
        names = ", ".join(str(d) for d in allowed)
        C.fail(_FN, arg, f"one of ({names})", repr(value), TypeError)
    return value


def _check_device(device: object) -> torch.device:
    if device is not None and not isinstance(device, (str, int, torch.device)):
        C.fail(_FN, "device", "None, an int, a str or a torch.device", type(device).__name__, TypeError)
    try:
        dev = torch.device("cuda" if device is None else device)
    except (RuntimeError, ValueError) as exc:
        C.fail(_FN, "device", "a CUDA/ROCm device like 'cuda:0'", f"{device!r} ({exc})")
    if dev.type != "cuda":
        C.fail(_FN, "device", "a CUDA/ROCm device like 'cuda:0'", repr(device))
    if not torch.cuda.is_available():
        raise RuntimeError(f"{_FN}: device: expected a usable CUDA/ROCm device, got {device!r}, but torch "
                           f"sees none (torch.cuda.is_available() is False)")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if not 0 <= index < torch.cuda.device_count():
        C.fail(_FN, "device", f"a device index in [0, {torch.cuda.device_count()})", repr(device))
    return torch.device("cuda", index)


def warmup(shapes: Iterable[Sequence[int]], *, dtype: torch.dtype = torch.bfloat16,
           weight_dtype: Optional[torch.dtype] = None, width: int = 4, layout: str = "cf",
           bias: bool = True, activation: Optional[str] = "silu", seq_idx: bool = False,
           initial_states: bool = False, return_final_states: bool = False, backward: bool = False,
           device: Union[None, int, str, torch.device] = None) -> list[dict]:
    """Get ``causal_conv1d_fn`` calls of these (batch, dim, seqlen) shapes ready:
    make the dispatch decisions, compile the kernels (in parallel, through the
    compile cache) and load them on ``device`` (default: the current CUDA device),
    the fixed kernels of the calls plans fix too (channel-last, channel-first of
    width 5-8 or with seq_idx; docs/DISPATCH.md). Launches nothing and
    allocates no tensor.

    The calls are assumed to pass torch-allocated contiguous tensors of
    ``layout`` ("cf": x is (batch, dim, seqlen); "cl": x is a (batch, seqlen, dim)
    tensor viewed by ``.transpose(1, 2)``), x of ``dtype``, weight (and bias) of
    ``weight_dtype`` (None: ``dtype``), and the given features. A call that
    differs in any of these, or whose tensors are less aligned than a fresh
    allocation (e.g. a slice at an odd offset), may still do that work itself.
    Afterwards the warmed-up calls can be captured in a ``torch.cuda.CUDAGraph``.

    With ``backward=True`` the backward kernels of those calls (autograd's, or
    ``cc1d.causal_conv1d_bwd`` with a fresh dout) are made ready too, the fixed
    kernels of channel-last backward plans included.

    Returns one dict per shape, as ``cc1d.explain`` gives: the kernel picked and
    why; with ``backward=True`` one ``{"fwd": ..., "bwd": ...}`` pair of them.
    """
    shape_list = _check_shapes(shapes)
    dtype = _check_dtype("dtype", dtype, tuple(C.DTYPE_CODES))
    w_dtype = dtype if weight_dtype is None else _check_dtype("weight_dtype", weight_dtype,
                                                              tuple(dict.fromkeys((dtype, torch.float32))))
    width = _positive_int("width", width)
    if not 2 <= width <= C.MAX_WIDTH:
        C.fail(_FN, "width", f"an int in 2..{C.MAX_WIDTH}", width)
    if layout not in _LAYOUTS:
        C.fail(_FN, "layout", "'cf' (channel-first) or 'cl' (channel-last)", repr(layout))
    flags = {name: _check_bool(name, value) for name, value in
             (("bias", bias), ("seq_idx", seq_idx), ("initial_states", initial_states),
              ("return_final_states", return_final_states), ("backward", backward))}
    silu = C.check_activation(_FN, activation)
    dev = _check_device(device)

    calls, bwd_calls = [], []
    for b, d, n in shape_list:
        x = _activations(b, d, n, dtype, layout)
        # outputs laid out as causal_conv1d_fn allocates them (it goes by x's strides)
        out_layout = "cl" if _is_channel_last(x) else "cf"
        weight = _contiguous(d, width, dtype=w_dtype)
        bias_t = _contiguous(d, dtype=w_dtype) if flags["bias"] else None
        seq = _contiguous(b, n, dtype=torch.int32) if flags["seq_idx"] else None
        states = _contiguous(b, d, width - 1, dtype=dtype) if flags["initial_states"] else None
        calls.append(_fwd_call_args(
            x, weight, bias_t, seq, states,
            _activations(b, d, width - 1, dtype, out_layout) if flags["return_final_states"] else None,
            _activations(b, d, n, dtype, out_layout), silu, 0)[:6])  # all but the stream
        if flags["backward"]:
            bwd_calls.append(_bwd_call_args(
                x, weight, bias_t, seq, states, _activations(b, d, n, dtype, out_layout),
                _contiguous(b, d, width - 1, dtype=dtype) if flags["return_final_states"] else None,
                _activations(b, d, n, dtype, out_layout),
                _contiguous(b, d, width - 1, dtype=dtype) if states is not None else None,
                _contiguous(d, width, dtype=w_dtype), _contiguous(d, dtype=w_dtype) if bias_t is not None else None,
                None, silu))
    rt = runtime()
    with torch.cuda.device(dev):  # kernels load into the current context: make it dev's
        target = rt.device_target("hip" if torch.version.hip else "cuda", dev.index)
        sources = {rt.explain_fwd(*args, 0, target)["variant"]["source"] for args in calls}
        sources |= {rt.explain_bwd(*args, arch=target)["variant"]["source"] for args in bwd_calls}
        def compile_one(source: str) -> None:
            try:
                rt.compile(source, target)
            except rt.CompileError:
                pass  # prepare_* below: a tuned winner falls back (one warning), a catalog kernel raises

        if len(sources) > 1:  # compiles release the GIL; the loads below then hit the cache
            with ThreadPoolExecutor(min(len(sources), os.cpu_count() or 1)) as pool:
                list(pool.map(compile_one, sources))
        fwd = [rt.prepare_fwd(*args, device=dev.index) for args in calls]
        if not flags["backward"]:
            return fwd
        return [dict(fwd=f, bwd=rt.prepare_bwd(*args, device=dev.index)) for f, args in zip(fwd, bwd_calls)]
