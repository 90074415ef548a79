"""Candidate validation: fresh random data, NaN-poisoned outputs, a float64
reference, and a relative L2 tolerance per x dtype. A wrong kernel never wins."""
from __future__ import annotations

from typing import Any

# relative L2 error allowed per x dtype (the output is rounded to it)
TOLERANCE = {"f32": 2e-5, "f16": 3e-3, "bf16": 2e-2}


def compare(got: dict[str, Any], want: dict[str, Any], x_dtype: str) -> str | None:
    """None when every output matches, else why not (NaN = an element never written)."""
    import torch
    for name, ref in want.items():
        out = got[name]
        if tuple(out.shape) != tuple(ref.shape):
            return f"{name}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
        n_nan = int(torch.isnan(out).sum())
        if n_nan:
            return f"{name}: {n_nan} of {out.numel()} elements NaN (unwritten or invalid)"
        diff = torch.linalg.vector_norm(out.double() - ref)
        err = float(diff / torch.linalg.vector_norm(ref).clamp_min(1e-30))
        if not err <= TOLERANCE[x_dtype]:
            return f"{name}: relative L2 error {err:.3e} > {TOLERANCE[x_dtype]:g} ({x_dtype})"
    return None


def validate(problem: Any, shape: Any, launch: Any, seed: int, device: str = "cuda") -> str | None:
    """Run `launch(inputs, outputs)` once on fresh data; None if right, else the reason."""
    import torch
    inputs = problem.make_inputs(shape, seed=seed, device=device)
    outputs = problem.make_outputs(shape, inputs)
    launch(inputs, outputs)
    torch.cuda.synchronize()
    return compare(outputs, problem.reference(shape, inputs), shape.x_dtype)
