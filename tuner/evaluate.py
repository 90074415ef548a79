"""Running candidates: compile, validate and time one variant of one shape.

`Evaluator` is the seam between the search and the device: the real one
(`GpuEvaluator`) goes through the same runtime path production calls use;
tests inject fakes. A failed candidate raises `CandidateError(status, reason)`,
which the search records as a value, never letting it end the run.
"""
from __future__ import annotations

from typing import Any, Protocol

from ..generator import Variant
from ..generator.variant import served
from .measure import CudaTimer, MeasureConfig, Timing, TimingError
from .problems import problem_for
from .shapes import Shape
from .validate import validate


class CandidateError(Exception):
    def __init__(self, status: str, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status, self.reason = status, reason


class Evaluator(Protocol):
    bytes_moved: int

    def compile(self, variant: Variant) -> None:
        """Compile (thread-safe: runs on a worker thread ahead of timing); CandidateError on failure."""

    def validate(self, variant: Variant) -> None:
        """Check against the reference on fresh data; CandidateError on failure."""

    def time(self, variant: Variant, best_us: float | None) -> Timing:
        """Time it (early exit allowed when clearly slower than best_us)."""

    def time_warm(self, variant: Variant) -> Timing | None:
        """Time it back to back, without the L2 flush time() puts before each launch;
        None where time() is warm already (nothing different to measure)."""


def compile_variant(rt: Any, variant: Variant, target: str, plan_options: list[str] | None = None,
                    source: str | None = None) -> None:
    """Compiles the variant's source (or `source`: the build the call is served with), and with
    plan_options the kernel the problem's launch runs too (into the compile cache, where
    that launch finds it)."""
    source = variant.source if source is None else source
    try:
        rt.compile(source, target)
        if plan_options is not None:
            rt.compile(source, target, plan_options)
    except RuntimeError as exc:
        raise CandidateError("compile_error", str(exc)) from None


class GpuEvaluator:
    """The real thing: the runtime compiles and launches, torch supplies data and events."""

    def __init__(self, rt: Any, shape: Shape, target: str, cfg: MeasureConfig = MeasureConfig()) -> None:
        self.rt, self.shape, self.target = rt, shape, target
        self.problem = problem_for(shape.op)
        self.bytes_moved = self.problem.bytes_moved(shape)
        self.timer = CudaTimer(self.problem, shape, cfg)
        self._kernels: dict[Variant, dict] = {}
        self._seed = 0
        # Every buffer set has the same strides, so one set says what the launches compile.
        plan_options = getattr(self.problem, "plan_options", None)
        self.plan_options = plan_options(rt, shape, *self.timer.sets[0]) if plan_options else None

    def _kernel(self, variant: Variant) -> dict:
        # built once: the key/hash/source dict is what launch_fwd takes. Rows off the
        # variant's vectors (an odd seqlen's), and a backward's segment cut by the sequence
        # where the variant's twin moves it, run its realigned twin; a walked backward's
        # segment cut by the sequence, its walk-cut build: as the dispatcher serves the
        # winner there (Variant.served_build). It is stored as the variant itself.
        if variant not in self._kernels:
            s = self.shape
            build = variant.served_build(s.seqlen, self.target, seq_idx=s.seq_idx, final_states=s.final_states)
            self._kernels[variant] = served(variant.as_runtime_dict(), build)
        return self._kernels[variant]

    def _launcher(self, variant: Variant):
        import torch
        kernel = self._kernel(variant)

        def launch(inputs: dict, outputs: dict, stream: int | None = None) -> None:
            s = torch.cuda.current_stream().cuda_stream if stream is None else stream
            try:
                self.problem.launch(self.rt, kernel, self.shape, inputs, outputs, s)
            except (ValueError, RuntimeError) as exc:
                raise CandidateError("launch_error", str(exc)) from None
        return launch

    def compile(self, variant: Variant) -> None:
        compile_variant(self.rt, variant, self.target, self.plan_options, self._kernel(variant)["source"])

    def validate(self, variant: Variant) -> None:
        self._seed += 1  # fresh random data for every candidate
        try:
            reason = validate(self.problem, self.shape, self._launcher(variant), seed=self._seed)
        except RuntimeError as exc:  # an asynchronous launch failure surfaces at the sync
            raise CandidateError("launch_error", str(exc)) from None
        if reason:
            raise CandidateError("wrong_result", reason)

    def _time(self, variant: Variant, best_us: float | None, flush: bool) -> Timing:
        try:
            return self.timer.time(self._launcher(variant), best_us, flush=flush)
        except TimingError as exc:  # recorded as the candidate's failure, never as a time
            raise CandidateError("error", f"timing{'' if flush else ' (warm)'}: {exc}") from None

    def time(self, variant: Variant, best_us: float | None) -> Timing:
        return self._time(variant, best_us, flush=True)

    def time_warm(self, variant: Variant) -> Timing | None:
        if self.timer.flush is None:
            return None
        return self._time(variant, None, flush=False)
