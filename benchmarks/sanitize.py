"""Memory safety of the generated variants under compute-sanitizer (issue 8, item 2).

On the device:  python -P benchmarks/sanitize.py --out sanitize/          (bounded: every
family's default/fallback chain plus a seeded sample of its tuned space)
                python -P benchmarks/sanitize.py --all --out sanitize/    (every variant)
Without a GPU:  python -P benchmarks/sanitize.py --list                   (the plan only)

For each tool (memcheck, racecheck, initcheck) a child python process runs the
plan under ``compute-sanitizer --tool T``: every variant is launched exactly
(no dispatch) on small awkward shapes (lengths and channels that fit no tile,
all features on and off), with NaN-poisoned outputs. The child prints a marker
line before each launch, so every sanitizer report is attributed to the variant
that caused it. PYTORCH_NO_CUDA_MEMORY_CACHING=1 makes every tensor its own
allocation, so a read past a tensor hits unallocated memory (memcheck), and
initcheck sees no stale bytes of an earlier tensor in a reused block; outputs
are NaN-filled before the launch, so a kernel that reads its outputs before
writing them is not reported either (they are initialised), only reads of
memory nothing wrote. Writes <out>/sanitize.json and <out>/sanitize.md.

Adding an op family (decode, varlen) is one row in SHAPES (its adapter in
tuner/problems.py does the launching).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "initcheck")
MARK = "CC1D-SANITIZE-VARIANT "
# (batch, dim, seqlen, features) per op: awkward sizes; the second one multiples of
# 8 elements in dim and seqlen, so variants needing 16-byte rows run too.
SHAPES = {
    "fwd": [(1, 7, 77, {}), (2, 40, 296, dict(seq_idx=True, initial_states=True, final_states=True))],
    "bwd": [(1, 7, 77, {}), (2, 40, 296, dict(seq_idx=True, initial_states=True, final_states=True))],
    # varlen: batch = sequences, seqlen = total tokens
    "vfwd": [(3, 7, 77, {}), (5, 40, 296, dict(initial_states=True, final_states=True))],
    # decode update: seqlen = new tokens per row
    "upd": [(3, 7, 1, {}), (5, 40, 3, {})],
}
SAMPLE = 4  # tuned-space variants per family beyond its fallback chain (without --all)


def plan(ops=tuple(SHAPES), *, everything: bool = False, sample: int = SAMPLE, arch: str = "sm_90",
         seed: int = 0, match: str = "") -> list[dict]:
    """[{op, family, variant}]: each family's fallback chain, plus `sample` of its space (or all of it);
    `match`: only families whose key matches this regular expression (e.g. "w4$")."""
    from cc1d.generator import fallback_chain, families, variants
    rng = random.Random(seed)
    rows = []
    for fam in families():
        if fam.op not in ops or (match and not re.search(match, fam.key())):
            continue
        chosen = [v.key() for v in fallback_chain(fam, arch)]
        space = [v.key() for v in variants(fam, arch)]
        rest = [k for k in space if k not in chosen]
        chosen += rest if everything else rng.sample(rest, min(sample, len(rest)))
        rows += [dict(op=fam.op, family=fam.key(), variant=k) for k in dict.fromkeys(chosen)]
    return rows


# ---- parsing compute-sanitizer output ----------------------------------------------

_SUMMARY = re.compile(r"^========= ERROR SUMMARY: (\d+) errors?")
# A report's first line: "========= Invalid __global__ read ...", "========= Error: Race reported ...",
# "========= Uninitialized __global__ memory read ...". Detail lines are indented.
_REPORT = re.compile(r"^========= (?! )(?!ERROR SUMMARY|RACECHECK SUMMARY|COMPUTE-SANITIZER|Target application"
                     r"|This tool)(\S.*)$")


def parse(output: str) -> dict:
    """{"summary_errors": int | None, "by_variant": {key: [first lines of its reports]},
    "launched": [keys], "unattributed": [reports before any marker]}."""
    by_variant: dict[str, list[str]] = defaultdict(list)
    launched, unattributed = [], []
    current = None
    summary = None
    for line in output.splitlines():
        if line.startswith(MARK):
            current = line[len(MARK):].strip()
            launched.append(current)
            continue
        m = _SUMMARY.match(line)
        if m:
            summary = int(m.group(1))
            continue
        m = _REPORT.match(line)
        if m:
            (by_variant[current] if current else unattributed).append(m.group(1).strip())
    return dict(summary_errors=summary, by_variant=dict(by_variant), launched=launched, unattributed=unattributed)


def summarize(rows: list[dict], results: dict[str, dict]) -> dict:
    """Per op family and tool: variants planned and launched, kernel error reports and the
    variants they came from (API-call reports, "Program hit ...", are counted apart)."""
    op_of = {r["variant"]: r["op"] for r in rows}
    out: dict[str, dict] = {}
    for r in rows:
        out.setdefault(r["op"], dict(variants=0, tools={}))["variants"] += 1
    for tool, res in results.items():
        for op in out:
            out[op]["tools"][tool] = dict(launched=0, errors=0, api_reports=0, failing=[],
                                          summary_errors=res["summary_errors"],
                                          unattributed=len(res["unattributed"]), exit_code=res.get("exit_code"))
        for key in dict.fromkeys(res["launched"]):
            if key in op_of:
                out[op_of[key]]["tools"][tool]["launched"] += 1
        for key, reports in res["by_variant"].items():
            t = out[op_of[key]]["tools"][tool]
            kernel = [m for m in reports if not m.startswith("Program hit")]
            t["api_reports"] += len(reports) - len(kernel)
            if kernel:
                t["errors"] += len(kernel)
                t["failing"].append(dict(variant=key, first=kernel[0], count=len(kernel)))
    return out


def markdown(summary: dict, command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "| family | tool | variants planned | launched | kernel errors | API reports | ERROR SUMMARY | failing variants |",
             "|---|---|---|---|---|---|---|---|"]
    for op, fam in summary.items():
        for tool, t in fam["tools"].items():
            failing = ", ".join(f"{f['variant']} ({f['count']}: {f['first']})" for f in t["failing"]) or "none"
            lines.append(f"| {op} | {tool} | {fam['variants']} | {t['launched']} | {t['errors']} | {t['api_reports']} "
                         f"| {t['summary_errors']} | {failing} |")
    return "\n".join(lines) + "\n"


# ---- the child: launch every planned variant ----------------------------------------

def child(plan_file: str) -> int:
    import torch
    from cc1d._runtime import runtime
    from cc1d.generator import variants
    from cc1d.tuner.db import family_from_key
    from cc1d.tuner.problems import problem_for
    from cc1d.tuner.shapes import Shape
    rt = runtime()
    rows = json.loads(Path(plan_file).read_text())
    by_family: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        by_family[r["family"]].append(r["variant"])
    stream = torch.cuda.current_stream().cuda_stream
    skipped = 0
    for fam_key, keys in by_family.items():
        fam = family_from_key(fam_key)
        wanted = set(keys)
        problem = problem_for(fam.op)
        for v in variants(fam):
            if v.key() not in wanted:
                continue
            kernel = v.as_runtime_dict()
            print(MARK + v.key(), flush=True)
            for b, d, l, feats in SHAPES[fam.op]:
                shape = Shape(fam.op, fam.layout, fam.x_dtype, fam.w_dtype, fam.width, b, d, l, **feats)
                inputs = problem.make_inputs(shape, seed=b * 1000 + l, device="cuda")
                outputs = problem.make_outputs(shape, inputs)
                try:
                    problem.launch(rt, kernel, shape, inputs, outputs, stream)
                except ValueError as exc:  # the variant's stated requirement does not hold for this shape
                    skipped += 1
                    print(f"skip {v.key()} {b}x{d}x{l}: {exc}", flush=True)
                torch.cuda.synchronize()
    print(f"done; {skipped} (variant, shape) pairs skipped by requirement", flush=True)
    return 0


def precompile(rows: list[dict]) -> None:
    """Fill the disk compile cache in parallel, outside the sanitizer (the children then only load)."""
    from concurrent.futures import ThreadPoolExecutor
    from cc1d._runtime import runtime
    from cc1d.generator import variants
    from cc1d.tuner.db import family_from_key
    rt = runtime()
    target = rt.device_target("cuda", 0)
    wanted: dict[str, set] = defaultdict(set)
    for r in rows:
        wanted[r["family"]].add(r["variant"])
    sources = [v.source for fam, keys in wanted.items() for v in variants(family_from_key(fam)) if v.key() in keys]
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        list(pool.map(lambda src: rt.compile(src, target), sources))
    print(f"compiled {len(sources)} variants for {target}", flush=True)


def find_sanitizer() -> str:
    found = shutil.which("compute-sanitizer")
    candidates = [found] if found else []
    for root in filter(None, [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda",
                              *sorted(map(str, Path("/usr/local").glob("cuda-*")), reverse=True)]):
        candidates.append(str(Path(root) / "bin" / "compute-sanitizer"))
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise SystemExit("sanitize.py: compute-sanitizer not found on PATH, in $CUDA_HOME/bin or /usr/local/cuda*/bin")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--all", action="store_true", help="every variant of every family (long)")
    p.add_argument("--ops", default=",".join(SHAPES), help="comma-separated op families")
    p.add_argument("--sample", type=int, default=SAMPLE, help="tuned-space variants per family")
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--match", default="", help="only families whose key matches this regex, e.g. 'w4$'")
    p.add_argument("--out", default="sanitize", help="folder for sanitize.json / sanitize.md / logs")
    p.add_argument("--list", action="store_true", help="print the plan and exit (no GPU needed)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child)
    rows = plan(tuple(args.ops.split(",")), everything=args.all, sample=args.sample, match=args.match)
    if args.list:
        for r in rows:
            print(r["family"], r["variant"])
        print(f"{len(rows)} variants in {len({r['family'] for r in rows})} families")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(rows))
    sanitizer = find_sanitizer()
    precompile(rows)
    env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    results = {}
    for tool in args.tools.split(","):
        cmd = [sanitizer, "--tool", tool, "--print-limit", "20",
               sys.executable, "-P", str(Path(__file__).resolve()), "--child", str(out / "plan.json")]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        (out / f"{tool}.log").write_text(r.stdout + r.stderr)
        results[tool] = dict(parse(r.stdout + r.stderr), exit_code=r.returncode)
        print(f"{tool}: exit {r.returncode}, {len(set(results[tool]['launched']))} variants launched, "
              f"summary errors {results[tool]['summary_errors']}", flush=True)
    summary = summarize(rows, results)
    command = "python -P benchmarks/sanitize.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "sanitize.json").write_text(json.dumps(dict(command=command, summary=summary, results=results), indent=1))
    (out / "sanitize.md").write_text(markdown(summary, command))
    print(markdown(summary, command))
    clean = all(t["errors"] == 0 and t["exit_code"] == 0 and t["launched"] == fam["variants"]
                for fam in summary.values() for t in fam["tools"].values())
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
