"""Stand-ins for buffers that a call would have, without allocating them."""
from __future__ import annotations

from typing import Any, Optional


class PlannedBuffer:
    """A buffer's strides and an address, all that the runtime's argument builders read
    (data_ptr(), stride(), and shape/dtype where given): for deciding or explaining a call
    without its buffers. Each slot is its own 256-byte-aligned address range, far below
    real allocations, so the runtime's overlap checks see distinct buffers."""

    def __init__(self, strides, slot: int, shape=None, dtype: Optional[Any] = None) -> None:
        self.shape = None if shape is None else tuple(shape)
        self.dtype = dtype
        self._stride = tuple(strides)
        self._address = 256 + slot * (1 << 40)

    def data_ptr(self) -> int:
        return self._address

    def stride(self, dim: Optional[int] = None):
        return self._stride if dim is None else self._stride[dim]
