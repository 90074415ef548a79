"""cc1d.aiter.causal_conv1d_fwd's argument errors, on the CPU: each names the argument, what
was expected and what was given, whether or not an earlier call planned the signature."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cc1d.aiter import causal_conv1d_fwd  # noqa: E402


def _args(dim=6, seqlen=9):
    x = torch.randn(2, dim, seqlen)
    return torch.empty_like(x), x, torch.randn(dim, 4), torch.randn(dim)


def test_out_must_be_a_tensor_of_xs_shape_and_dtype():
    out, x, w, b = _args()
    with pytest.raises(TypeError, match="causal_conv1d_fwd: out: expected a torch.Tensor, got list"):
        causal_conv1d_fwd([], x, w, b, True)
    with pytest.raises(ValueError, match=r"out: expected shape \(batch, dim, seqlen\) = \(2, 6, 9\), got \(2, 6, 8\)"):
        causal_conv1d_fwd(out[:, :, :8], x, w, b, True)
    with pytest.raises(TypeError, match="out: expected x's dtype float32, got float16"):
        causal_conv1d_fwd(out.half(), x, w, b, True)


def test_x_must_be_on_a_gpu():
    out, x, w, b = _args()
    for bias in (b, None, torch.empty(0)):
        with pytest.raises(ValueError, match="causal_conv1d_fwd: x: expected a CUDA/ROCm tensor, got a tensor on cpu"):
            causal_conv1d_fwd(out, x, w, bias, False)
