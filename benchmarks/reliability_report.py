"""Writes docs/RELIABILITY.md: cases tried and passed per category (issue 8), from
pytest JUnit XML, the C++ runtime test's output and the sanitizer's JSON.

    python -P benchmarks/reliability_report.py                    # runs the CPU tests here
    python -P benchmarks/reliability_report.py --junit cpu.xml --junit gpu.xml \
        --cpp build/cpp/test_runtime --sanitize sanitize/sanitize.json

Without --junit it runs pytest on the reliability test files itself (GPU tests
skip without a device). Nothing is typed in by hand: every number is counted
from those outputs, and a section whose output is missing says so. Sections of the
existing --out file that it does not write (the sessions' notes below the tables)
are kept, after its own.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# category -> (test file, test-name prefix or "" for all)
CATEGORIES = {
    "1. Bad input: runtime entry points (cases x entry points)": [("test_bad_input.py", "")],
    "1. Bad input: PyTorch API without a device (fn, bwd, update, varlen, varlen_states)":
        [("test_bad_input_torch.py", "test_bad_input_without")],
    "1. Bad input: PyTorch API on the GPU (errors, accepted inputs vs float64)":
        [("test_bad_input_torch.py", "test_bad_or_odd")],
    "1. Property tests on the GPU (hypothesis: 150 random valid fn/bwd calls, 100 update, 100 varlen)":
        [("test_bad_input_torch.py", "test_random_valid")],
    "2. Sanitizer tooling (plan, parsing; CPU)": [("test_sanitize.py", "")],
    "3. Tuning DB faults": [("test_db_faults.py", ""), ("test_db_faults_gpu.py", ""),
                            ("test_dispatch.py", "test_unreadable"),
                            ("test_dispatch.py", "test_missing_file"), ("test_dispatch.py", "test_newer_schema"),
                            ("test_dispatch.py", "test_wrong_source_hash"), ("test_dispatch.py", "test_stale_epoch"),
                            ("test_db.py", "test_refuses"), ("test_db.py", "test_validate_catches"),
                            ("test_db.py", "test_kill_mid_transaction")],
    "4. Tuner faults (isolation, compile errors, SIGKILL + resume)": [("test_tuner_faults.py", ""),
                                                                      ("test_tuner_search.py", "test_resume")],
    "5. Concurrency and the compile cache": [("test_concurrency.py", ""),
                                             ("test_dispatch.py", "test_threads")],
}
FILES = sorted({f for rows in CATEGORIES.values() for f, _ in rows})


def run_pytest(xml: Path) -> None:
    subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                    *[str(REPO / "tests" / f) for f in FILES]], cwd=REPO, check=False)


def read_junit(paths: list[Path]) -> list[dict]:
    """One case per (file, test name) over all the files: a run's pass or failure beats another's
    skip (a CPU run skips what a GPU run ran), else the later file given wins."""
    cases: dict[tuple[str, str], dict] = {}
    for p in paths:
        for tc in ET.parse(p).getroot().iter("testcase"):
            outcome = "passed"
            for child in tc:
                if child.tag in ("failure", "error"):
                    outcome = "failed"
                elif child.tag == "skipped":
                    outcome = "skipped"
            # A module skipped whole (no torch or GPU) is one case named after the module, with no classname.
            module = tc.get("classname") or tc.get("name", "")
            file = (tc.get("file") or module.replace(".", "/")).split("/")[-1]
            if not file.endswith(".py"):
                file += ".py"
            case = dict(file=file, name=tc.get("name", ""), outcome=outcome)
            key = (case["file"], case["name"])
            if key not in cases or outcome != "skipped" or cases[key]["outcome"] == "skipped":
                cases[key] = case
    return list(cases.values())


def tally(cases: list[dict]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for cat, rows in CATEGORIES.items():
        counts = defaultdict(int)
        for c in cases:
            if any(c["file"] == f and c["name"].startswith(prefix) for f, prefix in rows):
                counts[c["outcome"]] += 1
        out[cat] = dict(counts)
    return out


def run_cpp(binary: Path) -> dict[str, int]:
    r = subprocess.run([str(binary)], capture_output=True, text=True)
    lines = r.stdout.splitlines()
    matrix = [l for l in lines if l[5:].startswith("matrix:")]
    return dict(checks=sum(l.startswith(("ok  ", "FAIL")) for l in lines),
                passed=sum(l.startswith("ok  ") for l in lines),
                matrix=len(matrix), matrix_passed=sum(l.startswith("ok  ") for l in matrix), exit_code=r.returncode)


def space_sizes(arch: str = "sm_90") -> dict[str, int]:
    """Variants per op in the generator's space for `arch` (what `sanitize.py --all` would run)."""
    from cc1d.generator import families, variants
    sizes: dict[str, int] = {}
    for fam in families():
        sizes[fam.op] = sizes.get(fam.op, 0) + sum(1 for _ in variants(fam, arch))
    return sizes


def render(counts, cpp, sanitize, commands) -> str:
    lines = ["# Reliability", "",
             "Produced by `python -P benchmarks/reliability_report.py` (see *Commands*); every number below",
             "is counted from test output, none typed in. Tried = test cases run (a parametrized case",
             "counts once); skipped = not runnable where the report was made (no GPU / no torch there).", "",
             "| category | tried | passed | failed | skipped |", "|---|---|---|---|---|"]
    for cat, c in counts.items():
        tried = c.get("passed", 0) + c.get("failed", 0)
        lines.append(f"| {cat} | {tried} | {c.get('passed', 0)} | {c.get('failed', 0)} | {c.get('skipped', 0)} |")
    if cpp:
        lines.append(f"| C++ runtime checks (tests/cpp/test_runtime.cpp), of which bad-input matrix rows x entry "
                     f"points: {cpp['matrix']} tried, {cpp['matrix_passed']} passed | {cpp['checks']} | "
                     f"{cpp['passed']} | {cpp['checks'] - cpp['passed']} | 0 |")
    else:
        lines.append("| C++ runtime checks | not run (pass --cpp build/cpp/test_runtime) | | | |")
    lines += ["", "## Sanitizer summary per family", ""]
    if sanitize:
        lines += ["| family | tool | variants planned | launched | kernel errors | API reports | ERROR SUMMARY "
                  "| variants in the op's space |",
                  "|---|---|---|---|---|---|---|---|"]
        commands_run, sizes = [], space_sizes()
        for path in sanitize:  # one JSON per sanitizer run (a run may cover some of the tools)
            s = json.loads(Path(path).read_text())
            commands_run.append(s["command"])
            for op, fam in s["summary"].items():
                for tool, t in fam["tools"].items():
                    lines.append(f"| {op} | {tool} | {fam['variants']} | {t['launched']} | {t['errors']} | "
                                 f"{t['api_reports']} | {t['summary_errors']} | {sizes.get(op, '?')} |")
                    for f in t["failing"]:
                        lines.append(f"| | | | | {f['variant']}: {f['count']} x {f['first']} | | | |")
            for tool, r in s["results"].items():
                if r.get("seconds") is not None:  # None: re-parsed from logs, no time
                    lines.append(f"| all | {tool}: {r['seconds']} s in {r.get('processes', 1)} processes | | | | | | |")
        lines += ["", "Sanitizer runs: " + "; ".join(f"`{c}`" for c in commands_run) + ".", "",
                  "`--cover` runs, per family, its fallback chain (every kernel dispatch can pick without a tuned",
                  "entry) and enough variants that every value of every tunable appears, plus the pairwise covering",
                  "set of each op and layout (every pair of values of two axes, dtypes and width included). The",
                  "whole space (`--all`) is the last column's sum: compiling it alone takes days on one machine."]
    else:
        lines += ["**PLACEHOLDER — to be filled from the device run** (no sanitizer JSON was given to this",
                  "report): run the sanitizer command below on the GPU machine, then rerun this report with",
                  "`--sanitize sanitize/sanitize.json`."]
    lines += ["", "## Commands", ""] + [f"    {c}" for c in commands] + [""]
    return "\n".join(lines)


COMMANDS = [
    "# CPU (CI machine): the reliability tests and this report",
    "python -P benchmarks/reliability_report.py --cpp build/cpp/test_runtime",
    "# GPU machine: the same tests with the device, JUnit kept for the report",
    "python -P -m pytest -q tests/test_bad_input.py tests/test_bad_input_torch.py tests/test_concurrency.py "
    "tests/test_db_faults.py tests/test_db_faults_gpu.py tests/test_tuner_faults.py tests/test_sanitize.py "
    "tests/test_dispatch.py "
    "tests/test_db.py tests/test_tuner_search.py --junitxml=gpu.xml",
    "# GPU machine: compute-sanitizer over every family (--cover: fallback chains, every tunable value, pairwise;",
    "# --all for the whole space)",
    "python -P benchmarks/sanitize.py --cover --out sanitize",
    "# the report from both",
    "python -P benchmarks/reliability_report.py --junit gpu.xml --cpp build/cpp/test_runtime "
    "--sanitize sanitize/sanitize.json",
]


GENERATED_HEADINGS = ("## Sanitizer summary per family", "## Commands")  # the "## " sections render() writes


def kept_sections(old: str) -> str:
    """The sections of an earlier report that this script does not write (a "## " heading
    other than GENERATED_HEADINGS, to the next such heading): the sessions' notes on where the
    figures came from, written by hand below the generated ones. Rewriting the report keeps
    them, in their order."""
    kept, keep = [], False
    for line in old.splitlines():
        if line.startswith("## "):
            keep = line.rstrip() not in GENERATED_HEADINGS
        if keep:
            kept.append(line)
    return "\n".join(kept)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--junit", action="append", type=Path, help="pytest JUnit XML (repeatable); default: run pytest")
    p.add_argument("--cpp", type=Path, help="the built C++ runtime test binary (tests/cpp/test_runtime.cpp)")
    p.add_argument("--sanitize", type=Path, action="append",
                   help="sanitize.json from benchmarks/sanitize.py (repeatable: one per run)")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "RELIABILITY.md")
    args = p.parse_args(argv)
    junit = args.junit
    if not junit:
        tmp = Path(tempfile.mkdtemp()) / "reliability.xml"
        run_pytest(tmp)
        junit = [tmp]
    counts = tally(read_junit(junit))
    cpp = run_cpp(args.cpp) if args.cpp else None
    text = render(counts, cpp, args.sanitize, COMMANDS)
    kept = kept_sections(args.out.read_text()) if args.out.is_file() else ""
    args.out.write_text(text + (kept + "\n" if kept else ""))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
