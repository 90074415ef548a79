"""FwdProblem.shape_plan_options and BwdProblem.shape_plan_options (what `db rerender`
compares a forward or backward winner's fixed kernel with) give the options plan_options
gives for the buffers the tuner times: real CPU buffers from make_inputs/make_outputs,
every layout and optional input."""
from __future__ import annotations

import itertools

import pytest

pytest.importorskip("torch")

from cc1d.tuner.problems import BwdProblem, FwdProblem  # noqa: E402
from cc1d.tuner.shapes import Shape  # noqa: E402


@pytest.fixture(scope="module")
def rt():
    try:
        from cc1d._runtime import runtime
        return runtime()
    except (ImportError, RuntimeError) as exc:
        pytest.skip(f"runtime not usable here: {str(exc).splitlines()[0]}")


FEATURES = [dict(), dict(bias=False), dict(seq_idx=True), dict(initial_states=True),
            dict(final_states=True), dict(initial_states=True, final_states=True, activation="none")]


# Per op: its problem, the widths tried, and which calls run fixed kernels (where the
# options are not None): channel-last, and channel-first forwards from width 5 or with
# seq_idx; channel-last backwards.
OPS = {
    "fwd": (FwdProblem, (2, 4, 5, 8),
            lambda layout, width, features: layout == "cl" or width >= 5 or "seq_idx" in features),
    "bwd": (BwdProblem, (2, 4, 8), lambda layout, width, features: layout == "cl"),
}
CASES = [(op, layout, dtypes, width, features)
         for op, (_, widths, _) in OPS.items()
         for layout, dtypes, width, features in itertools.product(
             ("cf", "cl"), (("bf16", "bf16"), ("f32", "f32"), ("bf16", "f32")), widths, FEATURES)]


@pytest.mark.parametrize("op,layout,dtypes,width,features", CASES)
def test_shape_plan_options_match_the_timed_buffers(rt, op, layout, dtypes, width, features):
    problem_class, _, fixed = OPS[op]
    shape = Shape(op, layout, *dtypes, width, 3, 136, 77, **features)
    problem = problem_class()
    inputs = problem.make_inputs(shape, seed=1, device="cpu")
    want = problem.plan_options(rt, shape, inputs, problem.make_outputs(shape, inputs))
    assert problem.shape_plan_options(rt, shape) == want
    assert (want is not None) == fixed(layout, width, features)
