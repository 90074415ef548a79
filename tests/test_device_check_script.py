"""benchmarks/device_check.sh (run on the GPU machine) parses, runs benchmarks that exist
and take --out, and leaves at most eight files in $OUT: the device tool brings back no more."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device_check.sh"


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_its_benchmarks_exist_take_out_and_fit_the_file_limit():
    text = SCRIPT.read_text()
    loop = re.search(r"for bench in ([\w ]+); do", text).group(1).split()
    named = set(loop) | set(re.findall(r"benchmarks/bench_(\w+)\.py", text))
    for name in named:
        source = (ROOT / "benchmarks" / f"bench_{name}.py").read_text()
        assert '"--out"' in source, name
    files = set()
    for out in re.findall(r'"\$OUT/([\w.$]+)"', text):  # the loop's name expanded for each benchmark
        files |= {out.replace("$bench", b) for b in loop} if "$bench" in out else {out}
    assert "device_check.log" in files and len(files) <= 8, sorted(files)
