"""Minimal PyTorch use of cc1d: a Mamba-style causal conv on the GPU, checked
against the reference. Run: python examples/forward.py"""
import torch

import cc1d

batch, dim, seqlen, width = 2, 1024, 4096, 4
x = torch.randn(batch, dim, seqlen, device="cuda", dtype=torch.bfloat16)
weight = torch.randn(dim, width, device="cuda", dtype=torch.float32)
bias = torch.randn(dim, device="cuda", dtype=torch.float32)

out = cc1d.causal_conv1d_fn(x, weight, bias, activation="silu")
ref = cc1d.causal_conv1d_ref(x.double(), weight.double(), bias.double(), activation="silu")
err = (out.double() - ref).norm() / ref.norm()
print(f"out {tuple(out.shape)} {out.dtype}; relative L2 error vs float64 reference: {err:.2e}")

# Channel-last input (a (batch, seqlen, dim) tensor viewed as (batch, dim, seqlen)) keeps its layout:
x_cl = torch.randn(batch, seqlen, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
out_cl, final_states = cc1d.causal_conv1d_fn(x_cl, weight, bias, activation="silu",
                                             return_final_states=True)
print(f"channel-last out strides {out_cl.stride()}, final_states {tuple(final_states.shape)}")
