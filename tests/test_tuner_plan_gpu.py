"""GPU: the tuner times the kernel that users' calls run. Where plans launch a fixed
kernel (channel-last forwards, channel-first ones from width 5, updates), the tuner's
evaluator compiles that kernel ahead on its compile thread, then validates and times it
(launch_fwd / launch_upd as_plan), compiling nothing more; elsewhere it runs the generic
kernel. Shapes fit no tile; validation is against float64 with NaN-poisoned outputs."""
from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

from cc1d.generator import default_variant  # noqa: E402
from cc1d.tuner.evaluate import GpuEvaluator, compile_variant  # noqa: E402
from cc1d.tuner.measure import MeasureConfig  # noqa: E402
from cc1d.tuner.shapes import Shape  # noqa: E402

CASES = [  # (shape, plans fix it)
    (Shape("fwd", "cl", "bf16", "bf16", 4, 2, 1000, 777), True),
    (Shape("fwd", "cl", "f32", "f32", 3, 1, 136, 4099, bias=False, initial_states=True, final_states=True), True),
    (Shape("fwd", "cf", "bf16", "bf16", 6, 3, 260, 1000), True),
    (Shape("fwd", "cf", "bf16", "bf16", 4, 3, 260, 1000), False),
    (Shape("upd", "cl", "bf16", "bf16", 4, 5, 1000, 1, state_indices=True), True),
]


@pytest.mark.parametrize("shape,fixes", CASES, ids=lambda c: c.describe() if isinstance(c, Shape) else str(c))
def test_the_tuner_validates_and_times_the_kernel_plans_run(rt, shape, fixes):
    target = rt.device_target("cuda", torch.cuda.current_device())
    # Nine flush-timed samples, not three: their median is a difference of replays, and under
    # -n 8 on one GPU three of them once came out at -2.8 us (measure.positive_timing).
    ev = GpuEvaluator(rt, shape, target, MeasureConfig(warmup=2, stages=(5,), flush_stages=(9,)))
    assert (ev.plan_options is not None) == fixes
    if fixes:
        assert ev.plan_options[0] in ("-DCC1D_FWD_FIXED=1", "-DCC1D_UPD_FIXED=1")
    v = default_variant(shape.family(), target)
    # A source of its own (a comment added), so that no other test in this process has
    # loaded either of its kernels: the module loads below count this test's alone.
    source = v.source + f"// {__name__} {shape.key()}\n"
    kernel = dict(v.as_runtime_dict(), source=source, hash=hashlib.sha256(source.encode()).hexdigest())
    ev._kernels[v] = kernel
    compile_variant(rt, SimpleNamespace(source=source), target, ev.plan_options)  # what ev.compile(v) does
    before = rt.dispatch_stats()
    ev.validate(v)  # raises CandidateError on a wrong or unwritten element
    after = rt.dispatch_stats()
    assert after["compiles"] == before["compiles"], "the launch compiled what compile() should have"
    assert after["loads"] - before["loads"] == 1  # one module: the fixed kernel, or the generic one
    assert ev.time(v, None).median_us > 0
    # The generic kernel (causal_conv1d_fwd's launch) is another module where plans fix:
    # it was not the one loaded above.
    inputs, outputs = ev.timer.sets[0]
    launch = rt.launch_fwd if shape.op == "fwd" else rt.launch_upd
    launch(kernel, *ev.problem.launch_args(shape, inputs, outputs), torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert rt.dispatch_stats()["loads"] - after["loads"] == (1 if fixes else 0)
