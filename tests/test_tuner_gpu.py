"""A real cc1d-tune run on the device: winners stored, no slower than the default
within the noise, and each winner validates against the float64 reference."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SHAPES = """\
shapes:
  - {layout: cf, dtypes: bf16/f32, width: 4, batch: 2, dim: 1024, seqlen: 2048}
  - {layout: cl, dtypes: f16, width: 3, batch: 1, dim: 2048, seqlen: 1000, bias: false}
  - {op: bwd, layout: [cf, cl], dtypes: bf16, width: 4, batch: 2, dim: 256, seqlen: 1000,
     initial_states: true, final_states: true}
"""
N_SHAPES = 4


def _tune(tmp_path, *extra):
    """Run the real cc1d-tune over SHAPES into tmp_path/t.db; returns (process, db path)."""
    shapes, db_path = tmp_path / "shapes.yaml", tmp_path / "t.db"
    shapes.write_text(SHAPES)
    # -P and cwd: the repo root's cc1d/ folder must not shadow the installed package
    proc = subprocess.run([sys.executable, "-P", "-m", "cc1d.tuner", "--shapes", str(shapes), "--db",
                           str(db_path), *extra], capture_output=True, text=True, cwd=tmp_path,
                          timeout=900, env={**os.environ, "CC1D_CACHE_DIR": str(tmp_path / "cache")})
    return proc, db_path


def test_real_tuning_run(tmp_path, monkeypatch):
    from cc1d._runtime import runtime
    from cc1d.generator import Variant
    from cc1d.tuner.db import TuningDB, family_from_key
    from cc1d.tuner.evaluate import GpuEvaluator
    from cc1d.tuner.shapes import load_shapes

    monkeypatch.setenv("CC1D_CACHE_DIR", str(tmp_path / "cache"))  # also for validate() below
    shapes, report = tmp_path / "shapes.yaml", tmp_path / "r.json"
    proc, db_path = _tune(tmp_path, "--trials", "8", "--report", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(json.loads(report.read_text())["results"]) == N_SHAPES
    rt = runtime()
    with TuningDB(db_path) as db:
        winners = db.winners()
        assert len(winners) == N_SHAPES and db.validate() == []
        for w, shape in zip(winners, sorted(load_shapes(shapes), key=lambda s: (s.family().key(), s.key()))):
            assert (w["family_key"], w["shape_key"]) == (shape.family().key(), shape.key())
            assert w["default_us"] is not None
            assert w["time_us"] <= w["default_us"] * (1 + w["spread"]) + 1e-9, w
            assert 0 < w["copy_fraction"] < 1.5
            v = Variant.of(family_from_key(w["family_key"]), **json.loads(w["config"]))
            GpuEvaluator(rt, shape, w["arch"]).validate(v)  # raises CandidateError if wrong


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_workers_share_one_study(tmp_path):
    from cc1d.tuner.db import TuningDB

    proc, db_path = _tune(tmp_path, "--workers", "2", "--trials", "8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with TuningDB(db_path) as db:
        assert len(db.winners()) == N_SHAPES and db.validate() == []


def test_more_workers_than_gpus_is_refused(tmp_path):
    n = torch.cuda.device_count()
    proc, _ = _tune(tmp_path, "--workers", str(n + 1), "--trials", "2")
    assert proc.returncode == 2
    assert "--workers" in proc.stderr and "concurrently" in proc.stderr, proc.stderr


def test_runtime_uses_the_tuned_winner(tmp_path):
    """The winners cc1d-tune writes are what causal_conv1d_fn then launches."""
    import cc1d
    from cc1d.tuner.db import TuningDB

    proc, db_path = _tune(tmp_path, "--trials", "6")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with TuningDB(db_path) as db:
        winner = next(w for w in db.winners() if w["family_key"] == "fwd.cf.bf16wf32.w4")
    x = torch.randn(2, 1024, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 4, device="cuda")
    b = torch.randn(1024, device="cuda")
    cc1d.set_tuning_db(db_path)
    try:
        e = cc1d.explain(x, w, b, activation="silu")
        assert (e["reason"], e["source"], e["key"]) == ("exact", str(db_path), winner["variant_key"]), e
        out = cc1d.causal_conv1d_fn(x, w, b, activation="silu")
        ref = cc1d.causal_conv1d_ref(x.double(), w.double(), b.double(), activation="silu")
        err = float((out.double() - ref).norm() / ref.norm())
        assert err < 2e-2, err
        # a neighbouring, untuned shape reuses the nearest winner whose requirements hold
        e = cc1d.explain(x[:1, :, :1000], w, b, activation="silu")
        assert e["reason"] in ("nearest", "default"), e
        # the backward's tuned winner serves its shape too
        from cc1d._runtime import runtime
        from cc1d.backward import _bwd_call_args
        with TuningDB(db_path) as db:
            bwin = next(r for r in db.winners() if r["family_key"] == "bwd.cf.bf16wbf16.w4")
        xb = torch.randn(2, 256, 1000, device="cuda", dtype=torch.bfloat16)
        wb, bb = torch.randn(256, 4, device="cuda", dtype=torch.bfloat16), torch.randn(256, device="cuda",
                                                                                       dtype=torch.bfloat16)
        st = torch.randn(2, 256, 3, device="cuda", dtype=torch.bfloat16)
        args = _bwd_call_args(xb, wb, bb, None, st, torch.randn_like(xb), torch.randn_like(st),
                              torch.empty_like(xb), torch.empty_like(st), torch.empty_like(wb),
                              torch.empty_like(bb), None, True)
        e = runtime().explain_bwd(*args)
        assert (e["reason"], e["key"]) == ("exact", bwin["variant_key"]), e
    finally:
        cc1d.set_tuning_db()


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("width", [2, 3, 4])
def test_update_problem_reaches_its_own_layout(layout, width):
    """The tuner's update inputs are served by the shape's own layout family (a dense width-2
    state is dim-contiguous too, which the runtime would serve as "cl"), and the family's
    default kernel matches the reference on them."""
    from cc1d.generator import Family, default_variant
    from cc1d._runtime import runtime
    from cc1d.tuner.problems import problem_for
    from cc1d.tuner.shapes import Shape
    from cc1d.tuner.validate import validate
    problem = problem_for("upd")
    shape = Shape("upd", layout, "bf16", "f32", width, 5, 40, 1)
    variant = default_variant(Family("upd", layout, "bf16", "f32", width))
    stream = torch.cuda.current_stream().cuda_stream
    launch = lambda i, o: problem.launch(runtime(), variant.as_runtime_dict(), shape, i, o, stream)  # noqa: E731
    assert validate(problem, shape, launch, seed=7) is None


def test_update_timing_flushes_the_l2_before_each_launch():
    """The decode update is timed after an L2-sized fill before every launch, the fills' own
    time taken off: the timing is a finite positive per-launch time, and the candidate still
    ran on every input set (each output written)."""
    from cc1d.generator import Family, default_variant
    from cc1d._runtime import runtime
    from cc1d.tuner.measure import CudaTimer
    from cc1d.tuner.problems import problem_for
    from cc1d.tuner.shapes import Shape
    problem = problem_for("upd")
    assert problem.runs_between_kernels and not getattr(problem_for("fwd"), "runs_between_kernels", False)
    shape = Shape("upd", "cl", "bf16", "bf16", 4, 16, 5120, 1)
    kernel = default_variant(Family("upd", "cl", "bf16", "bf16", 4)).as_runtime_dict()
    timer = CudaTimer(problem, shape)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    assert timer.flush is not None and timer.flush.numel() >= 2 * l2
    t = timer.time(lambda i, o, s: problem.launch(runtime(), kernel, shape, i, o, s), None)
    assert 0 < t.median_us < 1e3 and t.samples == timer.cfg.flush_stages[-1], t
    for _, outputs in timer.sets:
        assert not torch.isnan(outputs["out"]).any(), "a rotated set the timed graph never launched on"


def test_warm_timing_where_the_timing_flushes():
    """The warm tie-break timing: a finite per-launch time for the update (timed after
    flushes otherwise), None for the forward (whose timing is warm already)."""
    from cc1d.generator import Family, default_variant
    from cc1d._runtime import runtime
    from cc1d.tuner.evaluate import GpuEvaluator
    from cc1d.tuner.shapes import Shape
    upd = Shape("upd", "cl", "bf16", "bf16", 4, 16, 5120, 1)
    ev = GpuEvaluator(runtime(), upd, "sm_90")
    v = default_variant(Family("upd", "cl", "bf16", "bf16", 4))
    t = ev.time_warm(v)
    assert t is not None and 0 < t.median_us < 1e3 and t.samples >= 5, t
    fwd = Shape("fwd", "cf", "bf16", "bf16", 4, 1, 256, 1000)
    assert GpuEvaluator(runtime(), fwd, "sm_90").time_warm(default_variant(fwd.family())) is None
