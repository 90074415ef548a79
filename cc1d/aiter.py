"""AMD aiter-style entry point: ``causal_conv1d_fwd(out, x, weight, bias, use_silu)``.

Writes the causal conv1d of x into the caller's ``out`` (same shape and dtype as
x) and returns None; ``bias`` may be None or an empty tensor (no bias). Lives at
``cc1d.aiter.causal_conv1d_fwd`` (``cc1d.causal_conv1d_fwd`` is the same function;
the torch custom op of that name is ``torch.ops.cc1d.causal_conv1d_fwd``).
"""
from __future__ import annotations

import torch

from . import _checks as C
from . import ops

_FN = "causal_conv1d_fwd"


# Plans for calls that write out directly (out laid out like x), by x's forward memo key
# and out's signature: the runtime's launchers for out's own strides (``launch[silu]``),
# which run the plan's fixed kernel where plans fix one (the kernel the tuner ranked), as
# causal_conv1d_fn's calls do. Only checked calls add one.
_DIRECT_PLANS: dict = {}


def _direct_plan(x, weight, bias, out) -> tuple:
    """The runtime's two launchers (without / with SiLU) for a checked call whose out is
    laid out like x, built from the call's metadata (its pointers are the launch's)."""
    _, sizes, strides, x_dtype, w_dtype, _, _ = ops._fwd_call_args(x, weight, bias, None, None, None, out,
                                                                   False, 0)
    return ops._fwd_launchers(sizes, strides, x_dtype, w_dtype)


def _writes_directly(out: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether the kernel can write out itself: laid out like x, and one of x's inner strides is 1."""
    inner = ops._inner_strides(x)
    return ops._inner_strides(out) == inner and 1 in inner[1:]


def causal_conv1d_fwd(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias, use_silu: bool) -> None:
    silu = bool(use_silu)
    if isinstance(bias, torch.Tensor) and bias.numel() == 0:
        bias = None
    try:
        key = (ops._fwd_key(x, weight, bias, None, None, None, False), ops._sig(out))
        launch = _DIRECT_PLANS.get(key)
    except Exception:  # not tensors, or metadata that does not hash: the checks say what is wrong
        key = launch = None
    if launch is None:
        C.check_tensor(_FN, "out", out, 3)
        C.check_tensor(_FN, "x", x, 3)
        C.check_shape(_FN, "out", out, tuple(x.shape), "batch, dim, seqlen")
        C.check_device(_FN, "out", out, x.device)
        if out.dtype != x.dtype:
            C.fail(_FN, "out", f"x's dtype {str(x.dtype).replace('torch.', '')}",
                   str(out.dtype).replace("torch.", ""), TypeError)
        ops._validate(x, weight, bias, None, None, None, "silu" if silu else None, fn=_FN)
        if _writes_directly(out, x):
            launch = ops._remember(_DIRECT_PLANS, key, _direct_plan(x, weight, bias, out))
    if launch is not None and not _overlaps(out, x):
        # out laid out like x: the kernel writes it directly
        ptrs = (x.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(), 0, 0, out.data_ptr(), 0)
        ops._launch_planned(launch[silu], x.device.index, ptrs)
    else:
        # another layout, or out overlapping x (the kernel must not race its own input): a copy
        out.copy_(ops._forward_via_plan(x, weight, bias, None, None, None, silu))


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' memory ranges intersect (an in-place call must not race the kernel)."""
    def span(t):
        start = t.data_ptr()
        return start, start + t.element_size() * (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())))
    a0, a1 = span(a)
    b0, b1 = span(b)
    return a0 < b1 and b0 < a1
