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


def causal_conv1d_fwd(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias, use_silu: bool) -> None:
    C.check_tensor(_FN, "out", out, 3)
    C.check_tensor(_FN, "x", x, 3)
    C.check_shape(_FN, "out", out, tuple(x.shape), "batch, dim, seqlen")
    C.check_device(_FN, "out", out, x.device)
    if out.dtype != x.dtype:
        C.fail(_FN, "out", f"x's dtype {str(x.dtype).replace('torch.', '')}",
               str(out.dtype).replace("torch.", ""), TypeError)
    if bias is not None and bias.numel() == 0:
        bias = None
    silu = ops._validate(x, weight, bias, None, None, None, "silu" if use_silu else None)
    _, xd, xl = ops._inner_strides(x)
    if ops._inner_strides(out) == ops._inner_strides(x) and 1 in (xd, xl) and not _overlaps(out, x):
        # out laid out like x: the kernel writes it directly
        with torch.cuda.device(x.device):
            ops._launch(x, weight, bias, None, None, None, out, silu)
    else:
        out.copy_(ops._forward_impl(x, weight, bias, None, None, None, silu))


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' memory ranges intersect (an in-place call must not race the kernel)."""
    def span(t):
        start = t.data_ptr()
        return start, start + t.element_size() * (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())))
    a0, a1 = span(a)
    b0, b1 = span(b)
    return a0 < b1 and b0 < a1
