"""Argument checks for the PyTorch API: each error names the argument, what was
expected and what was given."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
MAX_WIDTH = 8


def fail(fn: str, arg: str, expected: str, got: object, kind: type = ValueError) -> None:
    raise kind(f"{fn}: {arg}: expected {expected}, got {got}")


def check_tensor(fn: str, arg: str, t: object, ndim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        fail(fn, arg, "a torch.Tensor", type(t).__name__, TypeError)
    if t.dim() != ndim:
        fail(fn, arg, f"a {ndim}-D tensor", f"shape {tuple(t.shape)}")
    return t


def check_shape(fn: str, arg: str, t: torch.Tensor, shape: Sequence[int], names: str) -> None:
    if tuple(t.shape) != tuple(shape):
        fail(fn, arg, f"shape ({names}) = {tuple(shape)}", f"{tuple(t.shape)}")


def check_device(fn: str, arg: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        fail(fn, arg, f"a tensor on {device} (x's device)", f"a tensor on {t.device}")


def check_float_dtype(fn: str, arg: str, t: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        fail(fn, arg, f"dtype in ({names})", str(t.dtype).replace("torch.", ""), TypeError)


def check_activation(fn: str, activation: Optional[str]) -> bool:
    """True for SiLU."""
    if activation not in (None, "silu", "swish"):
        fail(fn, "activation", "None, 'silu' or 'swish'", repr(activation))
    return activation is not None
