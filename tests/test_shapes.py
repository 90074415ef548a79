"""shapes.yaml: defaults, the grid form, and every error message."""
from __future__ import annotations

from pathlib import Path

import pytest

from cc1d.tuner.shapes import BUILTIN_DEFAULTS, FIELDS, Shape, ShapesError, load_shapes, parse_shapes

REPO = Path(__file__).resolve().parents[1]


def test_grid_expands_to_the_product_in_order():
    shapes = parse_shapes([{"op": "fwd", "layout": ["cf", "cl"], "dtypes": ["bf16/f32", "bf16"],
                            "width": [4], "dim": [2048, 4096], "batch": [1, 8], "seqlen": [512, 2048],
                            "bias": True, "activation": "silu"}])
    assert len(shapes) == 2 * 2 * 2 * 2 * 2
    s = shapes[0]
    assert (s.layout, s.x_dtype, s.w_dtype, s.width, s.dim, s.batch, s.seqlen) == \
        ("cf", "bf16", "f32", 4, 2048, 1, 512)
    assert s.family().key() == "fwd.cf.bf16wf32.w4"
    assert s.key() == "b1.d2048.l512.bias.silu"
    assert {(x.x_dtype, x.w_dtype) for x in shapes} == {("bf16", "f32"), ("bf16", "bf16")}


def test_defaults_builtin_and_file_level():
    (s,) = parse_shapes([{"batch": 1, "dim": 64, "seqlen": 8}])
    assert s == Shape("fwd", "cf", "bf16", "f32", 4, 1, 64, 8, True, "silu")
    (s,) = parse_shapes({"defaults": {"dtypes": "f16", "width": 3, "activation": None},
                         "shapes": [{"batch": 1, "dim": 64, "seqlen": 8}]})
    assert (s.x_dtype, s.w_dtype, s.width, s.activation) == ("f16", "f16", 3, "none")
    assert s.key() == "b1.d64.l8.bias"


def test_duplicates_are_dropped_and_features_in_key():
    shapes = parse_shapes([{"batch": 1, "dim": 64, "seqlen": 8},
                           {"batch": 1, "dim": 64, "seqlen": 8, "name": "again"},
                           {"batch": 1, "dim": 64, "seqlen": 8, "seq_idx": True, "final_states": True,
                            "initial_states": True, "bias": False}])
    assert [s.key() for s in shapes] == ["b1.d64.l8.bias.silu", "b1.d64.l8.silu.seqidx.init.final"]
    pooled = parse_shapes([{"op": "upd", "batch": 16, "dim": 64, "seqlen": 1, "state_indices": [False, True]}])
    assert [s.key() for s in pooled] == ["b16.d64.l1.bias.silu", "b16.d64.l1.bias.silu.pool"]
    hf = parse_shapes([{"op": "upd", "batch": 16, "dim": 64, "seqlen": 1, "state_indices": [False, True],
                        "width_state": True}])
    assert [s.key() for s in hf] == ["b16.d64.l1.bias.silu.wstate", "b16.d64.l1.bias.silu.pool.wstate"]


def test_example_file_parses():
    shapes = load_shapes(REPO / "examples" / "shapes.yaml")
    assert len(shapes) >= 4 and all(s.op == "fwd" for s in shapes)


@pytest.mark.parametrize("entry, message", [
    ({"batch": 1, "dim": 64}, "shapes[0]: missing required field 'seqlen'"),
    ({"batch": 1, "dim": 64, "seqlen": 8, "colour": 1}, "shapes[0]: unknown field 'colour'; known fields"),
    ({"batch": 0, "dim": 64, "seqlen": 8}, "shapes[0].batch: expected a positive integer, got 0"),
    ({"batch": 1, "dim": "64", "seqlen": 8}, "shapes[0].dim: expected a positive integer, got '64'"),
    ({"batch": 1, "dim": 64, "seqlen": [8, -1]}, "shapes[0].seqlen: expected a positive integer, got -1"),
    ({"batch": 1, "dim": 64, "seqlen": 8, "width": 9}, "shapes[0].width: expected an integer in 2..8, got 9"),
    ({"batch": 1, "dim": 64, "seqlen": 8, "layout": "nlc"}, "shapes[0].layout: expected one of ['cf', 'cl'], got 'nlc'"),
    ({"batch": 1, "dim": 64, "seqlen": 8, "op": "bwdd"}, "shapes[0].op: expected one of"),
    ({"batch": 1, "dim": 64, "seqlen": 8, "dtypes": "f32/bf16"}, "shapes[0].dtypes: expected x/weight dtypes among"),
    ({"batch": 1, "dim": 64, "seqlen": 8, "dtypes": 16}, "shapes[0].dtypes: expected 'x/weight'"),
    ({"batch": 1, "dim": 64, "seqlen": 8, "bias": "yes"}, "shapes[0].bias: expected true or false, got 'yes'"),
    ({"batch": 1, "dim": 64, "seqlen": 8, "activation": "gelu"}, "shapes[0].activation: expected 'silu' or 'none', got 'gelu'"),
    ({"batch": 1, "dim": 64, "seqlen": 8, "name": 3}, "shapes[0].name: expected a string, got 3"),
    ({"batch": 1, "dim": [], "seqlen": 8}, "shapes[0].dim: empty list"),
    ({"batch": 1, "dim": 64, "seqlen": 8, "state_indices": True},
     "shapes[0]: op fwd: state_indices is a feature of the decode update (op upd) only"),
    ({"op": "bwd", "batch": 1, "dim": 64, "seqlen": 8, "width_state": True},
     "shapes[0]: op bwd: width_state is a feature of the decode update (op upd) only"),
    ({"op": "upd", "batch": 1, "dim": 64, "seqlen": 1, "width_state": "yes"},
     "shapes[0].width_state: expected true or false, got 'yes'"),
    ("b1", "shapes[0]: expected a mapping of fields, got 'b1'"),
])
def test_entry_errors_name_file_entry_and_field(entry, message):
    with pytest.raises(ShapesError) as err:
        parse_shapes([entry], "my.yaml")
    assert str(err.value).startswith("my.yaml: "), str(err.value)
    assert message in str(err.value), str(err.value)


def test_error_names_the_right_entry_index():
    with pytest.raises(ShapesError, match=r"^f.yaml: shapes\[2\]\.width"):
        parse_shapes([{"batch": 1, "dim": 1, "seqlen": 1}] * 2 + [{"batch": 1, "dim": 1, "seqlen": 1,
                                                                   "width": 1}], "f.yaml")


@pytest.mark.parametrize("data, message", [
    ([], "expected a non-empty list of shapes"),
    (None, "expected a non-empty list of shapes"),
    ({"shapes": "x"}, "expected a non-empty list of shapes"),
    ({"defaults": {}, "shape": []}, "unknown top-level key 'shape'"),
    ({"defaults": {"width": [3, 4]}, "shapes": [{"batch": 1, "dim": 1, "seqlen": 1}]},
     "defaults.width: expected one value, got a list"),
    ({"defaults": {"width": 1}, "shapes": [{"batch": 1, "dim": 1, "seqlen": 1}]},
     "defaults.width: expected an integer in 2..8, got 1"),
])
def test_file_level_errors(data, message):
    with pytest.raises(ShapesError, match="^s.yaml: ") as err:
        parse_shapes(data, "s.yaml")
    assert message in str(err.value)


def test_load_errors(tmp_path):
    with pytest.raises(ShapesError, match="missing.yaml: cannot read the shapes file"):
        load_shapes(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {batch: 1, dim: [\n")
    with pytest.raises(ShapesError, match="bad.yaml: not valid YAML"):
        load_shapes(bad)


def test_every_field_has_a_default_or_is_required():
    assert set(FIELDS) == set(BUILTIN_DEFAULTS) | {"batch", "dim", "seqlen"}
