"""benchmarks/bench_walk_cut.py without a GPU: which winners it times (those the dispatcher
serves through their walk-cut build at their own shape), the shapes it builds, its
refusals. Its timing runs on the device (docs/performance/bench_walk_cut_s75_h200.log)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cc1d.tuner.db import TuningDB, winner_variant
from conftest import BENCHMARKS, benchmark_script

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "tuning_db" / "sm_90.db"


@pytest.fixture(scope="module")
def bench():
    return benchmark_script("bench_walk_cut")


def test_it_picks_the_walked_winners_whose_own_shape_cuts_a_segment(bench):
    picked = bench.served_through_walk_cut(SHIPPED, "sm_90")
    assert len(picked) > 40  # 52 when session 75 timed them, more after its run
    keys = {(w["family_key"], w["shape_key"]) for w in picked}
    with TuningDB(SHIPPED, readonly=True) as db:
        for w in db.winners("sm_90"):
            if w["op"] != "bwd":
                continue
            feats = set(w["features"].split(","))
            build = winner_variant(w).served_build(w["seqlen"], "sm_90", seq_idx="seqidx" in feats,
                                                   final_states="final" in feats)
            assert ((w["family_key"], w["shape_key"]) in keys) == (build == "walkcut"), w["shape_key"]
    assert all(int(winner_variant(w).params["nvec"]) > 4 for w in picked)  # walked ones only
    assert not bench.served_through_walk_cut(SHIPPED, "gfx942")  # none there: not served on AMD


def test_the_shape_of_a_winner_and_what_it_refuses(bench):
    w = dict(family_key="bwd.cf.f16wf16.w4", shape_key="b8.d5120.l3000.bias.silu", batch=8, dim=5120,
             seqlen=3000, features="bias,silu")
    s = bench.shape_of(w)
    assert (s.op, s.layout, s.x_dtype, s.w_dtype, s.width, s.batch, s.dim, s.seqlen, s.bias, s.activation) == \
        ("bwd", "cf", "f16", "f16", 4, 8, 5120, 3000, True, "silu")
    assert bench.shape_of(dict(w, family_key="bwd.cf.bf16wf32.w2", features="")).activation == "none"
    with pytest.raises(ValueError, match="only bias and silu are timed here"):
        bench.shape_of(dict(w, features="bias,silu,seqidx"))


def test_a_row_says_which_build_failed(bench):
    row = dict(family="bwd.cf.f16wf16.w4", shape="b8.d5120.l3000.bias.silu",
               variant="bwd.cf.f16wf16.w4.t128.v16.n16.r4.g96.s2048", plain_us=261.0, walkcut_us=230.0,
               plain_copy=0.66, walkcut_copy=0.75, speedup=261 / 230, valid=False, plain_problem=None,
               walkcut_problem="dx: 3 of 100 elements NaN (unwritten or invalid)", peer_us=215.0)
    text = bench.line(row)
    assert "| 261.0 (66 %) | 230.0 (75 %) | 1.13x | 215.0 | 0.93x" in text
    assert text.endswith("INVALID: walkcut dx: 3 of 100 elements NaN (unwritten or invalid) |")


def test_the_cli_refuses_bad_rounds_and_needs_a_gpu(tmp_path):
    script = str(BENCHMARKS / "bench_walk_cut.py")
    r = subprocess.run([sys.executable, script, "--rounds", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--rounds: expected a whole number >= 1, got 0" in r.stderr
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the no-GPU refusal is not reachable")
    r = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "bench_walk_cut: no CUDA device" in r.stderr
