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


def test_rewriting_the_report_keeps_the_hand_written_sections(tmp_path):
    """The generated tables and commands are replaced; the sessions' notes below them stay."""
    out = tmp_path / "RELIABILITY.md"
    notes = "## Where these figures come from\n\nSession 80: 71 tests under racecheck.\n\n## Later\n\nmore"
    out.write_text("# Reliability\n\nold table\n\n## Sanitizer summary per family\n\nold\n\n## Commands\n\n"
                   "    old command\n" + notes + "\n")
    cpu = _junit(tmp_path / "cpu.xml", {"test_a": "passed"})
    assert report.main(["--junit", str(cpu), "--out", str(out)]) == 0
    text = out.read_text()
    assert "old table" not in text and "old command" not in text and "\nold\n" not in text
    assert text.startswith("# Reliability\n") and "| 3. Tuning DB faults | 1 | 1 | 0 | 0 |" in text
    assert text.index("## Commands") < text.index(notes) and text.endswith(notes + "\n")
    assert report.main(["--junit", str(cpu), "--out", str(out)]) == 0 and out.read_text() == text  # stable


def test_a_new_report_has_only_the_generated_sections(tmp_path):
    out = tmp_path / "RELIABILITY.md"
    assert report.main(["--junit", str(_junit(tmp_path / "cpu.xml", {"test_a": "passed"})), "--out", str(out)]) == 0
    assert out.read_text().rstrip().endswith("--sanitize sanitize/sanitize.json")
