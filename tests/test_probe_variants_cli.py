"""benchmarks/probe_variants.py refuses --peer for ops the peer is not timed for, before it
touches a GPU, naming the option, what it takes and what it got."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "probe_variants.py"


def test_peer_is_refused_for_an_update_shape():
    res = subprocess.run([sys.executable, str(SCRIPT), "--shape", "upd,cl,bf16/bf16,4,5,1000,1", "--peer",
                          "upd.cl.bf16wbf16.w4.t128.v8.r2.oafter.g255"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--peer: causal-conv1d is timed for fwd and bwd shapes, got op 'upd'" in res.stderr
