"""benchmarks/reliability_report.py counts each test case once over several JUnit files."""
from __future__ import annotations

from pathlib import Path

from conftest import benchmark_script

report = benchmark_script("reliability_report")


def _junit(path: Path, cases: dict[str, str]) -> Path:
    body = "".join(f'<testcase classname="tests.test_db_faults" name="{name}">'
                   + {"passed": "", "skipped": "<skipped/>", "failed": "<failure/>"}[outcome] + "</testcase>"
                   for name, outcome in cases.items())
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite>{body}</testsuite></testsuites>')
    return path


def test_a_run_beats_a_skip_and_the_later_run_wins(tmp_path):
    gpu = _junit(tmp_path / "gpu.xml", {"test_a": "passed", "test_b": "passed", "test_c": "passed"})
    cpu = _junit(tmp_path / "cpu.xml", {"test_a": "skipped", "test_b": "failed", "test_d": "skipped"})
    cases = {c["name"]: c["outcome"] for c in report.read_junit([gpu, cpu])}
    assert cases == {"test_a": "passed", "test_b": "failed", "test_c": "passed", "test_d": "skipped"}
    counts = report.tally(report.read_junit([gpu, cpu]))["3. Tuning DB faults"]
    assert counts == {"passed": 2, "failed": 1, "skipped": 1}
