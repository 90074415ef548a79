"""Tuner faults (issue 8, item 4), CPU only, with the injected fake evaluator:
measurements in a worker process that is restarted when a candidate hangs or
kills it (the candidate is recorded as an error, the run goes on); compile
errors recorded, not fatal; SIGKILL at random points of a run, then --resume:
the DB stays consistent and no finished measurement is lost or redone.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from cc1d.generator import variants
from cc1d.tuner.db import TuningDB
from cc1d.tuner.evaluate import CandidateError
from cc1d.tuner.isolate import IsolatedEvaluator
from cc1d.tuner.search import SearchConfig, tune_shape
from cc1d.tuner.testing import FakeEvaluator
from test_tuner_search import ARCH, CF, RUN, _trial_count, statuses

# The fork-context evaluators here fork on purpose (their factories are lambdas, which spawn
# cannot pickle), and their children run fake evaluators only: no torch, no CUDA. Python 3.12
# warns about any fork of a process with threads, which a torch imported by other test
# modules has started; the tuner itself uses spawn.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:This process \(pid=\d+\) is multi-threaded, use of fork\(\) may lead to deadlocks:DeprecationWarning")


class FaultyEvaluator(FakeEvaluator):
    """A fake whose chosen candidates hang in time() or kill their process in validate()."""

    def __init__(self, hang=(), die=(), **kw):
        super().__init__(**kw)
        self.hang, self.die = set(hang), set(die)

    def validate(self, variant):
        if variant.key() in self.die:
            os.kill(os.getpid(), signal.SIGKILL)
        super().validate(variant)

    def time(self, variant, best_us):
        if variant.key() in self.hang:
            time.sleep(3600)
        return super().time(variant, best_us)


def order_of_candidates(tmp_path, trials):
    """The candidates a run validates, in order (the sampler is seeded)."""
    ev = FakeEvaluator()
    with TuningDB(tmp_path / "dry.db") as db:
        tune_shape(CF, ARCH, ev, db, SearchConfig(trials=trials))
    return ev.validated


@pytest.mark.parametrize("fault", ["hang", "die"])
def test_a_hanging_or_crashing_candidate_costs_one_trial(tmp_path, fault):
    order = order_of_candidates(tmp_path, 6)
    bad = order[1]  # the second candidate: the sampler proposes it before seeing any failure
    factory = lambda: FaultyEvaluator(**{fault: [bad]})  # noqa: E731 - forked, not pickled
    with TuningDB(tmp_path / "t.db") as db, \
            IsolatedEvaluator(factory, timeout_s=2.0, context="fork") as ev:
        res = tune_shape(CF, ARCH, ev, db, SearchConfig(trials=6))
        rows = statuses(db, CF)
        assert ev.restarts == 1
    assert rows[bad]["status"] == "error"
    assert ("timed out after 2 s" if fault == "hang" else "worker died during validate") in rows[bad]["error"]
    others = [r for k, r in rows.items() if k != bad and r["status"] != "invalid"]
    assert len(others) == 5 and all(r["status"] in ("ok", "slow") for r in others), others
    assert res.winner is not None and res.winner.key() != bad


def test_isolated_results_equal_in_process_results(tmp_path):
    with TuningDB(tmp_path / "a.db") as a:
        want = tune_shape(CF, ARCH, FakeEvaluator(), a, SearchConfig(trials=5))
    with TuningDB(tmp_path / "b.db") as b, IsolatedEvaluator(FakeEvaluator, context="fork") as ev:
        got = tune_shape(CF, ARCH, ev, b, SearchConfig(trials=5))
        assert ev.restarts == 0
    assert (got.winner, got.time_us) == (want.winner, want.time_us)


def test_candidate_errors_cross_the_process_boundary():
    v = next(iter(variants(CF.family())))
    factory = lambda: FakeEvaluator(wrong=lambda x: x.key() == v.key())  # noqa: E731
    with IsolatedEvaluator(factory, context="fork") as ev:
        with pytest.raises(CandidateError) as info:
            ev.validate(v)
        assert info.value.status == "wrong_result" and "relative L2" in info.value.reason
        assert ev.time(v, None).median_us > 0 and ev.restarts == 0


def test_warm_timing_crosses_the_process_boundary():
    """--isolate: the warm tie-break timing runs in the worker too (None where the
    problem's timing is warm already)."""
    v = next(iter(variants(CF.family())))
    with IsolatedEvaluator(lambda: FakeEvaluator(warm_times=lambda x: 4.5), context="fork") as ev:
        assert ev.time_warm(v).median_us == 4.5
    with IsolatedEvaluator(FakeEvaluator, context="fork") as ev:
        assert ev.time_warm(v) is None and ev.restarts == 0


def test_the_parent_compiles_with_the_workers_plan_options():
    """--isolate compiles in the parent, with the options of the kernel the worker's
    launches run (its evaluator's plan_options), so the worker finds it compiled; a
    replaced worker tells them again."""
    v = next(iter(variants(CF.family())))

    def factory():
        ev = FaultyEvaluator(die=[v.key()])
        ev.plan_options = ["-DCC1D_FWD_FIXED=1", f"-DCC1D_FIX_DIM={CF.dim}"]
        return ev

    compiled = []
    with IsolatedEvaluator(factory, context="fork", compile_fn=lambda *a: compiled.append(a)) as ev:
        ev.compile(v)
        with pytest.raises(CandidateError, match="worker died"):
            ev.validate(v)
        ev.plan_options = None
        assert ev.time(v, None).median_us > 0  # a fresh worker, which tells them again
        assert ev.restarts == 1
        ev.compile(v)
    with IsolatedEvaluator(FakeEvaluator, context="fork", compile_fn=lambda *a: compiled.append(a)) as ev:
        ev.compile(v)  # an evaluator without plan_options: the source as it is
    opts = ["-DCC1D_FWD_FIXED=1", f"-DCC1D_FIX_DIM={CF.dim}"]
    assert compiled == [(v, opts), (v, opts), (v, None)]


def test_compile_errors_are_recorded_not_fatal(tmp_path):
    order = order_of_candidates(tmp_path, 6)
    bad = set(order[1:3])
    with TuningDB(tmp_path / "t.db") as db:
        res = tune_shape(CF, ARCH, FakeEvaluator(compile_fails=lambda v: v.key() in bad), db,
                         SearchConfig(trials=6))
        rows = statuses(db, CF)
    assert {k for k, r in rows.items() if r["status"] == "compile_error"} == bad
    assert all("fake compiler rejects" in rows[k]["error"] for k in bad)
    assert res.winner is not None


def test_sigkill_at_random_points_then_resume(tmp_path):
    """Kill a tuning run at random moments (start-up, mid-trial, mid-commit), six
    times, then resume to the end: the DB passes its integrity check after every
    kill, the stored trials only grow, and none is measured twice."""
    path = tmp_path / "t.db"
    rng = random.Random(8)
    seen = 0
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, "-P", "-c", RUN, str(path)], stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.2, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode in (-9, 0), proc.stderr.read().decode()
        if path.exists():
            with TuningDB(path) as d:
                assert d.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        now = _trial_count(path)
        assert now >= seen
        seen = now
    proc = subprocess.run([sys.executable, "-P", "-c", RUN, str(path)], capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    with TuningDB(path) as d:
        assert len(d.winners()) == 2 and d.validate() == []
        for s in ("cf", "cl"):
            rows = [r for r in d.conn.execute("SELECT variant_key, status FROM trials WHERE family_key LIKE ?",
                                              (f"fwd.{s}.%",))]
            keys = [r[0] for r in rows]
            assert len(keys) == len(set(keys)), "a stored trial was measured again"
            assert sum(r[1] != "invalid" for r in rows) == 12
