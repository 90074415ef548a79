"""A tuned winner whose source hashes right but does not compile, on the GPU
(marker gpu): the forward, the backward and warmup warn once, fall back and match the
float64 reference; later calls do not warn again. (The CPU side, through
precompile_fwd, is in test_db_faults.py.)"""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cc1d  # noqa: E402
from cc1d._runtime import runtime  # noqa: E402
from cc1d.generator import Family, Variant, fallback_chain  # noqa: E402
from cc1d.tuner.db import TuningDB  # noqa: E402

from test_db_faults import break_source  # noqa: E402
from test_dispatch import V16  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPE = (8, 64, 4096)  # b, d, l: enough work that split_blocks sets the backward's workspace


def tuned_db(path: Path, variant: Variant, arch: str) -> str:
    b, d, l = SHAPE
    with TuningDB(path) as db:
        db.put_winner(variant.source, arch=arch, family_key=variant.family.key(),
                      shape_key=f"b{b}.d{d}.l{l}.bias.silu", op=variant.family.op, batch=b, dim=d, seqlen=l,
                      features="bias,silu", variant_key=variant.key(), config=variant.params,
                      source_hash=variant.hash(), **variant.geometry(), time_us=10.0,
                      environment={"device": "test"})
        db.finalize()
    return str(path)


@pytest.fixture
def broken_winner(tmp_path, request):
    """A DB whose only winner (of request.param's op) does not compile, the
    dispatcher pointed at it alone, and the runtime's warnings collected."""
    rt = runtime()
    arch = rt.device_target("cuda", torch.cuda.current_device())
    if request.param == "fwd":
        variant = V16[0]  # fwd.cf.bf16wf32.w4, not the catalog's own
    else:  # the catalog's split_blocks 2048 needs a 4x larger workspace: sized after the fallback
        fam = Family("bwd", "cf", "bf16", "f32", 4)
        variant = Variant.of(fam, **{**fallback_chain(fam)[0].params, "split_blocks": 512})
    path = tuned_db(tmp_path / "t.db", variant, arch)
    break_source(path, variant.key(), str(tmp_path))
    (tmp_path / "empty").mkdir()
    logs: list[str] = []
    rt.set_log_handler(logs.append)
    rt.set_package_dir(str(tmp_path / "empty"))  # no shipped DB: the fallback is the catalog
    cc1d.set_tuning_db(path)
    try:
        yield path, variant.key(), logs
    finally:
        rt.set_log_handler(None)
        cc1d.set_tuning_db()
        rt.set_package_dir(str(Path(cc1d.__file__).resolve().parent))
        rt.clear_dispatch_cache()


def inputs(seed: int):
    b, d, l = SHAPE
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, d, l, generator=gen).to(torch.bfloat16).cuda()
    w = (torch.randn(d, 4, generator=gen) / 2).cuda()
    bias = torch.randn(d, generator=gen).cuda()
    return x, w, bias


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    assert not torch.isnan(got).any()
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("broken_winner", ["fwd"], indirect=True)
def test_forward_falls_back_from_a_winner_that_does_not_compile(broken_winner):
    path, key, logs = broken_winner
    x, w, bias = inputs(0)
    assert cc1d.explain(x, w, bias, activation="silu")["key"] == key  # not compiled yet
    for seed in (0, 1):  # the second call neither warns nor tries the winner again
        x, w, bias = inputs(seed)
        out = cc1d.causal_conv1d_fn(x, w, bias, activation="silu")
        want = cc1d.causal_conv1d_ref(x.double(), w.double(), bias.double(), activation="silu")
        assert rel_l2(out, want) < 1e-2
        assert len(logs) == 1, logs
    assert path in logs[0] and key in logs[0] and "does not compile" in logs[0], logs
    e = cc1d.explain(x, w, bias, activation="silu")
    assert (e["reason"], e["source"]) == ("default", "catalog") and e["key"] != key
    assert f"{key} in {path} skipped: its source does not compile" in e["detail"], e["detail"]


@pytest.mark.parametrize("broken_winner", ["bwd"], indirect=True)
def test_backward_falls_back_from_a_winner_that_does_not_compile(broken_winner):
    path, key, logs = broken_winner
    for seed in (0, 1):
        x, w, bias = inputs(seed)
        dout = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 7)).to(x.dtype).cuda()
        dx, dw, db, _ = cc1d.causal_conv1d_bwd(x, w, bias, dout, activation="silu")
        xr, wr, br = (t.double().requires_grad_() for t in (x, w, bias))
        cc1d.causal_conv1d_ref(xr, wr, br, activation="silu").backward(dout.double())
        for got, want in ((dx, xr.grad), (dw, wr.grad), (db, br.grad)):
            assert rel_l2(got, want) < 1e-2
        assert len(logs) == 1, logs
    assert path in logs[0] and key in logs[0] and "does not compile" in logs[0], logs


@pytest.mark.parametrize("broken_winner", ["fwd"], indirect=True)
def test_warmup_falls_back_from_a_winner_that_does_not_compile(broken_winner):
    path, key, logs = broken_winner
    # backward=True: two sources, so they are compiled in parallel before prepare_* runs
    (e,) = cc1d.warmup([SHAPE], weight_dtype=torch.float32, backward=True)
    assert (e["fwd"]["reason"], e["fwd"]["source"]) == ("default", "catalog") and e["fwd"]["key"] != key
    assert len(logs) == 1 and path in logs[0] and key in logs[0], logs
    x, w, bias = inputs(2)
    before = cc1d.dispatch_stats()
    out = cc1d.causal_conv1d_fn(x, w, bias, activation="silu")
    assert cc1d.dispatch_stats()["loads"] == before["loads"]  # warmed up: the fallback is loaded already
    want = cc1d.causal_conv1d_ref(x.double(), w.double(), bias.double(), activation="silu")
    assert rel_l2(out, want) < 1e-2 and len(logs) == 1
