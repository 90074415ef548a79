"""The tuner's timing logic without a GPU: staged sampling with its early exit, and the
refusal of times that are not positive (tuner/measure.py), as the evaluator reports it."""
from __future__ import annotations

import math

import pytest

from cc1d.tuner.evaluate import CandidateError, GpuEvaluator
from cc1d.tuner.measure import MeasureConfig, Timing, TimingError, positive_timing, staged_timing


def sampler(values):
    """A sample(n) callable handing out `values` in order; records the sizes asked for."""
    it = iter(values)
    asked = []

    def sample(n):
        asked.append(n)
        return [next(it) for _ in range(n)]
    sample.asked = asked
    return sample


def test_staged_timing_takes_every_stage_without_a_best():
    s = sampler([2.0] * 10)
    t = staged_timing(s, None, MeasureConfig(stages=(2, 5, 10)))
    assert s.asked == [2, 3, 5]
    assert t == Timing(2.0, 0.0, 10, early_exit=False)


def test_staged_timing_stops_early_when_clearly_slower_than_the_best():
    s = sampler([5.0] * 10)
    t = staged_timing(s, 2.0, MeasureConfig(stages=(2, 5, 10)))
    assert t.early_exit and t.samples == 2 and t.median_us == 5.0


def test_staged_timing_keeps_a_close_candidate_to_the_end():
    s = sampler([2.2] * 10)
    t = staged_timing(s, 2.0, MeasureConfig(stages=(2, 5, 10)))
    assert not t.early_exit and t.samples == 10


def test_positive_timing_returns_the_first_positive_time():
    times = iter([Timing(-2.8, 0.0, 3), Timing(0.0, 0.0, 3), Timing(2.1, 0.1, 3)])
    calls = []

    def measure():
        calls.append(1)
        return next(times)
    assert positive_timing(measure).median_us == 2.1
    assert len(calls) == 3


@pytest.mark.parametrize("bad", [-2.8, 0.0, math.nan, math.inf])
def test_positive_timing_refuses_a_time_that_is_never_positive(bad):
    calls = []

    def measure():
        calls.append(1)
        return Timing(bad, 0.0, 3)
    with pytest.raises(TimingError, match="no positive time measured in 3 tries"):
        positive_timing(measure)
    assert len(calls) == 3


class _RefusingTimer:
    flush = object()  # flush-timed: time_warm measures too

    def time(self, launch, best_us, flush=True):
        raise TimingError("no positive time measured in 3 tries (last median -2.8 us): busy")


@pytest.mark.parametrize("method,args", [("time", (None,)), ("time_warm", ())])
def test_the_evaluator_reports_an_unmeasurable_candidate_as_its_failure(method, args):
    ev = object.__new__(GpuEvaluator)  # no device: only the timer and the launcher are used
    ev.timer = _RefusingTimer()
    ev._launcher = lambda variant: None
    with pytest.raises(CandidateError) as info:
        getattr(ev, method)("variant", *args)
    assert info.value.status == "error"
    assert "no positive time" in info.value.reason
