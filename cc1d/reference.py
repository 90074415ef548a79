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
