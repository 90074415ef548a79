"""The tuner's problems draw their large tensors (x, and the backward's dout) on the device
that uses them, each from its own seeded generator (tuner/problems.py _randn): the same
seed gives the same inputs, another seed others, in the shape's dtype and layout, and x
shares no stream with the weights. Here on the CPU; the tuner's gpu tests draw them on the
GPU."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cc1d.tuner.problems import BwdProblem, FwdProblem, VarlenProblem  # noqa: E402
from cc1d.tuner.shapes import Shape  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
CASES = [(problem, layout, x_dtype) for problem in (FwdProblem, BwdProblem, VarlenProblem)
         for layout in ("cf", "cl") for x_dtype in ("bf16", "f32")]


def _large(problem, inputs) -> dict:
    return {k: inputs[k] for k in (("x", "dout") if problem is BwdProblem else ("x",))}


@pytest.mark.parametrize("problem,layout,x_dtype", CASES)
def test_large_inputs_are_seeded_typed_and_laid_out_as_the_shape_says(problem, layout, x_dtype):
    op = {FwdProblem: "fwd", BwdProblem: "bwd", VarlenProblem: "vfwd"}[problem]
    shape = Shape(op, layout, x_dtype, "f32", 4, 3, 136, 77)
    p = problem()
    first, again, other = (_large(problem, p.make_inputs(shape, seed=s, device="cpu")) for s in (5, 5, 6))
    for name, t in first.items():
        assert t.dtype == DTYPES[x_dtype] and t.device.type == "cpu", name
        # the layout: channel-last tensors are (…, seqlen, dim) memory viewed channel-first
        assert (t.stride(-2) == 1) == (layout == "cl"), (name, t.stride())
        assert torch.equal(t, again[name]), name                  # the seed decides the values
        assert not torch.equal(t, other[name]), name              # another seed, others
        flat = t.double().flatten()
        assert 0.8 < float(flat.std()) < 1.2 and abs(float(flat.mean())) < 0.1, name  # standard normal
    if problem is BwdProblem:  # x and dout: two streams, not one tensor twice
        assert not torch.equal(first["x"], first["dout"])


def test_x_shares_no_stream_with_the_weights():
    """The weights (drawn by the CPU generator of the same seed) are no scaled copy of x's
    first samples."""
    shape = Shape("fwd", "cf", "f32", "f32", 4, 1, 64, 256)
    inputs = FwdProblem().make_inputs(shape, seed=3, device="cpu")
    w = (inputs["weight"] * 4 ** 0.5).flatten()
    head = inputs["x"].flatten()[: w.numel()]
    assert not torch.allclose(w, head)


@pytest.mark.parametrize("layout,dims", [("cf", (4, 136, 5120)), ("cl", (8, 136, 4096))])
def test_backward_workspace_holds_the_partials_of_every_variant_of_the_layout(layout, dims):
    """The tuner times any variant of the layout's space on one set of outputs: its
    workspace must hold splits x dim x (width + 1) partials for the variant with the most
    splits (the widest channel tile, the shortest tile_l, the most split_blocks), counted
    with the runtime's rule (bwd_splits) from each valid variant's own geometry."""
    from cc1d.generator import variants
    from cc1d.tuner.problems import bwd_splits
    batch, seqlen, dim = dims
    shape = Shape("bwd", layout, "bf16", "f32", 4, batch, dim, seqlen)
    outputs = BwdProblem().make_outputs(shape, BwdProblem().make_inputs(shape, seed=1, device="cpu"))
    most = max(bwd_splits(shape, g["tile_l"], g["tile_d"], g["split_blocks"])
               for g in (v.geometry() for v in variants(shape.family())))
    assert outputs["workspace"].numel() >= most * dim * (shape.width + 1)
