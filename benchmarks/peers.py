"""The peers the benchmarks time cc1d against, loaded where installed."""
from __future__ import annotations

import importlib
from typing import Callable


def causal_conv1d(name: str) -> Callable | None:
    """Dao-AILab causal-conv1d's `name` (causal_conv1d_fn, causal_conv1d_update), or
    None where the package, or that name in it, is not installed."""
    try:
        return getattr(importlib.import_module("causal_conv1d"), name)
    except (ImportError, AttributeError):
        return None
