"""benchmarks/build_peer_wheel.sh refuses an interpreter that does not run before it
creates anything (a pyenv shim is found on PATH even where its version is not selected),
naming it and saying what to pass instead."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "build_peer_wheel.sh"


@pytest.mark.parametrize("python", ["/nonexistent/python3.12", "false"])
def test_an_interpreter_that_does_not_run_is_refused(tmp_path, python):
    out = tmp_path / "peer"
    res = subprocess.run(["bash", str(SCRIPT), str(out), "1.7.0", "2.11.0", python],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"build_peer_wheel: {python} does not run here" in res.stderr
    assert "pass an interpreter's path as PYTHON" in res.stderr
    assert not out.exists()
