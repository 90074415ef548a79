"""cc1d-tune over decode-update shapes without a GPU: shapes.yaml entries with
op: upd parse (the layout is conv_state's), the update's problem sizes its bytes,
and --compile-only compiles upd candidates through the runtime (NVRTC sm_90)."""
from __future__ import annotations

import pytest

from cc1d.tuner.cli import main
from cc1d.tuner.problems import problem_for
from cc1d.tuner.shapes import parse_shapes


def test_upd_shapes_parse_for_both_state_layouts():
    shapes = parse_shapes([{"op": "upd", "layout": ["cf", "cl"], "dtypes": "bf16", "width": 4,
                            "batch": [1, 256], "dim": 5120, "seqlen": 1}])
    assert [s.family().key() for s in shapes] == ["upd.cf.bf16wbf16.w4"] * 2 + ["upd.cl.bf16wbf16.w4"] * 2
    assert shapes[0].key() == "b1.d5120.l1.bias.silu"


def test_upd_bytes_moved_is_the_minimal_traffic():
    s = parse_shapes([{"op": "upd", "layout": "cl", "dtypes": "bf16", "width": 4, "batch": 256, "dim": 5120,
                       "seqlen": 1}])[0]
    # x read + out written (1 token) + state window read + new state written (3 entries), + weights and bias
    assert problem_for("upd").bytes_moved(s) == 2 * 256 * 5120 * 2 + 2 * 256 * 5120 * 3 * 2 + 5120 * 5 * 2
    # HF's states of width entries: the same 3 entries read (the window, all the shift keeps), 4 written
    hf = parse_shapes([{"op": "upd", "layout": "cf", "dtypes": "bf16", "width": 4, "batch": 256, "dim": 5120,
                        "seqlen": 1, "width_state": True}])[0]
    assert problem_for("upd").bytes_moved(hf) == 2 * 256 * 5120 * 2 + 256 * 5120 * (3 + 4) * 2 + 5120 * 5 * 2


def test_compile_only_update_shapes(tmp_path, capsys):
    from cc1d._runtime import runtime
    try:
        runtime().compile('extern "C" __global__ void k(float* p) { p[0] = 1.0f; }\n', "sm_90")
    except RuntimeError as exc:
        pytest.skip(f"NVRTC not usable here: {str(exc).splitlines()[0]}")
    shapes = tmp_path / "upd.yaml"
    shapes.write_text("shapes:\n  - {op: upd, layout: [cf, cl], dtypes: bf16, width: 4, batch: 64, dim: 5120, "
                      "seqlen: 1}\n")
    code = main([str(a) for a in ["--arch", "sm_90", "--compile-only", "--trials", "2", "--shapes", shapes]],
                probe=lambda: None)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "compiled 4 variants of 2 families for sm_90: 4 ok, 0 failed" in out
