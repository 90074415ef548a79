"""Dao-AILab causal-conv1d's public API (1.6), served by cc1d.

Every function here has the peer's name, argument names, order and defaults
(``cc1d.alias`` publishes them under the peer's module names). They import
torch only when called, so the names and signatures can be checked on a
machine without torch. The decode and varlen functions are looked up on
``cc1d`` at call time: they come from cc1d's update/varlen API.
"""
from __future__ import annotations

from typing import Any

# The peer release whose API this module reproduces; reported as causal_conv1d.__version__
# with a local tag, so version checks (>= 1.4, ...) pass and the origin stays visible.
PEER_VERSION = "1.6.0"

_ACTIVATIONS = (None, "silu", "swish")


def _cc1d_function(name: str) -> Any:
    import cc1d
    fn = getattr(cc1d, name, None)
    if fn is None:
        raise RuntimeError(f"causal_conv1d (cc1d alias): cc1d.{name} is not in this cc1d build "
                           f"(cc1d {cc1d.__version__}); upgrade cc1d")
    return fn


def _check_activation(fn: str, activation: Any) -> None:
    # The peer raises NotImplementedError for an unknown activation; callers may catch that.
    if activation not in _ACTIVATIONS:
        raise NotImplementedError(f"{fn}: activation: expected None, 'silu' or 'swish', got {activation!r}")


# ---- causal_conv1d.causal_conv1d_interface ----------------------------------------

def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    """x (batch, dim, seqlen), weight (dim, width): ``cc1d.causal_conv1d_fn`` (differentiable)."""
    _check_activation("causal_conv1d_fn", activation)
    from .ops import causal_conv1d_fn as fn
    return fn(x, weight, bias, seq_idx, initial_states, return_final_states, final_states_out, activation)


def causal_conv1d_ref(x, weight, bias=None, initial_states=None, return_final_states=False,
                      final_states_out=None, activation=None):
    """Plain-PyTorch reference of ``causal_conv1d_fn`` (``cc1d.causal_conv1d_ref``)."""
    _check_activation("causal_conv1d_ref", activation)
    from .reference import causal_conv1d_ref as ref
    return ref(x, weight, bias, initial_states, return_final_states, final_states_out, activation)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    """Decode step: x (batch, dim) or (batch, dim, seqlen); conv_state updated in place."""
    _check_activation("causal_conv1d_update", activation)
    return _cc1d_function("causal_conv1d_update")(x, conv_state, weight, bias, activation, cache_seqlens,
                                                  conv_state_indices)


def causal_conv1d_update_ref(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None):
    """Plain-PyTorch decode step with the peer's semantics: the window is the last
    width-1 state entries (or, with ``cache_seqlens``, the width-1 entries before
    position cache_seqlens % state_len of a circular buffer) followed by x;
    conv_state receives x (shifted in, or written at that position)."""
    _check_activation("causal_conv1d_update_ref", activation)
    import torch
    import torch.nn.functional as F

    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    state_len = conv_state.shape[-1]
    ctype = torch.promote_types(x.dtype, weight.dtype)
    if ctype in (torch.float16, torch.bfloat16):
        ctype = torch.float32
    if cache_seqlens is None:
        window = torch.cat([conv_state.to(ctype), x.to(ctype)], dim=-1)
        conv_state.copy_(window[..., -state_len:])
    else:
        start = cache_seqlens.to(torch.long)[:, None]
        before = (start + torch.arange(-(width - 1), 0, device=x.device)) % state_len
        history = conv_state.gather(2, before[:, None, :].expand(batch, dim, width - 1))
        window = torch.cat([history.to(ctype), x.to(ctype)], dim=-1)
        slots = (start + torch.arange(seqlen, device=x.device)) % state_len
        conv_state.scatter_(2, slots[:, None, :].expand(batch, dim, seqlen), x.to(conv_state.dtype))
    out = F.conv1d(window, weight.to(ctype).unsqueeze(1), None if bias is None else bias.to(ctype),
                   groups=dim)[..., -seqlen:]
    if activation is not None:
        out = F.silu(out)
    out = out.to(x.dtype)
    return out.squeeze(-1) if squeeze else out


# ---- causal_conv1d.causal_conv1d_varlen --------------------------------------------

def causal_conv1d_varlen_states(x, cu_seqlens, state_len):
    """x (total_tokens, dim), cu_seqlens (batch + 1): each sequence's last state_len
    tokens as (batch, dim, state_len) conv states (zero where a sequence is shorter)."""
    return _cc1d_function("causal_conv1d_varlen_states")(x, cu_seqlens, state_len)


def causal_conv1d_varlen_states_ref(x, cu_seqlens, state_len):
    """Plain-PyTorch ``causal_conv1d_varlen_states``."""
    import torch
    total, dim = x.shape
    batch = cu_seqlens.shape[0] - 1
    states = torch.zeros(batch, state_len, dim, dtype=x.dtype, device=x.device).transpose(1, 2)
    bounds = cu_seqlens.tolist()
    for i in range(batch):
        end = int(bounds[i + 1])
        n = min(end - int(bounds[i]), state_len)
        if n > 0:
            states[i, :, state_len - n:] = x[end - n:end].T
    return states


# ---- causal_conv1d.cpp_functions ----------------------------------------------------

def causal_conv1d_fwd_function(x, weight, bias, seq_idx, initial_states, final_states_out, silu_activation):
    """Forward without autograd; writes final_states_out when given; returns out."""
    import torch
    from .ops import causal_conv1d_fn as fn
    with torch.no_grad():
        res = fn(x, weight, bias, seq_idx, initial_states, final_states_out is not None, final_states_out,
                 "silu" if silu_activation else None)
    return res[0] if final_states_out is not None else res


def causal_conv1d_bwd_function(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx,
                               return_dinitial_states, silu_activation):
    """Returns (dx, dweight, dbias, dinitial_states) like the peer: dbias None without
    bias, dinitial_states None unless return_dinitial_states; dx written when given."""
    from .backward import causal_conv1d_bwd
    return causal_conv1d_bwd(x, weight, bias, dout, seq_idx, initial_states, dfinal_states, dx,
                             bool(return_dinitial_states), "silu" if silu_activation else None)


def causal_conv1d_update_function(x, conv_state, weight, bias, silu_activation, cache_seqlens,
                                  conv_state_indices):
    """Decode step (x (batch, dim, seqlen)); conv_state updated in place; returns out."""
    return _cc1d_function("causal_conv1d_update")(x, conv_state, weight, bias,
                                                  "silu" if silu_activation else None, cache_seqlens,
                                                  conv_state_indices)


def _make_autograd_fn() -> type:
    """The peer's ``CausalConv1dFn`` (forward takes ``activation``, a string): cc1d's
    autograd function behind the peer's argument list. Built on first use (needs torch)."""
    from . import backward, ops

    class CausalConv1dFn(backward.CausalConv1dFn):
        @staticmethod
        def forward(ctx, x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                    final_states_out=None, activation=None):
            _check_activation("CausalConv1dFn", activation)
            silu = ops._validate(x, weight, bias, seq_idx, initial_states, final_states_out, activation)
            return backward.CausalConv1dFn.forward(ctx, x, weight, bias, seq_idx, initial_states,
                                                   return_final_states, final_states_out, silu)

    CausalConv1dFn.__module__ = "causal_conv1d.causal_conv1d_interface"
    return CausalConv1dFn


_autograd_fn: type | None = None


def autograd_fn() -> type:
    global _autograd_fn
    if _autograd_fn is None:
        _autograd_fn = _make_autograd_fn()
    return _autograd_fn
