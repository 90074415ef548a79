"""Memory safety of the generated variants under compute-sanitizer (issue 8, item 2).

On the device:  python -P benchmarks/sanitize.py --out sanitize/          (bounded: every
family's default/fallback chain plus a seeded sample of its tuned space)
                python -P benchmarks/sanitize.py --cover --out sanitize/  (every family's fallback
chain, every value of each of its tunables, and the pairwise covering set of each op and layout)
                python -P benchmarks/sanitize.py --all --out sanitize/    (every variant: about
100,000 for sm_90, days of compiling; split it with --match)
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
import time
from collections import defaultdict
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "initcheck")
MARK = "CC1D-SANITIZE-VARIANT "
UNEXERCISED = "CC1D-SANITIZE-NOT-RUN "
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


def plan(ops=tuple(SHAPES), *, everything: bool = False, cover: bool = False, sample: int = SAMPLE,
         arch: str = "sm_90", seed: int = 0, match: str = "") -> list[dict]:
    """[{op, family, variant}]: each family's fallback chain, plus `sample` of its space, or with
    `cover` its per-family cover and its share of the op's pairwise covering set (or all of it);
    `match`: only families whose key matches this regular expression (e.g. "w4$")."""
    from cc1d.generator import fallback_chain, families, variants
    from cc1d.generator.covering import covering_variants, family_cover
    rng = random.Random(seed)
    rows = []
    for fam in families():
        if fam.op not in ops or (match and not re.search(match, fam.key())):
            continue
        chosen = [v.key() for v in fallback_chain(fam, arch)]
        if cover:
            chosen += [v.key() for v in family_cover(fam, arch)]
            chosen += [v.key() for v in covering_variants(fam.op, fam.layout, arch) if v.family == fam]
        elif everything:
            chosen += [v.key() for v in variants(fam, arch)]
        else:
            space = [v.key() for v in variants(fam, arch)]
            rest = [k for k in space if k not in chosen]
            chosen += rng.sample(rest, min(sample, len(rest)))
        rows += [dict(op=fam.op, family=fam.key(), variant=k) for k in dict.fromkeys(chosen)]
    return rows


# ---- parsing compute-sanitizer output ----------------------------------------------

_SUMMARY = re.compile(r"^========= ERROR SUMMARY: (\d+) errors?")
# racecheck ends with its own line; its warnings (possible hazards) count as errors here.
_RACE_SUMMARY = re.compile(r"^========= RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
# A report's first line: "========= Invalid __global__ read ...", "========= Error: Race reported ...",
# "========= Uninitialized __global__ memory read ...". Detail lines are indented.
_REPORT = re.compile(r"^========= (?! )(?!ERROR SUMMARY|RACECHECK SUMMARY|COMPUTE-SANITIZER|Target application"
                     r"|This tool)(\S.*)$")


def parse(output: str) -> dict:
    """{"summary_errors": int | None, "by_variant": {key: [first lines of its reports]},
    "launched": [keys], "unattributed": [reports before any marker],
    "not_run": [keys no shape could launch (requirements)]}."""
    by_variant: dict[str, list[str]] = defaultdict(list)
    launched, unattributed, not_run = [], [], []
    current = None
    summary = None
    for line in output.splitlines():
        if line.startswith(MARK):
            current = line[len(MARK):].strip()
            launched.append(current)
            continue
        if line.startswith(UNEXERCISED):
            not_run.append(line[len(UNEXERCISED):].strip())
            continue
        m = _SUMMARY.match(line)
        if m:
            summary = int(m.group(1))
            continue
        m = _RACE_SUMMARY.match(line)
        if m:
            summary = int(m.group(1)) + int(m.group(2))
            continue
        m = _REPORT.match(line)
        if m:
            (by_variant[current] if current else unattributed).append(m.group(1).strip())
    return dict(summary_errors=summary, by_variant=dict(by_variant), launched=launched, unattributed=unattributed,
                not_run=not_run)


def shard(rows: list[dict], jobs: int) -> list[list[dict]]:
    """The plan in `jobs` parts, whole families each (a child loads a family's space once), balanced by size."""
    by_family: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_family[r["family"]].append(r)
    parts: list[list[dict]] = [[] for _ in range(max(1, min(jobs, len(by_family))))]
    for fam in sorted(by_family, key=lambda f: -len(by_family[f])):
        min(parts, key=len).extend(by_family[fam])
    return parts


def merge(parsed: list[dict]) -> dict:
    """One parse() result from the logs of the shards that ran concurrently."""
    by_variant: dict[str, list[str]] = defaultdict(list)
    for r in parsed:
        for key, reports in r["by_variant"].items():
            by_variant[key] += reports
    summaries = [r["summary_errors"] for r in parsed]
    return dict(summary_errors=None if None in summaries else sum(summaries), by_variant=dict(by_variant),
                launched=[k for r in parsed for k in r["launched"]],
                unattributed=[m for r in parsed for m in r["unattributed"]],
                not_run=[k for r in parsed for k in r["not_run"]])


def run_tool(sanitizer_cmd: list[str], tool: str, out: Path, shards: int, env: dict) -> dict:
    """Runs the children of plan.0.json .. plan.<shards-1>.json under the sanitizer at once, then
    joins their logs into <out>/<tool>.log (shard by shard) and their parses into one result."""
    start = time.monotonic()
    logs = [out / f"{tool}.{i}.log" for i in range(shards)]
    procs = []
    for i, log in enumerate(logs):
        with open(log, "w") as f:
            procs.append(subprocess.Popen([*sanitizer_cmd, sys.executable, "-P", str(Path(__file__).resolve()),
                                           "--child", str(out / f"plan.{i}.json")],
                                          stdout=f, stderr=subprocess.STDOUT, env=env))
    codes = [proc.wait() for proc in procs]
    texts = [log.read_text() for log in logs]
    (out / f"{tool}.log").write_text("".join(f"##### shard {i}, exit {c}\n{t}" for i, (c, t) in
                                             enumerate(zip(codes, texts))))
    for log in logs:
        log.unlink()
    return _tool_result(codes, texts, seconds=round(time.monotonic() - start, 1))


def _tool_result(codes: list[int], texts: list[str], seconds: float | None) -> dict:
    """One tool's result from its shards' exit codes and logs."""
    return dict(merge([parse(t) for t in texts]), exit_code=max(codes, key=abs), seconds=seconds,
                processes=len(texts))


_SHARD = re.compile(r"^##### shard \d+, exit (-?\d+)$", re.M)


def reparse(joined_log: str) -> dict:
    """run_tool's result again from the <tool>.log it wrote (for a run whose JSON was lost);
    the time is not in the log, so `seconds` is None."""
    parts = _SHARD.split(joined_log)[1:]  # [exit, text, exit, text, ...]
    codes, texts = [int(c) for c in parts[0::2]], parts[1::2]
    if not texts:
        raise ValueError("log: no '##### shard' sections; not a log that sanitize.py joined")
    return _tool_result(codes, texts, seconds=None)


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
        not_run = set(res.get("not_run", ()))
        for key in dict.fromkeys(res["launched"]):
            if key in op_of and key not in not_run:
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
            ran = 0
            for b, d, l, feats in SHAPES[fam.op]:
                shape = Shape(fam.op, fam.layout, fam.x_dtype, fam.w_dtype, fam.width, b, d, l, **feats)
                inputs = problem.make_inputs(shape, seed=b * 1000 + l, device="cuda")
                outputs = problem.make_outputs(shape, inputs)
                try:
                    problem.launch(rt, kernel, shape, inputs, outputs, stream)
                    ran += 1
                except ValueError as exc:  # the variant's stated requirement does not hold for this shape
                    skipped += 1
                    print(f"skip {v.key()} {b}x{d}x{l}: {exc}", flush=True)
                torch.cuda.synchronize()
            if not ran:  # no shape met its requirements: it did not run at all
                print(UNEXERCISED + v.key(), flush=True)
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
    p.add_argument("--cover", action="store_true",
                   help="fallback chains, every tunable value per family, and the pairwise covering sets")
    p.add_argument("--ops", default=",".join(SHAPES), help="comma-separated op families")
    p.add_argument("--sample", type=int, default=SAMPLE, help="tuned-space variants per family")
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2),
                   help="sanitizer processes at once (each takes whole families of the plan)")
    p.add_argument("--match", default="", help="only families whose key matches this regex, e.g. 'w4$'")
    p.add_argument("--out", default="sanitize", help="folder for sanitize.json / sanitize.md / logs")
    p.add_argument("--list", action="store_true", help="print the plan and exit (no GPU needed)")
    p.add_argument("--reparse", action="store_true",
                   help="rebuild sanitize.json/.md in --out from its plan.json and <tool>.log files (no GPU)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args.child)
    if args.reparse:
        out = Path(args.out)
        rows = json.loads((out / "plan.json").read_text())
        results = {tool: reparse((out / f"{tool}.log").read_text())
                   for tool in args.tools.split(",") if (out / f"{tool}.log").is_file()}
        if not results:
            p.error(f"--reparse: no <tool>.log for --tools {args.tools} in {out}")
        return report(out, rows, results, argv)
    rows = plan(tuple(args.ops.split(",")), everything=args.all, cover=args.cover, sample=args.sample,
                match=args.match)
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
    shards = shard(rows, args.jobs)
    for i, part in enumerate(shards):
        (out / f"plan.{i}.json").write_text(json.dumps(part))
    for tool in args.tools.split(","):
        results[tool] = run_tool([sanitizer, "--tool", tool, "--print-limit", "20"], tool, out, len(shards), env)
        res = results[tool]
        launched = set(res["launched"]) - set(res["not_run"])
        print(f"{tool}: exit {res['exit_code']}, {len(launched)} variants launched, "
              f"summary errors {res['summary_errors']}, {res['seconds']} s", flush=True)
    for i in range(len(shards)):
        (out / f"plan.{i}.json").unlink()
    return report(out, rows, results, argv)


def report(out: Path, rows: list[dict], results: dict[str, dict], argv) -> int:
    """Writes sanitize.json and sanitize.md; 0 when every planned variant ran clean under every tool."""
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
