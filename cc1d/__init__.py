"""cc1d: autotuned causal depthwise conv1d kernels for AMD and NVIDIA GPUs.

The PyTorch API (``causal_conv1d_fn``, ``causal_conv1d_ref``) imports torch
lazily, so ``import cc1d`` works on machines without torch (the generator,
the tuner's CPU parts and the runtime's compile path need none).
"""
from __future__ import annotations

import importlib
import os
from typing import Any

__version__ = "0.1.0"

_TORCH_API = {
    "causal_conv1d_fn": "cc1d.ops",
    "causal_conv1d_bwd": "cc1d.backward",
    "CausalConv1dFn": "cc1d.backward",
    "causal_conv1d_ref": "cc1d.reference",
    "causal_conv1d_varlen_fn": "cc1d.varlen",
    "causal_conv1d_varlen_states": "cc1d.varlen",
    "causal_conv1d_varlen_ref": "cc1d.reference",
    "causal_conv1d_varlen_states_ref": "cc1d.reference",
    "explain": "cc1d.ops",
    "explain_bwd": "cc1d.backward",
    "warmup": "cc1d._warmup",
    "causal_conv1d_fwd": "cc1d.aiter",
    "causal_conv1d_update": "cc1d.update",
    "causal_conv1d_update_ref": "cc1d.reference",
    "explain_update": "cc1d.update",
    "explain_varlen": "cc1d.varlen",
    "warmup_update": "cc1d.update",
}

__all__ = [*_TORCH_API, "set_tuning_db", "dispatch_stats", "install_causal_conv1d_alias",
           "uninstall_causal_conv1d_alias", "__version__"]


def install_causal_conv1d_alias():
    """Make ``import causal_conv1d`` (and causal_conv1d.causal_conv1d_interface,
    .causal_conv1d_varlen, .cpp_functions) resolve to cc1d, with the peer's names and
    signatures; returns the causal_conv1d module. Also: ``CC1D_AS_CAUSAL_CONV1D=1``
    (installed at ``import cc1d``) or ``python -m cc1d.alias SCRIPT``. See cc1d.alias."""
    from .alias import install_causal_conv1d_alias as install
    return install()


def uninstall_causal_conv1d_alias() -> None:
    """Undo ``install_causal_conv1d_alias``."""
    from .alias import uninstall_causal_conv1d_alias as uninstall
    uninstall()


def set_tuning_db(*paths: "str | os.PathLike[str]") -> None:
    """Tuning DB files the dispatcher searches first, in this order (before
    ``CC1D_TUNING_DB``, the user's DB in the cache dir and the shipped one).
    Replaces the previous list; no argument clears it. A file that is missing or
    unreadable is skipped with one warning."""
    from ._runtime import runtime
    runtime().set_tuning_dbs([os.fspath(p) for p in paths])


def dispatch_stats() -> dict[str, int]:
    """Process-wide counters: ``decisions`` (dispatch decisions computed, i.e. memo
    misses) and ``loads`` (kernels loaded into a GPU context). A call that adds to
    either did work that a CUDA-graph capture cannot hold: ``cc1d.warmup`` it first.
    Also ``compiles`` (compiler invocations: misses of both the in-memory and the
    disk compile cache) and ``corrupt_cache_files`` (disk-cache files that failed
    their hash check and were rebuilt)."""
    from ._runtime import runtime
    return dict(runtime().dispatch_stats())


def __getattr__(name: str) -> Any:
    module = _TORCH_API.get(name)
    if module is None:
        raise AttributeError(f"module 'cc1d' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function (a microsecond per call)
    return value


if os.environ.get("CC1D_AS_CAUSAL_CONV1D"):
    from .alias import install_from_environment as _install_from_environment
    _install_from_environment()
