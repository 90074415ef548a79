"""Shared by the compile tests: resource-usage parsing of compiler logs."""
from __future__ import annotations

import re

PTXAS_VERBOSE = ["--ptxas-options=-v"]
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def nvidia_resources(log: str) -> dict:
    """Registers, stack and spills from ptxas' verbose report (one kernel per source)."""
    spill = _SPILL.search(log)
    regs = _REGS.search(log)
    if not spill or not regs:
        raise AssertionError(f"no ptxas resource report in the compile log:\n{log}")
    return dict(registers=int(regs.group(1)), stack=int(spill.group(1)),
                spill_stores=int(spill.group(2)), spill_loads=int(spill.group(3)))
