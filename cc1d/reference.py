"""Reference causal conv1d in plain PyTorch: the semantics every kernel must match.

Same names and argument order as Dao-AILab causal-conv1d's
``causal_conv1d_ref``; ``seq_idx`` is an extra keyword. Pass float64 tensors
for a float64 reference.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def causal_conv1d_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                      initial_states: Optional[torch.Tensor] = None,
                      return_final_states: bool = False,
                      final_states_out: Optional[torch.Tensor] = None,
                      activation: Optional[str] = None,
                      seq_idx: Optional[torch.Tensor] = None):
    """out[b,c,t] = act(bias[c] + sum_k weight[c,k] * x[b,c,t-(W-1)+k]).

    x[.., t<0] comes from ``initial_states`` (else zero). With ``seq_idx``,
    only taps of the output's own sequence count, positions before t=0 belong
    to the row's first sequence, and padding tokens (seq_idx < 0) output 0.
    """
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation: expected None, 'silu' or 'swish', got {activation!r}")
    dtype_in = x.dtype
    ctype = torch.promote_types(x.dtype, weight.dtype)
    if ctype in (torch.float16, torch.bfloat16):
        ctype = torch.float32
    batch, dim, seqlen = x.shape
    width = weight.shape[1]
    xc = x.to(ctype)
    if initial_states is not None:
        xpad = torch.cat([initial_states.to(ctype), xc], dim=-1)
    else:
        xpad = F.pad(xc, (width - 1, 0))
    w = weight.to(ctype)
    out = torch.zeros(batch, dim, seqlen, dtype=ctype, device=x.device)
    if bias is not None:
        out += bias.to(ctype)[None, :, None]
    if seq_idx is not None:
        sid = seq_idx.to(torch.int64)
        sid_pad = torch.cat([sid[:, :1].expand(batch, width - 1), sid], dim=-1)
    for k in range(width):
        tap = w[None, :, k, None] * xpad[:, :, k:k + seqlen]
        if seq_idx is not None:
            tap = tap * (sid_pad[:, None, k:k + seqlen] == sid[:, None, :]).to(ctype)
        out = out + tap
    if activation is not None:
        out = F.silu(out)
    if seq_idx is not None:
        out = out.masked_fill(seq_idx[:, None, :] < 0, 0)
    out = out.to(dtype_in)
    if not return_final_states:
        return out
    final = xpad[:, :, -(width - 1):].to(dtype_in)
    if final_states_out is not None:
        final_states_out.copy_(final)
        final = final_states_out
    return out, final


def causal_conv1d_varlen_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                             cu_seqlens: torch.Tensor, conv_states: Optional[torch.Tensor] = None,
                             cache_indices: Optional[torch.Tensor] = None,
                             has_initial_state: Optional[torch.Tensor] = None,
                             activation: Optional[str] = None, pad_slot_id: int = -1):
    """The varlen prefill, one sequence at a time through ``causal_conv1d_ref``.

    x (dim, total_tokens). Returns (out, new_conv_states): new_conv_states is a
    copy of conv_states (None if None) with every non-padded sequence's row set to
    the last state_len inputs of (the row's old columns if has_initial_state, else
    zeros, then its tokens); padded sequences (row == pad_slot_id, negative or >=
    pool) output zeros. conv_states itself is not modified.
    """
    dim, total = x.shape
    width = weight.shape[1]
    cu = [int(v) for v in cu_seqlens.tolist()]
    out = torch.zeros_like(x)
    new_states = None if conv_states is None else conv_states.clone()
    for i in range(len(cu) - 1):
        a, b = cu[i], cu[i + 1]
        row = i if cache_indices is None else int(cache_indices[i])
        has_init = has_initial_state is not None and bool(has_initial_state[i])
        if conv_states is not None and (row == pad_slot_id or row < 0 or row >= conv_states.shape[0]):
            continue  # padded: zero output, no state
        old = None
        if conv_states is not None:
            old = conv_states[row] if has_init else torch.zeros_like(conv_states[row])
        if b > a:
            init = None if old is None else old[None, :, old.shape[1] - (width - 1):]
            out[:, a:b] = causal_conv1d_ref(x[None, :, a:b], weight, bias, initial_states=init,
                                            activation=activation)[0]
        if new_states is not None:
            ext = torch.cat([old, x[:, a:b].to(old.dtype)], dim=1)
            new_states[row] = ext[:, ext.shape[1] - old.shape[1]:]
    return out, new_states


def causal_conv1d_varlen_states_ref(x: torch.Tensor, cu_seqlens: torch.Tensor, state_len: int) -> torch.Tensor:
    """x (total_tokens, dim) -> (batch, dim, state_len): each sequence's last state_len
    tokens, zero-padded in front."""
    cu = [int(v) for v in cu_seqlens.tolist()]
    states = torch.zeros(len(cu) - 1, x.shape[1], state_len, dtype=x.dtype, device=x.device)
    for i in range(len(cu) - 1):
        a, b = cu[i], cu[i + 1]
        n = min(state_len, b - a)
        if n > 0:
            states[i, :, state_len - n:] = x[b - n:b].t()
    return states
def causal_conv1d_update_ref(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                             bias: Optional[torch.Tensor] = None, activation=None,
                             cache_seqlens: Optional[torch.Tensor] = None,
                             conv_state_indices: Optional[torch.Tensor] = None,
                             num_accepted_tokens: Optional[torch.Tensor] = None,
                             pad_slot_id: int = -1, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The semantics of ``cc1d.causal_conv1d_update``, row by row in batch order (so rows
    naming one slot see each other's updates). Outputs are computed in the promoted dtype
    of x and weight (float64 weights give a float64 reference) and returned in x's dtype;
    conv_state is updated in place with copies of its own and x's elements. ``out_dtype``:
    return the outputs in this dtype instead of x's (float64 keeps the reference's precision)."""
    silu = activation is True or activation in ("silu", "swish")
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(-1) if squeeze else x
    batch, dim, seqlen = x3.shape
    width = weight.shape[1]
    pool, _, state_len = conv_state.shape
    ctype = torch.promote_types(x.dtype, weight.dtype)
    if ctype in (torch.float16, torch.bfloat16):
        ctype = torch.float32
    w = weight.to(ctype)
    out = torch.zeros(batch, dim, seqlen, dtype=ctype, device=x.device)
    for b in range(batch):
        slot = int(conv_state_indices[b]) if conv_state_indices is not None else b
        if conv_state_indices is not None and (slot == pad_slot_id or slot < 0 or slot >= pool):
            continue  # padded row: zero output, no state
        st = conv_state[slot]
        xb = x3[b].to(conv_state.dtype)
        if cache_seqlens is not None:
            head = int(cache_seqlens[b]) % state_len
            idx = [(head - (width - 1) + k) % state_len for k in range(width - 1)]
            window = st[:, idx]
        elif num_accepted_tokens is not None:
            a = min(max(int(num_accepted_tokens[b]), 1), min(seqlen, state_len - width + 2))
            window = st[:, a - 1:a - 1 + width - 1]
            shift = a
        else:
            window = st[:, state_len - (width - 1):]
            shift = seqlen
        seq = torch.cat([window, xb], dim=-1).to(ctype)
        acc = torch.zeros(dim, seqlen, dtype=ctype, device=x.device)
        if bias is not None:
            acc += bias.to(ctype)[:, None]
        for k in range(width):
            acc = acc + w[:, k, None] * seq[:, k:k + seqlen]
        out[b] = acc
        if cache_seqlens is not None:
            for t in range(max(0, seqlen - state_len), seqlen):
                st[:, (head + t) % state_len] = xb[:, t]
        else:
            kept = st[:, shift:shift + max(state_len - seqlen, 0)]
            st.copy_(torch.cat([kept, xb], dim=-1)[:, -state_len:])
    if silu:
        out = F.silu(out)
    # padded rows stay exactly 0 (silu(0) = 0)
    out = out.to(out_dtype or x.dtype)
    return out.squeeze(-1) if squeeze else out
