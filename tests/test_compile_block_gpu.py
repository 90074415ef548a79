"""torch.compile(fullgraph=True) of a Mamba-like block (in-projection, cc1d causal
conv, SiLU gate, out-projection) trains: forward, backward and optimizer steps in
one graph with the cc1d op inside it, matching eager cc1d and a float64 block whose
conv is torch's own (marker: gpu)."""
from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

import cc1d  # noqa: E402

from fwd_cases import rel_l2  # noqa: E402

pytestmark = pytest.mark.gpu


class MambaLikeBlock(torch.nn.Module):
    """u (batch, seqlen, d_model) -> in_proj -> causal conv + SiLU on half -> gate by SiLU(other half) -> out_proj."""

    def __init__(self, d_model: int, d_inner: int, width: int, layout: str, torch_conv: bool = False) -> None:
        super().__init__()
        self.in_proj = torch.nn.Linear(d_model, 2 * d_inner)
        self.conv_weight = torch.nn.Parameter(torch.randn(d_inner, width) / width ** 0.5)
        self.conv_bias = torch.nn.Parameter(torch.randn(d_inner) * 0.1)
        self.out_proj = torch.nn.Linear(d_inner, d_model)
        self.layout = layout
        self.torch_conv = torch_conv

    def conv(self, x: torch.Tensor) -> torch.Tensor:
        if self.torch_conv:  # the float64 reference: torch's grouped conv, padded on the left
            width = self.conv_weight.shape[1]
            y = F.conv1d(F.pad(x, (width - 1, 0)), self.conv_weight.unsqueeze(1), self.conv_bias,
                         groups=x.shape[1])
            return F.silu(y)
        return cc1d.causal_conv1d_fn(x, self.conv_weight, self.conv_bias, activation="silu")

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        x, z = self.in_proj(u).chunk(2, dim=-1)
        x = x.transpose(1, 2)  # (batch, d_inner, seqlen): a channel-last slice of the projection
        if self.layout == "cf":
            x = x.contiguous()
        y = self.conv(x).transpose(1, 2) * F.silu(z)
        return self.out_proj(y)


@pytest.mark.parametrize("layout", ["cl", "cf"])
def test_compiled_block_trains_like_eager(layout):
    torch.manual_seed(0)
    batch, seqlen, d_model, d_inner, width = 2, 301, 48, 136, 4
    base = MambaLikeBlock(d_model, d_inner, width, layout).cuda()
    data = [(torch.randn(batch, seqlen, d_model, device="cuda"), torch.randn(batch, seqlen, d_model, device="cuda"))
            for _ in range(4)]

    graphs = []

    def recording_backend(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx
        graphs.append(gm)
        return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    runs = {}
    for name in ("eager", "compiled", "float64"):
        block = copy.deepcopy(base)
        if name == "float64":
            block = block.double()
            block.torch_conv = True
        opt = torch.optim.SGD(block.parameters(), lr=0.05)
        forward = torch.compile(block, fullgraph=True, backend=recording_backend) if name == "compiled" else block
        losses = []
        for u, target in data:
            if name == "float64":
                u, target = u.double(), target.double()
            opt.zero_grad(set_to_none=True)
            loss = ((forward(u) - target) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        runs[name] = (torch.stack(losses), {k: p.detach().clone() for k, p in block.named_parameters()},
                      {k: p.grad.detach().clone() for k, p in block.named_parameters()})

    # one graph (fullgraph would raise on a break), with the cc1d op inside it
    assert len(graphs) == 1, f"{len(graphs)} graphs"
    targets = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert any("cc1d.causal_conv1d_fwd" in t for t in targets), sorted(targets)
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])

    for got_name, want_name, tol in (("compiled", "eager", 1e-5), ("eager", "float64", 1e-4)):
        got_losses, got_params, got_grads = runs[got_name]
        want_losses, want_params, want_grads = runs[want_name]
        assert not any(torch.isnan(t).any() for t in (*got_params.values(), *got_grads.values()))
        assert rel_l2(got_losses, want_losses) < tol, (got_name, got_losses, want_losses)
        for k in want_params:
            assert rel_l2(got_params[k], want_params[k]) < tol, (got_name, "param", k)
            # the last step's gradients: small differences in the earlier steps' weights show more here
            assert rel_l2(got_grads[k], want_grads[k]) < 10 * tol, (got_name, "grad", k)
    # the losses moved: the steps really trained
    assert runs["eager"][0][-1] != runs["eager"][0][0]
