"""Test seam: a fake Evaluator with deterministic timings and scripted failures.

Lets the tests (and CI, which has no GPU) drive the whole search — Optuna,
pruning, tie-breaking, DB writes, resume — without torch or a device. The
real command never uses it.
"""
from __future__ import annotations

import hashlib
import threading
import time
from typing import Callable

from ..generator import Variant
from .evaluate import CandidateError
from .measure import Timing


def fake_time_us(variant: Variant) -> float:
    """A stable pseudo-random time in [10, 20) µs per variant key."""
    h = int(hashlib.sha256(variant.key().encode()).hexdigest()[:8], 16)
    return 10.0 + (h % 10_000) / 1000.0


class FakeEvaluator:
    def __init__(self, *, times: Callable[[Variant], float] = fake_time_us, spread: float = 0.001,
                 compile_fails: Callable[[Variant], bool] = lambda v: False,
                 launch_fails: Callable[[Variant], bool] = lambda v: False,
                 wrong: Callable[[Variant], bool] = lambda v: False,
                 slow_factor: float | None = 1.5, sleep_s: float = 0.0, bytes_moved: int = 1 << 24,
                 warm_times: Callable[[Variant], float] | None = None, compile_s: float = 0.0) -> None:
        self.times, self.spread, self.warm_times = times, spread, warm_times
        self.compile_fails, self.launch_fails, self.wrong = compile_fails, launch_fails, wrong
        self.slow_factor, self.sleep_s, self.bytes_moved = slow_factor, sleep_s, bytes_moved
        self.compile_s = compile_s  # how long a compile takes (on the search's compile threads)
        self.lock = threading.Lock()
        self.compiling = 0            # compiles running now, and the most at once
        self.most_compiling = 0
        self.compiled: list[str] = []
        self.timed: list[str] = []
        self.validated: list[str] = []
        self.timed_warm: list[str] = []

    def compile(self, variant: Variant) -> None:
        with self.lock:
            self.compiled.append(variant.key())
            self.compiling += 1
            self.most_compiling = max(self.most_compiling, self.compiling)
        if self.compile_s:
            time.sleep(self.compile_s)
        with self.lock:
            self.compiling -= 1
        if self.compile_fails(variant):
            raise CandidateError("compile_error", f"fake compiler rejects {variant.key()}")

    def validate(self, variant: Variant) -> None:
        with self.lock:
            self.validated.append(variant.key())
        if self.launch_fails(variant):
            raise CandidateError("launch_error", "fake launch failure")
        if self.wrong(variant):
            raise CandidateError("wrong_result", "out: relative L2 error 1.0e+00 > 0.02 (bf16)")

    def time(self, variant: Variant, best_us: float | None) -> Timing:
        with self.lock:
            self.timed.append(variant.key())
        if self.sleep_s:
            time.sleep(self.sleep_s)
        t = self.times(variant)
        slow = self.slow_factor is not None and best_us is not None and t > best_us * self.slow_factor
        return Timing(t, self.spread, 10 if slow else 200, early_exit=slow)

    def time_warm(self, variant: Variant) -> Timing | None:
        """None without warm_times: a problem whose time() is warm already."""
        if self.warm_times is None:
            return None
        with self.lock:
            self.timed_warm.append(variant.key())
        return Timing(self.warm_times(variant), self.spread, 200)
