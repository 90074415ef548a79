"""cc1d.explain_bwd: which kernel causal_conv1d_bwd would launch, and why, with no GPU
(CPU tensors and an explicit arch): the runtime's decision for the buffers the call would
have (x made contiguous, dout copied to x's layout, dx allocated where the call does so),
exact and nearest entries by the backward's distance, and its argument checks."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import cc1d  # noqa: E402
from cc1d import backward  # noqa: E402
from cc1d.generator import Family, fallback_chain  # noqa: E402
from test_bwd_runtime import ARCH, tuned_bwd_db  # noqa: E402  (its DBs of backward winners)

CL = Family("bwd", "cl", "bf16", "bf16", 4)  # channel-last: no tiling misfit to rank before the distance


@pytest.fixture
def rt(clean_rt):  # conftest.py: no caller DB, an empty memo, restored after
    return clean_rt


def tensors(b=2, d=64, n=128, layout="cf"):
    def act():
        t = torch.randn(b, d, n, dtype=torch.bfloat16)
        return t if layout == "cf" else t.transpose(1, 2).contiguous().transpose(1, 2)
    x, dout = act(), act()
    w = torch.randn(d, 4, dtype=torch.bfloat16)
    bias = torch.randn(d, dtype=torch.bfloat16)
    return x, w, bias, dout


def runtime_decision(rt, x, w, bias, dout, dx=None):
    """rt.explain_bwd of the call with real buffers for every gradient (what causal_conv1d_bwd passes)."""
    b, d, n = x.shape
    dx = torch.empty_like(x) if dx is None else dx
    args = backward._bwd_call_args(x, w, bias, None, None, dout, None, dx, None, torch.empty(d, 4, dtype=w.dtype),
                                   torch.empty(d, dtype=w.dtype), None, True)
    return rt.explain_bwd(*args, arch=ARCH)


def test_exact_and_nearest_entries_by_the_backwards_distance(rt, tmp_path):
    """(1, 64, 1024) and (8, 64, 128) are the same work, which batch x seqlen cannot tell
    apart; the backward's distance (|ln batch| + 2 |ln seqlen| + 0.5 |ln dim|) can."""
    chain = fallback_chain(CL)
    a, b = chain[0], chain[-1]  # two kernels every call here can run
    db = tuned_bwd_db(tmp_path / "t.db", [(a, (1, 64, 1024)), (b, (8, 64, 128))])
    cc1d.set_tuning_db(db)

    def explain(*sizes):
        x, w, bias, dout = tensors(*sizes, layout="cl")
        return cc1d.explain_bwd(x, w, bias, dout, activation="silu", arch=ARCH)
    e = explain(1, 64, 1024)
    assert (e["reason"], e["key"], e["source"], e["distance"]) == ("exact", a.key(), db, 0)
    e = explain(4, 64, 512)
    assert (e["reason"], e["key"], e["distance"]) == ("nearest", a.key(), pytest.approx(4 * math.log(2)))
    e = explain(16, 128, 256)
    assert (e["matched_shape"], e["key"]) == ("b8.d64.l128.bias.silu", b.key())
    assert e["distance"] == pytest.approx(3 * math.log(2) + 0.5 * math.log(2))
    assert "far from this call" in e["detail"]  # past 2 ln 2: further than a seqlen factor of 2 alone


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_the_decision_is_the_runtimes_for_the_calls_buffers(rt, layout):
    x, w, bias, dout = tensors(3, 96, 1000, layout)
    want = runtime_decision(rt, x, w, bias, dout)
    assert want["key"].startswith(f"bwd.{layout}.")
    got = cc1d.explain_bwd(x, w, bias, dout, activation="silu", arch=ARCH)
    assert got == want
    # dout in the other layout is copied to x's first: the same kernel
    other = dout.contiguous() if layout == "cl" else dout.transpose(1, 2).contiguous().transpose(1, 2)
    assert cc1d.explain_bwd(x, w, bias, other, activation="silu", arch=ARCH)["key"] == want["key"]
    # a caller's dx of x's layout is used as it is: its alignment counts
    dx = torch.empty_like(x)
    assert cc1d.explain_bwd(x, w, bias, dout, dx=dx, activation="silu", arch=ARCH) == \
        runtime_decision(rt, x, w, bias, dout, dx)


def test_x_of_neither_layout_is_explained_as_made_contiguous(rt):
    x, w, bias, dout = tensors(2, 64, 128)
    strided = torch.randn(2, 64, 256, dtype=torch.bfloat16)[:, :, ::2]  # no unit inner stride
    e = cc1d.explain_bwd(strided, w, bias, dout, activation="silu", arch=ARCH)
    assert e["key"].startswith("bwd.cf.") and e["shape"] == "b2.d64.l128.bias.silu"


def test_an_odd_offset_x_changes_the_alignment(rt):
    x, w, bias, dout = tensors(2, 64, 128)
    assert cc1d.explain_bwd(x, w, bias, dout, activation="silu", arch=ARCH)["alignment"] >= 16
    shifted = torch.randn(2 * 64 * 128 + 1, dtype=torch.bfloat16)[1:].view(2, 64, 128)  # one element off
    e = cc1d.explain_bwd(shifted, w, bias, dout, activation="silu", arch=ARCH)
    assert e["alignment"] == 2 and e == runtime_decision(rt, shifted, w, bias, dout)


def test_bad_arguments_name_the_function_and_the_argument(rt):
    x, w, bias, dout = tensors()
    with pytest.raises(ValueError, match=r"^causal_conv1d_bwd: return_dinitial_states: expected initial_states"):
        cc1d.explain_bwd(x, w, bias, dout, return_dinitial_states=True, arch=ARCH)
    with pytest.raises(ValueError, match=r"^causal_conv1d_bwd: dout: expected shape"):
        cc1d.explain_bwd(x, w, bias, dout[:, :, :5], arch=ARCH)
    with pytest.raises(ValueError, match=r"^causal_conv1d_bwd: x: expected a CUDA/ROCm tensor, got a tensor on cpu"):
        cc1d.explain_bwd(x, w, bias, dout)  # no arch: x's device is the target
    with pytest.raises(ValueError, match=r"^causal_conv1d_bwd: activation: expected"):
        cc1d.explain_bwd(x, w, bias, dout, activation="relu", arch=ARCH)


def test_explain_bwd_is_public():
    assert "explain_bwd" in cc1d.__all__ and cc1d.explain_bwd is backward.explain_bwd


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_on_the_gpu_the_device_is_the_target(layout):
    """Without arch, x's device names the target: the decision equals the runtime's for
    that target, and the kernel it names is the one prepare_bwd (warm-up) loads."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA/ROCm GPU")
    from cc1d._runtime import runtime
    rt = runtime()
    x, w, bias, dout = (t.cuda() for t in tensors(2, 4096, 2048, layout))
    e = cc1d.explain_bwd(x, w, bias, dout, activation="silu")
    target = rt.device_target("hip" if torch.version.hip else "cuda", x.device.index)
    assert e["arch"] == target
    on_cpu = cc1d.explain_bwd(x.cpu(), w.cpu(), bias.cpu(), dout.cpu(), activation="silu", arch=target)
    fields = ("key", "reason", "source", "matched_shape", "distance")
    assert {k: e[k] for k in fields} == {k: on_cpu[k] for k in fields}
    warm = cc1d.warmup([(2, 4096, 2048)], dtype=torch.bfloat16, weight_dtype=torch.bfloat16, layout=layout,
                       activation="silu", backward=True)
    assert warm[0]["bwd"]["key"] == e["key"]
