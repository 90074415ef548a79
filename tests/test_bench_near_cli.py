"""benchmarks/bench_near.py checks its options before it touches a GPU, naming the option,
what it expects and what it got; good options parse to lists."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import benchmark_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_near.py"
near = benchmark_script("bench_near")


@pytest.mark.parametrize("argv, message", [
    (["--lengths", "2048,0"], "--lengths expects positive integers separated by commas, got '2048,0'"),
    (["--lengths", "2k"], "--lengths expects positive integers separated by commas, got '2k'"),
    (["--ops", "fwd,upd"], "--ops expects some of fwd, bwd separated by commas, got 'fwd,upd'"),
    (["--layouts", "nchw"], "--layouts expects some of cf, cl separated by commas, got 'nchw'"),
    (["--batch", "0"], "--batch expects a positive integer, got 0"),
])
def test_bad_options_are_refused_before_the_gpu(argv, message):
    res = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr


def test_options_parse_to_lists():
    args = near.parse_args(["--lengths", "2048,2000", "--ops", "bwd", "--layouts", "cl,cf", "--dim", "512"])
    assert (args.lengths, args.ops, args.layouts, args.batch, args.dim) == ([2048, 2000], ["bwd"], ["cl", "cf"], 2, 512)
    defaults = near.parse_args([])
    assert defaults.lengths[0] == 2048 and defaults.ops == ["fwd", "bwd"] and defaults.layouts == ["cf", "cl"]
