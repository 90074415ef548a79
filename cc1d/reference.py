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
