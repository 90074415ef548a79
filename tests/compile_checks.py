"""Shared by the compile tests: resource-usage parsing of compiler logs."""
from __future__ import annotations

import re
from types import SimpleNamespace

from cc1d.generator import default_variant

PTXAS_VERBOSE = ["--ptxas-options=-v"]
_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def nvidia_resources(log: str) -> dict:
    """Registers of cc1d_kernel, and stack and spills summed over every kernel of the
    source (a second pass, cc1d_reduce, may come first in ptxas' verbose report)."""
    parts = _ENTRY.split(log)[1:]  # [name, report, name, report, ...]
    kernels = {}
    for name, report in zip(parts[0::2], parts[1::2]):
        spill, regs = _SPILL.search(report), _REGS.search(report)
        if not spill or not regs:
            raise AssertionError(f"no ptxas resource report for {name} in the compile log:\n{log}")
        kernels[name] = dict(registers=int(regs.group(1)), stack=int(spill.group(1)),
                             spill_stores=int(spill.group(2)), spill_loads=int(spill.group(3)))
    if "cc1d_kernel" not in kernels:
        raise AssertionError(f"no ptxas resource report for cc1d_kernel in the compile log:\n{log}")
    return dict(registers=kernels["cc1d_kernel"]["registers"],
                **{k: sum(r[k] for r in kernels.values()) for k in ("stack", "spill_stores", "spill_loads")})


def defines(options: list[str]) -> str:
    """-DNAME=VALUE options as #define lines (for compilers driven without options: the
    hipRTC worker)."""
    lines = []
    for o in options:
        name, _, value = o[2:].partition("=")
        lines.append(f"#define {name} {value}")
    return "\n".join(lines) + "\n"


def with_defines(variant, options: list[str], label: str) -> SimpleNamespace:
    """A plan's fixed kernel of `variant` for compilers driven without options (the hipRTC
    worker): its options as #define lines ahead of the source, keyed "<variant key>+<label>"
    (what _compile_batch reads of a variant: key() and source)."""
    key = f"{variant.key()}+{label}"
    return SimpleNamespace(key=lambda: key, source=defines(options) + variant.source)


def width4_fixed_builds(families, target: str, options_for, feature_sets) -> list[SimpleNamespace]:
    """For compilers driven without options (the hipRTC worker): the default variant for
    `target` of each width-4 family in `families`, once per (name, features) of
    `feature_sets`, with the fixed kernel's options `options_for(family, features)` as
    #define lines, keyed "<variant key>+fixed-<name>"."""
    return [with_defines(default_variant(f, target), options_for(f, features), f"fixed-{name}")
            for f in families if f.width == 4 for name, features in feature_sets]


def fixed_kernel_problems(nvrtc, variant, options: list[str], shrink: int,
                          generic_options: tuple[str, ...] = ()) -> list[str]:
    """A plan's fixed kernel of `variant` compiled for sm_90 with `options`: what is wrong
    with it (a compile error, local memory, or a binary not under 1/shrink of the size of
    the kernel it replaces, the source compiled with `generic_options`), as messages
    naming the variant; [] when nothing is."""
    try:
        fixed, log = nvrtc.compile(variant.source, "sm_90", [*options, *PTXAS_VERBOSE])
    except RuntimeError as exc:
        return [f"{variant.key()}: {str(exc)[:1500]}"]
    problems = []
    res = nvidia_resources(log)
    generic = nvrtc.compile(variant.source, "sm_90", list(generic_options))[0]
    if res["spill_stores"] or res["spill_loads"] or res["stack"]:
        problems.append(f"{variant.key()}: local memory {res}")
    if not len(fixed) < len(generic) // shrink:
        problems.append(f"{variant.key()}: fixed binary {len(fixed)} bytes, generic {len(generic)}")
    return problems
