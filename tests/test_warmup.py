"""Warm-up without a GPU: the runtime's prepare_fwd checks its arguments and
fails clearly without a device; dispatch_stats counts decisions; cc1d.warmup
rejects bad arguments naming them (torch needed, no GPU). The GPU side (graph
capture after warm-up) is tests/test_dispatch_gpu.py."""
from __future__ import annotations

import pytest

import cc1d

ARCH = "sm_999"  # nobody tunes it: decisions come from the catalog
X, W, B, OUT = 1 << 32, 2 << 32, 3 << 32, 4 << 32  # 4 GiB apart: out overlaps nothing


def _args(b=2, d=16, l=128, width=4):
    strides = (d * l, l, 1, width, 1, 1, d * l, l, 1, 0, 0, 0, 0, 0, 0, 0, 0)
    return (X, W, B, 0, 0, OUT, 0), (b, d, l, width), strides, 2, 0, True


def _gpu(rt) -> str | None:
    for vendor in ("cuda", "hip"):
        try:
            return rt.device_target(vendor, 0)
        except RuntimeError:
            pass
    return None


def test_prepare_without_a_gpu_is_a_clear_runtime_error(rt):
    if _gpu(rt):
        pytest.skip(f"a GPU is present ({_gpu(rt)}): tests/test_dispatch_gpu.py covers prepare")
    before = cc1d.dispatch_stats()
    with pytest.raises(RuntimeError, match="no GPU to prepare for"):
        rt.prepare_fwd(*_args())
    with pytest.raises(RuntimeError, match="no GPU to prepare for"):
        rt.prepare_fwd(*_args(), device=0)
    with pytest.raises(ValueError, match=r"width must be in \[2, 8\], got 9"):
        rt.prepare_fwd(*_args(width=9))  # the arguments are checked first
    assert cc1d.dispatch_stats() == before


def test_dispatch_stats_count_fresh_decisions_only(rt):
    shape = (7, 77, 7777)  # not asked elsewhere in this process
    before = cc1d.dispatch_stats()
    rt.explain_fwd(*_args(*shape), 0, ARCH)
    after_one = cc1d.dispatch_stats()
    assert after_one["decisions"] == before["decisions"] + 1
    rt.explain_fwd(*_args(*shape), 0, ARCH)  # memoised
    assert cc1d.dispatch_stats() == after_one
    assert after_one["loads"] == before["loads"]  # explaining loads nothing


BAD = [
    (dict(shapes=5), TypeError, "shapes: expected an iterable of (batch, dim, seqlen) tuples, got int"),
    (dict(shapes="b2d64"), TypeError, "shapes: expected an iterable"),
    (dict(shapes=[(1, 2, 3), (1, 2)]), ValueError, "shapes[1]: expected a (batch, dim, seqlen) tuple of 3 ints"),
    (dict(shapes=[(1, 0, 3)]), ValueError, "shapes[0][1] (dim): expected an int >= 1, got 0"),
    (dict(shapes=[(1, 2, 3.0)]), TypeError, "shapes[0][2] (seqlen): expected an int, got float 3.0"),
    (dict(dtype="bf16"), TypeError, "dtype: expected one of (torch.float32, torch.float16, torch.bfloat16)"),
    (dict(weight_dtype="float64"), TypeError, "weight_dtype: expected one of (torch.bfloat16, torch.float32)"),
    (dict(width=9), ValueError, "width: expected an int in 2..8, got 9"),
    (dict(width="4"), TypeError, "width: expected an int"),
    (dict(layout="ncl"), ValueError, "layout: expected 'cf' (channel-first) or 'cl' (channel-last), got 'ncl'"),
    (dict(bias=1), TypeError, "bias: expected True or False, got 1"),
    (dict(activation="gelu"), ValueError, "activation: expected None, 'silu' or 'swish', got 'gelu'"),
    (dict(return_final_states=None), TypeError, "return_final_states: expected True or False"),
    (dict(backward="yes"), TypeError, "backward: expected True or False"),
    (dict(device="cpu"), ValueError, "device: expected a CUDA/ROCm device like 'cuda:0', got 'cpu'"),
    (dict(device=1.0), TypeError, "device: expected None, an int, a str or a torch.device, got float"),
]


@pytest.mark.parametrize("kwargs, exc, words", BAD, ids=[f"{next(iter(b[0]))}-{i}" for i, b in enumerate(BAD)])
def test_warmup_argument_errors_name_the_argument(kwargs, exc, words):
    torch = pytest.importorskip("torch")
    kwargs = dict(kwargs)
    for k in ("dtype", "weight_dtype"):
        if kwargs.get(k) == "float64":
            kwargs[k] = torch.float64
    shapes = kwargs.pop("shapes", [(2, 64, 128)])
    with pytest.raises(exc) as info:
        cc1d.warmup(shapes, **kwargs)
    assert str(info.value).startswith("warmup: ") and words in str(info.value), str(info.value)


def test_warmup_without_a_device(rt):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a device is present: tests/test_dispatch_gpu.py covers warmup")
    with pytest.raises(RuntimeError, match="torch sees none"):
        cc1d.warmup([(2, 64, 128)])
