"""The runtime's argument checks and failure paths through the pybind11 layer,
without torch or a GPU: each error is the right Python type and names the field."""
from __future__ import annotations

import pytest

from cc1d.generator import Family, default_variant

# fake but well-aligned addresses: the checks run before any memory is touched
X, W, B, OUT = 1 << 20, 2 << 20, 3 << 20, 4 << 20
CF = (2048, 128, 1)             # x (batch, dim, seqlen) strides: channel-first, 2 x 16 x 128
NONE3 = (0, 0, 0)


def call(rt, *, sizes=(2, 16, 128, 4), x_strides=CF, out_strides=CF, w_strides=(4, 1),
         ptrs=(X, W, B, 0, 0, OUT, 0), x_dtype=2, w_dtype=0, silu=True):
    strides = (*x_strides, *w_strides, 1, *out_strides, 0, 0, *NONE3, *NONE3)
    rt.fwd(ptrs, sizes, strides, x_dtype, w_dtype, silu, 0)


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(sizes=(2, 16, 128, 1)), ValueError, "width"),
    (dict(sizes=(2, 16, 128, 9)), ValueError, "width"),
    (dict(sizes=(0, 16, 128, 4)), ValueError, "batch"),
    (dict(sizes=(2, 0, 128, 4)), ValueError, "dim"),
    (dict(sizes=(2, 16, 0, 4)), ValueError, "seqlen"),
    (dict(ptrs=(0, W, B, 0, 0, OUT, 0)), ValueError, "x must not be null"),
    (dict(ptrs=(X, 0, B, 0, 0, OUT, 0)), ValueError, "weight must not be null"),
    (dict(ptrs=(X, W, B, 0, 0, 0, 0)), ValueError, "out must not be null"),
    (dict(ptrs=(X + 1, W, B, 0, 0, OUT, 0)), ValueError, "x must be aligned"),
    (dict(x_strides=(2048, 2, 2)), ValueError, "x_l_stride == 1"),
    (dict(out_strides=(2048, 1, 16)), ValueError, "out_l_stride"),
    (dict(x_strides=(-2048, 128, 1)), ValueError, "x_batch_stride"),
    (dict(x_dtype=5), TypeError, "x_dtype"),
    (dict(x_dtype=1, w_dtype=2), TypeError, "weight dtype"),
])
def test_bad_arguments_raise_precise_errors(rt, kwargs, exc, words):
    with pytest.raises(exc, match=words):
        call(rt, **kwargs)


def test_valid_call_without_a_gpu_is_a_runtime_error(rt):
    with pytest.raises(RuntimeError):  # no driver here, or no backend owns the fake pointer
        call(rt)


def test_launch_of_an_incomplete_variant_dict_names_the_field(rt):
    v = default_variant(Family("fwd", "cf", "bf16", "f32", 4)).as_runtime_dict()
    del v["tile_l"]
    strides = (*CF, 4, 1, 1, *CF, 0, 0, *NONE3, *NONE3)
    with pytest.raises(ValueError, match="tile_l"):
        rt.launch_fwd(v, (X, W, B, 0, 0, OUT, 0), (2, 16, 128, 4), strides, 2, 0, True, 0)


@pytest.mark.parametrize("target", ["", "sm_", "gfx", "tpu_v4", "sm_90; rm -rf /"])
def test_compile_rejects_unknown_targets(rt, target):
    with pytest.raises((ValueError, RuntimeError)):
        rt.compile('extern "C" __global__ void cc1d_kernel() {}', target)


def test_catalog_has_a_general_fallback_for_every_family(rt):
    entries = rt.catalog()
    families = {e["family"] for e in entries}
    for op in ("fwd", "bwd", "vfwd", "upd"):  # 2 layouts x 5 dtype pairs x 7 widths each
        assert sum(f.startswith(op + ".") for f in families) == 70, op
    for fam in families:
        chain = [e for e in entries if e["family"] == fam]
        elem = 4 if ".f32w" in fam else 2
        assert chain[-1]["align_bytes"] == elem, fam
