"""The peers the benchmarks time cc1d against, loaded where installed."""
from __future__ import annotations

import importlib
import importlib.metadata
from typing import Callable


def causal_conv1d(name: str) -> Callable | None:
    """Dao-AILab causal-conv1d's `name` (causal_conv1d_fn, causal_conv1d_update), or
    None where the package, or that name in it, is not installed."""
    try:
        return getattr(importlib.import_module("causal_conv1d"), name)
    except (ImportError, AttributeError):
        return None


def _causal_conv1d_bwd_raw() -> Callable | None:
    """causal-conv1d's backward as its autograd Function calls it: (x, w, b, dout, seq_idx,
    initial_states, dfinal_states, dx, return_dinitial_states, silu) -> (dx, dw, db, dinit);
    None where it is not installed."""
    try:
        from causal_conv1d.cpp_functions import causal_conv1d_bwd_function  # 1.6
        return causal_conv1d_bwd_function
    except ImportError:
        pass
    try:
        import causal_conv1d_cuda  # before 1.6 the extension had this signature itself
        return causal_conv1d_cuda.causal_conv1d_bwd
    except ImportError:
        return None


def causal_conv1d_bwd() -> Callable | None:
    """causal-conv1d's backward as bwd(x, weight, bias, dout, seq_idx=None, silu=True) ->
    (dx, dweight, dbias, dinitial_states): its autograd Function's call with no initial or
    final states and dx allocated by it; None where it is not installed."""
    raw = _causal_conv1d_bwd_raw()
    if raw is None:
        return None

    def bwd(x, weight, bias, dout, seq_idx=None, silu=True):
        return raw(x, weight, bias, dout, seq_idx, None, None, None, False, silu)
    return bwd


def causal_conv1d_version() -> str | None:
    """The installed causal-conv1d's version (the benchmarks' JSON records it), or None."""
    try:
        return importlib.metadata.version("causal_conv1d")
    except importlib.metadata.PackageNotFoundError:
        return None


def vllm_update(path: str | None) -> Callable | None:
    """vLLM's Triton decode update (``causal_conv1d_update`` of the file
    vllm/model_executor/layers/mamba/ops/causal_conv1d.py, from a vLLM source tree
    or sdist, at `path`), loaded without the rest of vLLM: the few names the file
    imports from it are given here as vLLM defines them (PAD_SLOT_ID -1, NULL_BLOCK_ID
    0; programmatic dependent launch on compute capability 9 and above, as vLLM's
    CUDA platform decides). None when `path` is None."""
    if path is None:
        return None
    import importlib.util
    import sys
    import types

    import torch
    import triton
    import triton.language as tl

    class _Platform:
        @staticmethod
        def is_arch_support_pdl() -> bool:
            return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9

        @staticmethod
        def is_cpu() -> bool:
            return False

    stubs = {
        "vllm": {},
        "vllm.platforms": {"current_platform": _Platform()},
        "vllm.triton_utils": {"tl": tl, "triton": triton},
        "vllm.v1": {},
        "vllm.v1.attention": {},
        "vllm.v1.attention.backends": {},
        "vllm.v1.attention.backends.utils": {"PAD_SLOT_ID": -1, "NULL_BLOCK_ID": 0},
    }
    for name, attrs in stubs.items():
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__dict__.update(attrs)
            sys.modules[name] = module
    spec = importlib.util.spec_from_file_location("vllm_causal_conv1d_peer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.causal_conv1d_update
