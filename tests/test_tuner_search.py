"""The search end to end with an injected evaluator (fake compile, validation and
timings): Optuna, pruning with reasons, tie-breaking, DB writes, budget, resume
after SIGKILL, and a study shared by two processes through a journal."""
from __future__ import annotations

import json
from dataclasses import replace
import signal
import subprocess
import sys
import time

import pytest

from cc1d.generator import arch_info, default_variant, variants
from cc1d.generator.space import space_for
from cc1d.generator.variant import Variant
from cc1d.tuner.db import TuningDB
from cc1d.tuner.search import (SearchConfig, _BruteForce, make_sampler, simplicity, start_configs, tile_fill,
                               tune_shape, with_added_params)
from cc1d.tuner.shapes import parse_shapes
from cc1d.tuner.testing import FakeEvaluator, fake_time_us

CF, CL = parse_shapes([{"layout": ["cf", "cl"], "batch": 2, "dim": 256, "seqlen": 1024}])
ARCH = "sm_90"


@pytest.fixture
def db(tmp_path):
    with TuningDB(tmp_path / "t.db") as d:
        yield d


def statuses(db, shape):
    return {r["variant_key"]: r for r in db.trials(ARCH, shape.family().key(), shape.key())}


def test_default_first_failures_pruned_with_reasons_and_a_winner_stored(db):
    valid = list(variants(CF.family(), arch_info(ARCH)))
    compile_fails = lambda v: v.params["threads"] == 256  # noqa: E731
    launch_fails = lambda v: v.params["halo"] == "reload" and v.params["nvec"] == 4  # noqa: E731
    fastest = min((v for v in valid if not compile_fails(v) and not launch_fails(v)), key=fake_time_us)
    ev = FakeEvaluator(compile_fails=compile_fails, launch_fails=launch_fails,
                       wrong=lambda v: v == fastest)  # the fastest is wrong: it must not win
    res = tune_shape(CF, ARCH, ev, db, SearchConfig(trials=len(valid)))
    default = default_variant(CF.family())
    assert ev.compiled[0] == default.key()
    rows = statuses(db, CF)
    by_status = {}
    for r in rows.values():
        by_status.setdefault(r["status"], []).append(r)
    assert {"invalid", "compile_error", "launch_error", "wrong_result", "ok"} <= set(by_status)
    assert all(r["error"] for s, rs in by_status.items() if s != "ok" for r in rs)
    assert "fewer than 32 threads per channel row" in {r["error"] for r in by_status["invalid"]}
    assert rows[fastest.key()]["status"] == "wrong_result"
    # exhaustive: every valid variant tried exactly once, invalid ones never compiled
    assert sorted(ev.compiled) == sorted(v.key() for v in valid)
    ok = [r for r in rows.values() if r["status"] == "ok"]
    best = min(ok, key=lambda r: r["time_us"])
    # the winner is the best valid one, up to a tie within the 0.5% noise floor
    assert rows[res.winner.key()]["time_us"] <= best["time_us"] * 1.005
    assert res.winner != fastest
    w = db.winner(ARCH, CF.family().key(), CF.key())
    assert w["variant_key"] == res.winner.key() and w["source_hash"] == res.winner.hash()
    assert w["speedup"] == pytest.approx(fake_time_us(default) / rows[res.winner.key()]["time_us"])
    assert db.validate() == []


def test_sampler_choice_and_trial_cap(db):
    n_valid = len(list(variants(CL.family(), arch_info(ARCH))))
    assert isinstance(make_sampler(CL.family(), ARCH, SearchConfig(trials=n_valid)), _BruteForce)
    assert not isinstance(make_sampler(CL.family(), ARCH, SearchConfig(trials=n_valid - 1)), _BruteForce)
    ev = FakeEvaluator()
    res = tune_shape(CL, ARCH, ev, db, SearchConfig(trials=8))
    assert len(ev.compiled) == len(set(ev.compiled)) == 8
    assert sum(r["status"] != "invalid" for r in statuses(db, CL).values()) == 8
    assert res.winner is not None and res.counts.get("ok", 0) + res.counts.get("slow", 0) == 8


@pytest.mark.parametrize("workers", [1, 4])
def test_compile_threads_compile_candidates_side_by_side(db, workers):
    """With N compile threads, N candidates compile at once ahead of the one being timed
    (slow compiles no longer leave the GPU idle), and every candidate compiled is still
    validated, timed and recorded once."""
    ev = FakeEvaluator(compile_s=0.15)
    res = tune_shape(CL, ARCH, ev, db, SearchConfig(trials=8, compile_workers=workers))
    assert ev.most_compiling == workers
    assert len(ev.compiled) == len(set(ev.compiled)) == 8
    assert sorted(set(ev.timed)) == sorted(ev.compiled) == sorted(ev.validated)
    assert sum(r["status"] in ("ok", "slow") for r in statuses(db, CL).values()) == 8
    assert res.winner is not None


def test_tpe_is_deterministic_with_its_seed(tmp_path):
    runs = []
    for k in range(2):
        with TuningDB(tmp_path / f"{k}.db") as d:
            ev = FakeEvaluator()
            tune_shape(CL, ARCH, ev, d, SearchConfig(trials=12, seed=7))
            runs.append(ev.compiled)
    assert runs[0] == runs[1]


def test_clearly_slow_candidates_exit_early(db):
    ev = FakeEvaluator(times=lambda v: 10.0 if v.params["threads"] == 64 else 30.0)  # the default: 64
    tune_shape(CF, ARCH, ev, db, SearchConfig(trials=6))
    rows = [r for r in statuses(db, CF).values() if r["status"] in ("ok", "slow")]
    assert any(r["status"] == "slow" for r in rows)
    assert all(r["status"] == "slow" for r in rows if r["time_us"] == 30.0)


@pytest.mark.parametrize("gain, expect_default", [(0.002, True), (0.05, False)])
def test_near_ties_within_the_spread_go_to_the_default(db, gain, expect_default):
    default = default_variant(CF.family())
    rival = default_variant(CF.family(), threads=256)
    times = lambda v: 10.0 * (1 - gain) if v == rival else 10.0 if v == default else 20.0  # noqa: E731
    res = tune_shape(CF, ARCH, FakeEvaluator(times=times, spread=0.01), db, SearchConfig(trials=10_000))
    assert res.winner == (default if expect_default else rival)
    assert res.spread == pytest.approx(0.01)


def test_one_disturbed_retime_round_of_the_fastest_does_not_make_everything_a_tie(db):
    default = default_variant(CF.family())
    rival = default_variant(CF.family(), threads=256)
    calls = {"rival": 0}

    def times(v):
        if v != rival:
            return 10.0 if v == default else 20.0
        calls["rival"] += 1
        return 30.0 if calls["rival"] == 2 else 5.0  # its first re-time round is disturbed

    res = tune_shape(CF, ARCH, FakeEvaluator(times=times, spread=0.01), db, SearchConfig(trials=10_000))
    assert calls["rival"] == 4  # the trial and three re-time rounds
    assert res.winner == rival and res.time_us == pytest.approx(5.0)
    assert res.speedup == pytest.approx(2.0)


@pytest.mark.parametrize("gain, expect_default", [(0.004, True), (0.05, False)])
def test_wide_sample_spreads_tie_only_within_the_medians_error(db, gain, expect_default):
    # Flush-timed samples spread by ~10 %; medians of 200 of them differ by ~0.5 %: a 5 %
    # gain is real (the spread itself as the band would call it a tie), 0.4 % is not.
    default = default_variant(CF.family())
    rival = default_variant(CF.family(), threads=256)
    times = lambda v: 10.0 * (1 - gain) if v == rival else 10.0 if v == default else 20.0  # noqa: E731
    res = tune_shape(CF, ARCH, FakeEvaluator(times=times, spread=0.10), db, SearchConfig(trials=10_000))
    assert res.winner == (default if expect_default else rival)
    assert res.spread == pytest.approx(0.10)


def test_medians_that_drift_between_rounds_tie(db):
    # The rival's rounds scatter by 8 % (median absolute deviation): its 4 % lead over the
    # default is not a measured one, whatever the samples' spread within a round.
    default = default_variant(CF.family())
    rival = default_variant(CF.family(), threads=256)
    seq = iter([4.6, 5.0, 5.4, 4.6])  # the trial, then three re-time rounds

    def times(v):
        return next(seq) if v == rival else 5.2 if v == default else 20.0

    res = tune_shape(CF, ARCH, FakeEvaluator(times=times, spread=0.01), db, SearchConfig(trials=10_000))
    assert res.winner == default


@pytest.mark.parametrize("warm_gain, expect_default", [(0.0, True), (0.2, False)])
def test_flush_timed_ties_go_to_the_faster_warm(db, warm_gain, expect_default):
    # Tied after a flush (0.2 % apart), the rival 20 % faster back to back: the warm
    # timing decides; tied there too, the default wins as before. Stored times stay
    # the primary (flushed) ones.
    default = default_variant(CF.family())
    rival = default_variant(CF.family(), threads=256)
    times = lambda v: 9.98 if v == rival else 10.0 if v == default else 20.0  # noqa: E731
    warm = lambda v: 5.0 * (1 - warm_gain) if v == rival else 5.0 if v == default else 8.0  # noqa: E731
    ev = FakeEvaluator(times=times, warm_times=warm, spread=0.01)
    res = tune_shape(CF, ARCH, ev, db, SearchConfig(trials=10_000))
    assert res.winner == (default if expect_default else rival)
    assert res.time_us == pytest.approx(10.0 if expect_default else 9.98)
    assert ev.timed_warm.count(rival.key()) == 3 and ev.timed_warm.count(default.key()) == 3
    assert set(ev.timed_warm) == {rival.key(), default.key()}  # only the tied finalists


def test_a_clear_winner_is_not_timed_warm(db):
    default = default_variant(CF.family())
    rival = default_variant(CF.family(), threads=256)
    times = lambda v: 5.0 if v == rival else 10.0 if v == default else 20.0  # noqa: E731
    ev = FakeEvaluator(times=times, warm_times=lambda v: 1.0, spread=0.01)
    res = tune_shape(CF, ARCH, ev, db, SearchConfig(trials=10_000))
    assert res.winner == rival and ev.timed_warm == []


def test_median_error_shrinks_with_samples():
    from cc1d.tuner.measure import Timing
    from cc1d.tuner.search import median_error
    assert median_error(Timing(10.0, 0.10, 200)) == pytest.approx(0.745 * 0.10 / 200 ** 0.5)
    assert median_error(Timing(10.0, 0.10, 50)) == pytest.approx(2 * median_error(Timing(10.0, 0.10, 200)))


def test_ties_among_non_defaults_go_to_the_fewest_changes(db):
    default = default_variant(CF.family())
    near = default_variant(CF.family(), threads=256)
    far = default_variant(CF.family(), threads=256, nvec=4, halo="reload")
    assert simplicity(near, default) < simplicity(far, default)
    picks = {near: 5.0, far: 5.0}
    res = tune_shape(CF, ARCH, FakeEvaluator(times=lambda v: picks.get(v, 10.0)), db,
                     SearchConfig(trials=200, finalists=5))
    assert res.winner == near


def test_ties_go_to_the_start_config_first(db):
    """A re-tune keeps the kernel the shape's calls ran (the first start config) where the
    best it finds only ties with it, the default included; a clear gain still wins."""
    default = default_variant(CF.family())
    incumbent = default_variant(CF.family(), threads=256, nvec=4, halo="reload")
    picks = {default: 5.0, incumbent: 5.0}
    res = tune_shape(CF, ARCH, FakeEvaluator(times=lambda v: picks.get(v, 10.0)), db,
                     SearchConfig(trials=20, finalists=5), start_configs=[incumbent.params])
    assert res.winner == incumbent and res.start == incumbent
    picks[default] = 4.0
    res = tune_shape(CF, ARCH, FakeEvaluator(times=lambda v: picks.get(v, 10.0)), db,
                     SearchConfig(trials=20, finalists=5), start_configs=[incumbent.params])
    assert res.winner == default and res.start_us == pytest.approx(5.0)


def test_budget_stops_the_search(db):
    ev = FakeEvaluator(sleep_s=0.05)
    t0 = time.monotonic()
    res = tune_shape(CF, ARCH, ev, db, SearchConfig(trials=200, budget_s=0.3))
    assert time.monotonic() - t0 < 5
    assert 1 <= len(ev.compiled) < 20 and res.winner is not None


def test_a_spent_budget_drops_the_candidates_compiled_ahead(db):
    """Past the budget the candidate being timed finishes and those compiled ahead are
    dropped: nothing of them is recorded (so --resume tries them again), and the study
    hears they failed."""
    ev = FakeEvaluator(compile_s=0.2)
    res = tune_shape(CL, ARCH, ev, db, SearchConfig(trials=64, budget_s=0.3, compile_workers=4))
    timed = set(ev.timed)
    rows = {k: r for k, r in statuses(db, CL).items() if r["status"] != "invalid"}
    assert res.winner is not None and set(rows) == timed
    assert len(ev.compiled) > len(timed)  # compiled ahead, never timed


def test_a_budget_spent_after_one_candidate_is_named_as_not_searched(db):
    """Where --budget-s ends the search after one candidate timed, the table's "timed" column
    says so and the run's warning names the shape: its winner is that kernel, not a search's
    (sessions 72-76: four runs timed only the start at bf16/f32 (16, 8192, 8192)). A search
    that --trials ends after one candidate (its budget spent too), or one the budget let time
    several, is not named."""
    from cc1d.tuner.report import result_dict, table, unsearched
    alone = tune_shape(CF, ARCH, FakeEvaluator(sleep_s=0.2), db, SearchConfig(trials=50, budget_s=0.05))
    assert alone.budget_spent and alone.timed() == 1 and alone.winner is not None
    assert table([alone]).splitlines()[-1].endswith(" 1 (budget)")
    assert result_dict(alone)["timed"] == 1 and result_dict(alone)["budget_spent"] is True
    warning = unsearched([alone])
    assert warning.startswith("1 shape not searched") and f"{CF.family().key()} (2, 256, 1024)" in warning
    # one trial asked for, which outlasts the budget too: --trials ended that search
    one_trial = tune_shape(CL, ARCH, FakeEvaluator(sleep_s=0.2), db, SearchConfig(trials=1, budget_s=0.05))
    several = tune_shape(CL, ARCH, FakeEvaluator(sleep_s=0.02), db, SearchConfig(trials=50, budget_s=0.15))
    assert not one_trial.budget_spent and one_trial.timed() == 1
    assert several.budget_spent and several.timed() > 1
    assert unsearched([one_trial, several]) is None
    assert unsearched([one_trial, alone, several]) == warning


def test_no_valid_candidate_gives_no_winner(db):
    res = tune_shape(CF, ARCH, FakeEvaluator(wrong=lambda v: True), db, SearchConfig(trials=5))
    assert res.winner is None and "no candidate passed validation" in res.note
    assert db.winners() == []


def test_resume_reuses_trials_and_winners(db):
    ev = FakeEvaluator()
    tune_shape(CF, ARCH, ev, db, SearchConfig(trials=5))
    ev2 = FakeEvaluator()
    res = tune_shape(CF, ARCH, ev2, db, SearchConfig(trials=5, resume=True))
    assert res.resumed and ev2.compiled == [] and ev2.timed == []
    # a partial run (no winner yet): resume measures only what is missing
    db.conn.execute("DELETE FROM winners")
    ev3 = FakeEvaluator()
    res = tune_shape(CF, ARCH, ev3, db, SearchConfig(trials=8, resume=True))
    assert len(ev3.compiled) == 3 and not set(ev3.compiled) & set(ev.compiled)
    assert res.winner is not None and not res.resumed



def _store_winner(db, shape, v, time_us=1.0):
    db.put_winner(v.source, arch=ARCH, family_key=shape.family().key(), shape_key=shape.key(), op=shape.op,
                  batch=shape.batch, dim=shape.dim, seqlen=shape.seqlen, features="bias,silu",
                  variant_key=v.key(), config=v.params, **v.geometry(), time_us=time_us, environment={})


def test_start_from_tries_other_dbs_winners_first(db, tmp_path):
    valid = list(variants(CF.family(), arch_info(ARCH)))
    default = default_variant(CF.family())
    fastest = min(valid, key=fake_time_us)
    other = next(v for v in valid if v not in (default, fastest))
    with TuningDB(tmp_path / "old.db") as old, TuningDB(tmp_path / "stale.db") as stale:
        _store_winner(old, CF, fastest, time_us=99.0)     # its stored time plays no part
        _store_winner(stale, CF, other)
        stale.conn.execute("UPDATE winners SET epoch = epoch + 1")  # another generator: not tried
        _store_winner(stale, CL, default_variant(CL.family()))  # another shape: not tried for CF
        starts = start_configs(CF, ARCH, [old, stale, old])
    assert starts == [fastest.params]
    ev = FakeEvaluator()
    res = tune_shape(CF, ARCH, ev, db, SearchConfig(trials=3), start_configs=starts)
    assert ev.compiled[:2] == [fastest.key(), default.key()] and len(ev.compiled) == 3
    assert res.winner == fastest                          # timed here, and it wins on its time
    assert db.winner(ARCH, CF.family().key(), CF.key())["time_us"] == pytest.approx(fake_time_us(fastest),
                                                                                     rel=0.05)



def test_a_budget_of_one_trial_keeps_the_start_config_not_the_default(db):
    """The first start config (what the shape's calls ran) is timed before the default: a
    budget that ends after one trial stores it, never an untimed-against default (session
    75: the default replaced a kernel 1.6x faster at fp16 (16, 2048, 16384))."""
    default = default_variant(CF.family())
    incumbent = default_variant(CF.family(), max_regs=96)
    ev = FakeEvaluator(times=lambda v: 5.0 if v == incumbent else 20.0)
    res = tune_shape(CF, ARCH, ev, db, SearchConfig(trials=1), start_configs=[incumbent.params])
    assert ev.compiled == [incumbent.key()]
    assert res.winner == incumbent and res.start == incumbent and res.default_us is None
    assert db.winner(ARCH, CF.family().key(), CF.key())["variant_key"] == incumbent.key()
    assert default.key() not in ev.compiled


def test_the_start_config_under_every_other_register_cap_is_tried_next(db):
    """Right after the start configs and the default come the start configs under each
    other register cap (statically valid ones), so a short re-tune on another device cannot
    miss the incumbent's one-knob neighbour (session 56: H100 winners under a 96 cap were
    faster under 64 on an H200); one of them wins where it is faster."""
    default = default_variant(CF.family())
    incumbent = default_variant(CF.family(), max_regs=96)
    caps = {c: default_variant(CF.family(), max_regs=c) for c in (255, 64)}
    picks = {default: 10.0, incumbent: 8.0, caps[255]: 9.0, caps[64]: 7.0}
    ev = FakeEvaluator(times=lambda v: picks.get(v, 20.0))
    res = tune_shape(CF, ARCH, ev, db, SearchConfig(trials=4, finalists=4), start_configs=[incumbent.params])
    # the default's own cap (128) is the default itself: not tried twice
    assert ev.compiled == [incumbent.key(), default.key(), caps[255].key(), caps[64].key()]
    assert res.winner == caps[64] and res.start == incumbent


def test_register_cap_neighbours_that_the_space_rules_out_are_not_queued(db):
    """A cap that bounds the start config's threads no tighter than a larger cap is invalid
    (space.py): it is neither compiled nor counted against --trials."""
    incumbent = default_variant(CF.family(), threads=256, nvec=4, halo="reload", max_regs=128)
    assert Variant.of(CF.family(), **{**incumbent.params, "max_regs": 96}).why_invalid(ARCH)
    ev = FakeEvaluator()
    tune_shape(CF, ARCH, ev, db, SearchConfig(trials=3), start_configs=[incumbent.params])
    queued = ev.compiled[:3]
    assert queued[:2] == [incumbent.key(), default_variant(CF.family()).key()]
    assert queued[2] == default_variant(CF.family(), threads=256, nvec=4, halo="reload", max_regs=255).key()

def test_one_knob_neighbours_of_the_start_config_follow_its_register_caps(db):
    """After the caps come the start config with each other value of every other tunable
    (statically valid ones), in the space's order: every such neighbour is tried before
    the sampler's own picks, and one wins where it is faster (session 57: walked
    channel-first backward segments are the shipped winners' nvec neighbours)."""
    default = default_variant(CF.family())
    incumbent = default_variant(CF.family(), max_regs=96)
    order = [p.name for p in space_for(CF.family()).params]
    valid = {v.key(): v for v in variants(CF.family(), arch_info(ARCH))}
    knob = {k: next(n for n in order if v.params[n] != incumbent.params[n]) for k, v in valid.items()
            if sum(v.params[n] != incumbent.params[n] for n in order) == 1}
    caps = [k for k in knob if knob[k] == "max_regs" and k != default.key()]
    others = [k for k in knob if knob[k] != "max_regs" and k != default.key()]
    assert caps and others
    faster = next(k for k in others if knob[k] == "nvec")
    ev = FakeEvaluator(times=lambda v: 5.0 if v.key() == faster else 20.0)
    n = 2 + len(caps) + len(others)
    res = tune_shape(CF, ARCH, ev, db, SearchConfig(trials=n, finalists=4), start_configs=[incumbent.params])
    tried = ev.compiled[:n]
    assert tried[:2] == [incumbent.key(), default.key()]
    assert sorted(tried[2:2 + len(caps)]) == sorted(caps)
    assert sorted(tried[2 + len(caps):]) == sorted(others)
    changed = [order.index(knob[k]) for k in tried[2 + len(caps):]]
    assert changed == sorted(changed)  # in the space's order
    assert res.winner.key() == faster


# bf16 x, fp32 weights: the default's tiles are 2048 positions, which a 3000 row fills to 73 %.
FIT = parse_shapes([{"layout": "cf", "batch": 2, "dim": 256, "seqlen": 3000}])[0]


def test_tile_fill_is_the_share_of_a_rows_tiles_inside_the_sequence():
    v = default_variant(FIT.family())
    assert v.geometry()["tile_l"] == 2048
    assert tile_fill(v, 3000) == pytest.approx(3000 / 4096)
    assert tile_fill(v, 2048) == tile_fill(v, 4096) == 1.0
    assert tile_fill(v, 100) == pytest.approx(100 / 2048)
    cl = default_variant(CL.family())
    assert cl.geometry()["tile_l"] == 64 and tile_fill(cl, 3000) == pytest.approx(3000 / 3008)
    upd = parse_shapes([{"op": "upd", "layout": "cl", "batch": 4, "dim": 256, "seqlen": 1}])[0]
    assert tile_fill(default_variant(upd.family()), 1) is None  # its tiles run along the batch


def _compiled(tmp_path, name, shape, fit, starts, times=None):
    ev = FakeEvaluator(times=times) if times else FakeEvaluator()
    with TuningDB(tmp_path / f"{name}.db") as d:
        res = tune_shape(shape, ARCH, ev, d, SearchConfig(trials=4, finalists=4, fit_starts=fit),
                         start_configs=starts)
    return ev.compiled, res


def test_fit_starts_try_the_neighbours_that_fill_the_sequence_best_right_after_the_starts(tmp_path):
    """--fit-starts 2: a start whose 2048-position tiles a 3000 row fills to 73 % is followed
    by its one-knob neighbours of 1024 and 512 positions (98 %; 16-byte vectors kept, the
    longer tile first) before its register caps, and one wins where it is faster. Without
    the flag, or where its tiles fit the sequence (4096), the order is the plain one; with
    no start, the default's neighbours come."""
    default = default_variant(FIT.family())
    start = default_variant(FIT.family(), max_regs=64)
    n2, n1 = (default_variant(FIT.family(), max_regs=64, nvec=n) for n in (2, 1))
    compiled, res = _compiled(tmp_path, "fit", FIT, 2, [start.params], times=lambda v: 5.0 if v == n1 else 20.0)
    assert compiled == [start.key(), default.key(), n2.key(), n1.key()]
    assert res.winner == n1
    plain, _ = _compiled(tmp_path, "plain", FIT, 0, [start.params])
    assert plain[:2] == compiled[:2] and n2.key() not in plain and n1.key() not in plain
    fits = replace(FIT, seqlen=4096)
    assert _compiled(tmp_path, "fits", fits, 2, [start.params])[0] == _compiled(tmp_path, "fits0", fits, 0,
                                                                                 [start.params])[0]
    alone, _ = _compiled(tmp_path, "alone", FIT, 1, [])
    assert alone[:2] == [default.key(), default_variant(FIT.family(), nvec=2).key()]


def test_family_starts_follow_the_shapes_own_winner_nearest_shape_first(tmp_path):
    """start_configs(family=N) adds the winners of the N nearest other shapes of the family
    (dispatch_rank), after the shape's own and without repeats; other families, other
    generator epochs and configs the arch cannot build are not among them."""
    valid = list(variants(CF.family(), arch_info(ARCH)))
    own, near, far, stale = valid[1], valid[2], valid[3], valid[4]
    near_shape, far_shape, same_shape, stale_shape = parse_shapes(
        [{"layout": "cf", "batch": 2, "dim": 256, "seqlen": n} for n in (2048, 65536, 512, 1100)])
    with TuningDB(tmp_path / "old.db") as old, TuningDB(tmp_path / "other.db") as other:
        _store_winner(old, CF, own)
        _store_winner(old, far_shape, far)
        _store_winner(old, same_shape, own)  # the shape's own config again: not repeated
        _store_winner(other, near_shape, near)
        _store_winner(other, stale_shape, stale)
        other.conn.execute("UPDATE winners SET epoch = epoch + 1 WHERE seqlen = 1100")  # another generator
        _store_winner(old, CL, default_variant(CL.family()))  # another family
        assert start_configs(CF, ARCH, [old, other]) == [own.params]
        assert start_configs(CF, ARCH, [old, other], family=1) == [own.params, near.params]
        assert start_configs(CF, ARCH, [old, other], family=2) == [own.params, near.params, far.params]
        assert start_configs(CF, ARCH, [old, other], family=5) == [own.params, near.params, far.params]
        # an untuned shape: each DB's served winner (its nearest) first, then the next nearest
        untuned = parse_shapes([{"layout": "cf", "batch": 2, "dim": 256, "seqlen": 3000}])[0]
        assert start_configs(untuned, ARCH, [old]) == [own.params]
        assert start_configs(untuned, ARCH, [old], family=1) == [own.params, far.params]
        assert start_configs(untuned, ARCH, [old, other], family=1) == [own.params, near.params, far.params]


def _kin(seqlen, width=4, dtypes="bf16/f32", layout="cf"):
    """A forward shape of CF's batch and dim at another length, width, dtypes or layout."""
    return parse_shapes([{"layout": layout, "dtypes": dtypes, "width": width, "batch": 2, "dim": 256,
                          "seqlen": seqlen}])[0]


def _store_kin(db, shape, v):
    """v's config (a variant of CF's family) stored as the winner of `shape`, another family."""
    _store_winner(db, shape, Variant.of(shape.family(), **v.params))


def test_width_starts_follow_the_family_nearest_shape_then_nearest_width(tmp_path):
    """start_configs(widths=N) adds, after the family's, the winners of N shapes of the same
    op, layout and dtypes at other widths, nearest shape first, then nearest width; the
    shape's own family and other layouts are not among them, nor repeats."""
    valid = list(variants(CF.family(), arch_info(ARCH)))
    own, w3_near, w6_near, w2_far = valid[1], valid[2], valid[3], valid[4]
    with TuningDB(tmp_path / "old.db") as old:
        _store_winner(old, CF, own)
        _store_kin(old, _kin(65536, width=2), w2_far)
        _store_kin(old, _kin(2048, width=6), w6_near)
        _store_kin(old, _kin(2048, width=3), w3_near)   # as near as width 6's, two widths nearer
        _store_kin(old, _kin(512, width=3), own)        # the shape's own config: not repeated
        cl = _kin(1024, width=3, layout="cl")
        _store_winner(old, cl, default_variant(cl.family()))  # another layout
        assert start_configs(CF, ARCH, [old]) == [own.params]
        assert start_configs(CF, ARCH, [old], widths=1) == [own.params, w3_near.params]
        assert start_configs(CF, ARCH, [old], widths=2) == [own.params, w3_near.params, w6_near.params]
        assert start_configs(CF, ARCH, [old], widths=9) == [own.params, w3_near.params, w6_near.params,
                                                            w2_far.params]


def test_dtype_starts_take_same_size_dtypes_nearest_shape_then_most_dtypes_shared(tmp_path):
    """start_configs(dtypes=N) adds, after the other widths', the winners of N shapes of the
    same op, layout and width at the other dtype pairs whose x has the same element size:
    nearest shape first, then the pair sharing more of the shape's dtypes; fp32 x is not
    among them for a bf16 x (4 bytes, not 2)."""
    valid = list(variants(CF.family(), arch_info(ARCH)))
    own, near_bf16, near_f16, far_f16w32, w3 = valid[1], valid[2], valid[3], valid[4], valid[5]
    with TuningDB(tmp_path / "old.db") as old:
        _store_winner(old, CF, own)
        _store_kin(old, _kin(65536, dtypes="f16/f32"), far_f16w32)
        _store_kin(old, _kin(2048, dtypes="f16"), near_f16)      # as near as bf16/bf16's, both dtypes apart
        _store_kin(old, _kin(2048, dtypes="bf16"), near_bf16)    # the weights' dtype apart only
        _store_kin(old, _kin(1024, dtypes="f32"), valid[6])      # the nearest shape, but 4-byte x
        _store_kin(old, _kin(65536, width=3), w3)
        assert start_configs(CF, ARCH, [old], dtypes=1) == [own.params, near_bf16.params]
        assert start_configs(CF, ARCH, [old], dtypes=9) == [own.params, near_bf16.params, near_f16.params,
                                                            far_f16w32.params]
        assert start_configs(CF, ARCH, [old], widths=1, dtypes=1) == [own.params, w3.params, near_bf16.params]


def test_family_starts_are_tried_after_the_start_config_and_their_neighbours_after_its(db):
    """The search times the shape's own start config, the default, then the family's; every
    one-knob neighbour of the own config comes before those of the family config, and a
    family config that is faster wins (the report's start config stays the shape's own)."""
    default = default_variant(CF.family())
    own = default_variant(CF.family(), max_regs=96)
    valid = {v.key(): v for v in variants(CF.family(), arch_info(ARCH))}
    order = [p.name for p in space_for(CF.family()).params]

    def knobs(a, b):
        return sum(a.params[n] != b.params[n] for n in order)

    family = next(v for v in valid.values() if knobs(v, own) >= 3 and knobs(v, default) >= 3)
    own_near = {k for k, v in valid.items() if knobs(v, own) == 1} - {default.key()}
    family_near = {k for k, v in valid.items() if knobs(v, family) == 1} - own_near - {default.key()}
    assert own_near and family_near
    ev = FakeEvaluator(times=lambda v: 5.0 if v == family else 20.0)
    n = 3 + len(own_near) + 1
    res = tune_shape(CF, ARCH, ev, db, SearchConfig(trials=n, finalists=4),
                     start_configs=[own.params, family.params])
    tried = ev.compiled[:n]
    assert tried[:3] == [own.key(), default.key(), family.key()]
    assert set(tried[3:3 + len(own_near)]) == own_near
    assert tried[-1] in family_near
    assert res.winner == family and res.start == own


def test_start_from_tries_a_winner_whose_source_the_templates_changed(db, tmp_path):
    """The usual re-tune follows a template change: the old winners' sources no longer
    render, but their configs still name today's kernels and are tried first; a config
    that has left the space is not."""
    valid = list(variants(CF.family(), arch_info(ARCH)))
    default = default_variant(CF.family())
    fastest = min(valid, key=fake_time_us)
    with TuningDB(tmp_path / "old.db") as old, TuningDB(tmp_path / "gone.db") as gone:
        _store_winner(old, CF, fastest)
        old.conn.execute("UPDATE winners SET source_hash = ?", ("0" * 64,))
        _store_winner(gone, CF, default)
        gone.conn.execute("UPDATE winners SET config = ?", (json.dumps({**default.params, "no_such_param": 1}),))
        starts = start_configs(CF, ARCH, [old, gone])
    assert starts == [fastest.params]
    ev = FakeEvaluator()
    tune_shape(CF, ARCH, ev, db, SearchConfig(trials=3), start_configs=starts)
    assert ev.compiled[:2] == [fastest.key(), default.key()]


def test_start_from_completes_a_config_stored_before_a_tunable_was_added(tmp_path):
    """vfwd channel-first gained "mend" in session 45: a winner stored before names its
    kernel without it. It starts the re-tune with the tunable's default ("kernel", what it
    always ran); a config with a value the space lacks is still left out."""
    shape = parse_shapes([{"op": "vfwd", "layout": "cf", "dtypes": "bf16", "batch": 8, "dim": 5120,
                           "seqlen": 16384}])[0]
    v = list(variants(shape.family(), arch_info(ARCH)))[5]
    old_config = {k: val for k, val in v.params.items() if k != "mend"}
    assert with_added_params(shape.family(), old_config) == {**old_config, "mend": "kernel"}
    with TuningDB(tmp_path / "old.db") as old:
        _store_winner(old, shape, v)
        old.conn.execute("UPDATE winners SET config = ?", (json.dumps(old_config),))
        assert start_configs(shape, ARCH, [old]) == [{**old_config, "mend": "kernel"}]
        old.conn.execute("UPDATE winners SET config = ?", (json.dumps({**old_config, "nvec": 3}),))
        assert start_configs(shape, ARCH, [old]) == []


def test_start_from_gives_an_untuned_shape_the_winner_its_calls_ran(tmp_path):
    """A shape a DB has not tuned starts from the winner the dispatcher serves its calls from
    that DB: the nearest of the family, fewest differing features first. An update shape on
    states of width entries ("wstate", HF's caches) so starts from the same shape's width-1
    winner; its own winner, once there, comes first and alone."""
    plain, wide = parse_shapes([{"op": "upd", "layout": "cf", "dtypes": "bf16", "batch": 16, "dim": 2048,
                                 "seqlen": 1, "width_state": [False, True]}])
    assert (plain.key(), wide.key()) == ("b16.d2048.l1.bias.silu", "b16.d2048.l1.bias.silu.wstate")
    first, second, third = list(variants(plain.family(), arch_info(ARCH)))[:3]
    far = parse_shapes([{"op": "upd", "layout": "cf", "dtypes": "bf16", "batch": 256, "dim": 8192,
                         "seqlen": 1}])[0]
    wide64 = parse_shapes([{"op": "upd", "layout": "cf", "dtypes": "bf16", "batch": 64, "dim": 2048,
                            "seqlen": 1, "width_state": True}])[0]
    with TuningDB(tmp_path / "old.db") as old:
        _store_winner(old, plain, first)
        _store_winner(old, far, third)
        assert start_configs(wide, ARCH, [old]) == [first.params]
        assert start_configs(wide64, ARCH, [old]) == [first.params]  # nearer than the far shape
        assert start_configs(plain, ARCH, [old]) == [first.params]
        _store_winner(old, wide, second)
        old.conn.execute("UPDATE winners SET features = 'bias,silu,wstate' WHERE shape_key = ?", (wide.key(),))
        assert start_configs(wide, ARCH, [old]) == [second.params]
        assert start_configs(wide64, ARCH, [old]) == [second.params]  # its own features first
        assert start_configs(far, ARCH, [old]) == [third.params]
        other = parse_shapes([{"op": "upd", "layout": "cl", "dtypes": "bf16", "batch": 16, "dim": 2048,
                               "seqlen": 1}])[0]
        assert start_configs(other, ARCH, [old]) == []  # another family's winners are not served


def test_a_start_dbs_own_winner_of_the_shape_comes_before_another_dbs_nearest(tmp_path):
    """A shape dropped from the shipped DB to be re-tuned (its kernel changed with the
    templates) has only a neighbour's winner there and its own in the DB from before the
    drop: its own config is tried first, whichever DB is listed first."""
    near = replace(CF, seqlen=2048)
    own, neighbour = list(variants(CF.family(), arch_info(ARCH)))[:2]
    with TuningDB(tmp_path / "dropped.db") as dropped, TuningDB(tmp_path / "before.db") as before:
        _store_winner(dropped, near, neighbour)
        _store_winner(before, CF, own)
        assert start_configs(CF, ARCH, [dropped, before]) == [own.params, neighbour.params]
        assert start_configs(CF, ARCH, [before, dropped]) == [own.params, neighbour.params]
        _store_winner(dropped, CF, neighbour)  # both hold the shape: the first DB's first
        assert start_configs(CF, ARCH, [dropped, before]) == [neighbour.params, own.params]


def test_the_start_config_is_retimed_beside_the_winner(db, tmp_path):
    """The report sets the winner against the kernel the shape's calls ran before (the first
    start config), re-timed in the same finals."""
    from cc1d.tuner.report import result_dict, table
    valid = list(variants(CF.family(), arch_info(ARCH)))
    default = default_variant(CF.family())
    slow = max((v for v in valid if v != default), key=fake_time_us)
    res = tune_shape(CF, ARCH, FakeEvaluator(), db, SearchConfig(trials=6), start_configs=[slow.params])
    assert res.start == slow and res.winner != slow
    assert res.start_us == pytest.approx(fake_time_us(slow), rel=0.05)
    entry = result_dict(res)
    assert entry["start"] == slow.key() and entry["start_us"] == res.start_us
    assert f"{res.start_us / res.time_us:.3f}x" in table([res]).splitlines()[-1]


def test_report_names_each_winners_source_hash_and_epoch(db, tmp_path):
    """The JSON report is a record of the run: each winner's config, source hash and
    generator epoch, as the DB stores them."""
    from cc1d.generator import EPOCH
    from cc1d.tuner.report import write_report
    res = tune_shape(CF, ARCH, FakeEvaluator(), db, SearchConfig(trials=4))
    write_report(tmp_path / "r.json", [res], arch=ARCH)
    (entry,) = json.loads((tmp_path / "r.json").read_text())["results"]
    (row,) = db.winners()
    assert entry["source_hash"] == row["source_hash"] == res.winner.hash()
    assert entry["epoch"] == row["epoch"] == EPOCH and entry["config"] == json.loads(row["config"])


def test_resume_retunes_a_winner_the_templates_no_longer_render(db):
    """After a template change a stored winner names another kernel: --resume tunes
    the shape again, replaying none of the old trials (they timed other sources)."""
    ev = FakeEvaluator()
    tune_shape(CF, ARCH, ev, db, SearchConfig(trials=5))
    (old,) = db.winners()
    db.conn.execute("UPDATE winners SET source_hash = ?", ("0" * 64,))
    db.conn.commit()
    ev2 = FakeEvaluator()
    res = tune_shape(CF, ARCH, ev2, db, SearchConfig(trials=5, resume=True))
    assert not res.resumed and sorted(ev2.compiled) == sorted(ev.compiled)
    (new,) = db.winners()
    assert new["source_hash"] == res.winner.hash() and new["created_at"] >= old["created_at"]
    # the re-tuned winner is current: the next --resume keeps it
    ev3 = FakeEvaluator()
    assert tune_shape(CF, ARCH, ev3, db, SearchConfig(trials=5, resume=True)).resumed and ev3.timed == []


def test_resume_replays_no_trials_of_another_timing_method(db):
    """A DB from a cc1d that timed another way (here: one that recorded no timing
    method): --resume re-tunes its winners, replaying none of its trials, and the
    winners it stores then name this cc1d's method, so the next --resume keeps them."""
    from cc1d.tuner.measure import TIMING_METHOD
    from cc1d.tuner.search import is_current
    ev = FakeEvaluator()
    tune_shape(CF, ARCH, ev, db, SearchConfig(trials=5))
    (row,) = db.winners()
    assert json.loads(row["environment"])["timing_method"] == TIMING_METHOD and is_current(CF, row)
    db.conn.execute("DELETE FROM meta WHERE key LIKE 'timing_method%'")
    db.conn.execute("UPDATE winners SET environment = '{}'")
    db.conn.commit()
    assert not is_current(CF, db.winners()[0])
    ev2 = FakeEvaluator()
    res = tune_shape(CF, ARCH, ev2, db, SearchConfig(trials=5, resume=True))
    assert not res.resumed and sorted(ev2.compiled) == sorted(ev.compiled)  # every trial measured again
    assert db.meta()["timing_method"] == str(TIMING_METHOD)
    ev3 = FakeEvaluator()
    assert tune_shape(CF, ARCH, ev3, db, SearchConfig(trials=5, resume=True)).resumed and ev3.timed == []


def test_resume_of_a_partial_run_of_this_method_replays_its_trials(db):
    """Trials of this method, stored after the DB adopted it, are replayed: the cut-off
    only keeps older methods' trials out."""
    from cc1d.tuner.measure import TIMING_METHOD
    db.add_trial(run_id="old", arch=ARCH, family_key=CF.family().key(), shape_key=CF.key(),
                 variant_key=default_variant(CF.family()).key(), config=default_variant(CF.family()).params,
                 status="ok", time_us=0.001)  # an older method's (absurd) time
    time.sleep(1.1)  # created_at has one-second resolution
    assert db.adopt_timing_method(TIMING_METHOD) != ""
    time.sleep(1.1)
    ev = FakeEvaluator()
    tune_shape(CF, ARCH, ev, db, SearchConfig(trials=4, finalize=False))  # a killed run: trials only
    ev2 = FakeEvaluator()
    res = tune_shape(CF, ARCH, ev2, db, SearchConfig(trials=4, resume=True))
    assert ev2.compiled == [] and res.winner is not None
    assert db.winners()[0]["time_us"] > 0.01  # the old method's time did not win


RUN = r"""
import sys
from cc1d.tuner.db import TuningDB
from cc1d.tuner.search import SearchConfig, tune_shape
from cc1d.tuner.shapes import parse_shapes
from cc1d.tuner.testing import FakeEvaluator
db_path, storage = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
if len(sys.argv) > 3:  # a start line: wait (at most a minute) until every worker is ready here,
    import os, time    # so a slow interpreter start cannot leave one worker all the trials
    barrier, workers = sys.argv[3], int(sys.argv[4])
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(barrier)) < workers and time.monotonic() < deadline:
        time.sleep(0.01)
import os
kw = {"run_id": f"worker-{os.getpid()}"}  # one id for both shapes: which worker ran a trial
if storage:
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    kw["storage"] = JournalStorage(JournalFileBackend(storage))
shapes = parse_shapes([{"layout": ["cf", "cl"], "batch": 2, "dim": 256, "seqlen": 1024}])
with TuningDB(db_path) as db:
    for s in shapes:
        tune_shape(s, "sm_90", FakeEvaluator(sleep_s=0.02), db,
                   SearchConfig(trials=12, resume=True, finalize=storage is None), **kw)
"""


def _trial_count(path):
    try:
        with TuningDB(path) as d:
            return d.conn.execute("SELECT count(*) FROM trials").fetchone()[0]
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def test_resume_after_sigkill_loses_nothing(tmp_path):
    path = tmp_path / "t.db"
    seen = 0
    for _ in range(3):  # kill mid-search, each time after a few more trials are stored
        proc = subprocess.Popen([sys.executable, "-P", "-c", RUN, str(path)], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while _trial_count(path) < seen + 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode in (-9, 0), proc.stderr.read().decode()
        now = _trial_count(path)
        assert now >= seen
        seen = now
    proc = subprocess.run([sys.executable, "-P", "-c", RUN, str(path)], capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    with TuningDB(path) as d:
        assert d.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert len(d.winners()) == 2 and d.validate() == []
        for s in (CF, CL):
            rows = d.trials(ARCH, s.family().key(), s.key())
            keys = [r["variant_key"] for r in rows]
            assert len(keys) == len(set(keys)), "a stored trial was measured again"
            assert sum(r["status"] != "invalid" for r in rows) == 12


def test_two_processes_share_one_study_through_a_journal(tmp_path):
    path, journal, barrier = tmp_path / "t.db", tmp_path / "study.journal", tmp_path / "ready"
    barrier.mkdir()
    procs = [subprocess.Popen([sys.executable, "-P", "-c", RUN, str(path), str(journal), str(barrier), "2"],
                              stderr=subprocess.PIPE)
             for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    with TuningDB(path) as d:
        assert d.winners() == []  # workers only run trials
        run_ids = set()
        for s in (CF, CL):
            rows = [r for r in d.trials(ARCH, s.family().key(), s.key()) if r["status"] != "invalid"]
            # the cap is shared; candidates already compiling ahead when it is reached still finish
            assert 12 <= len({r["variant_key"] for r in rows}) <= 12 + 2 * 3
            run_ids |= {r["run_id"] for r in rows}
        # both workers took part, in one shape at least: on a loaded 2-core machine one can
        # reach a shape's cap before the other's first trial there (session 73's CI)
        assert len(run_ids) == 2
    # the parent finalizes from the shared study
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    storage = JournalStorage(JournalFileBackend(str(journal)))
    with TuningDB(path) as d:
        ev = FakeEvaluator()
        res = tune_shape(CF, ARCH, ev, d, SearchConfig(trials=12, resume=True), storage=storage)
        assert res.winner is not None and ev.compiled == []
        assert d.winner(ARCH, CF.family().key(), CF.key())["variant_key"] == res.winner.key()
