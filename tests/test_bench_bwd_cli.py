"""benchmarks/bench_bwd.py refuses a bad --seq-len before it touches a GPU, naming the
option, what it needs and what it got."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_bwd.py"


@pytest.mark.parametrize("argv, got", [(["--seq-len", "512"], "512"), (["--seq-idx", "--seq-len", "0"], "0"),
                                       (["--seq-idx", "--seq-len", "-3"], "-3")])
def test_bad_seq_len_is_refused(argv, got):
    res = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"--seq-len needs --seq-idx and a positive length, got {got}" in res.stderr
