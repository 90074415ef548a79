"""Runs a script in a fresh Python process: for switches the runtime reads once per process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def stdout_words(script: str, cwd: Path, switch: str, **setting: str) -> list[str]:
    """The words `script` printed, run with `switch` taken out of this process's environment
    and `setting` added (cwd outside the source tree, whose cc1d/ would shadow the installed
    package); a failing script fails the test with its stderr."""
    env = {k: v for k, v in os.environ.items() if k != switch}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd,
                         env={**env, **setting})
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.split()
