"""Time chosen kernel variants on one shape, with their resource usage and SASS.

For template work: validates each candidate against the float64 reference,
graph-times it (inputs rotated past L2) and reports the % of a copy measured in
the same run. A candidate is a variant key (rendered from the current
templates), KEY@FILE.cu (that source, launched with KEY's geometry) or KEY@DIR
(KEY rendered from the templates in DIR, say another checkout's `templates/`: a
template change against main, each at the same config). A channel-first forward or backward KEY
ending in .realign stands for that variant's realigned twin (what the dispatcher runs
for rows off the vector boundary, an odd seqlen's). A walked channel-first backward KEY ending
in .walkcut stands for its walk-cut build (what the dispatcher runs where the sequence's
end cuts a segment).

    python benchmarks/probe_variants.py --shape fwd,cf,bf16/bf16,4,8,5120,2048 \\
        fwd.cf.bf16wbf16.w4.t64.v16.n4.r1.hshfl  fwd.cf.bf16wbf16.w4.t64.v16.n4.r1.hshfl@my.cu \\
        fwd.cf.bf16wbf16.w4.t64.v16.n4.r1.hshfl@../main/templates [--rounds 3] \\
        [--sass-dir DIR] [--no-silu] [--seq-idx] [--peer]

--rounds N times every candidate N times, the order reversed each round (so a
drifting clock does not favour one side), and prints each round's time.

--peer also times causal-conv1d's forward or backward on the same inputs (forward
and backward shapes, where it is installed), so a candidate's speed can be read
against the peer's in the same run; a call it rejects (channel-first seq_idx) is a row saying so.

--seq-idx probes calls with seq_idx (sequence ids drawn as the tuner draws them); a backward
candidate then runs, and reports the registers of, its seq_idx build, as the runtime does.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from peers import causal_conv1d, causal_conv1d_bwd
from timing import copy_ceiling_gbps, graph_time_us, n_buffers

from cc1d import _cc1d
from cc1d.generator import Variant
from cc1d.generator.render import render_from
from cc1d.generator.space import Family, space_for
from cc1d.generator.variant import BUILDS, base_key
from cc1d.tuner.problems import problem_for
from cc1d.tuner.shapes import Shape


def parse_shape(text: str, silu: bool, seq_idx: bool = False) -> Shape:
    op, layout, dtypes, width, b, d, l = text.split(",")
    xd, _, wd = dtypes.partition("/")
    return Shape(op, layout, xd, wd or xd, int(width), int(b), int(d), int(l),
                 activation="silu" if silu else "none", seq_idx=seq_idx)


def compile_options(shape: Shape) -> list[str]:
    """The options the runtime adds when it compiles a candidate for this shape's calls: a
    backward with seq_idx runs its variant's seq_idx build (the runtime's
    bwd_seq_build_options), so its registers are that build's."""
    return list(_cc1d.bwd_seq_build_options()) if shape.op == "bwd" and shape.seq_idx else []


def variant_from_key(key: str) -> Variant:
    parts = key.split(".")
    op, layout, dt, w = parts[:4]
    xd, wd = dt.split("w", 1)
    family = Family(op, layout, xd, wd, int(w[1:]))
    space = space_for(family)
    config = {}
    for p, part in zip(space.params, parts[4:]):  # keys list the params in the space's order
        if not part.startswith(p.abbrev):
            raise ValueError(f"{key}: expected {p.abbrev}<{p.name}> at {part!r}")
        config[p.name] = type(p.values[0])(part[len(p.abbrev):])
    return Variant.of(family, **config)


def kernel_dict(spec: str) -> tuple[str, dict]:
    """(name, the runtime's kernel dict) of a candidate: KEY, KEY@FILE.cu or KEY@DIR; a
    channel-first forward or backward KEY ending in .realign is that variant's realigned twin,
    a walked channel-first backward KEY ending in .walkcut its walk-cut build."""
    key, _, path = spec.partition("@")
    base = base_key(key)  # KEY.realign, KEY.walkcut: KEY's build of that name
    variant = variant_from_key(base)
    kernel = variant.as_runtime_dict()
    if path:
        where = Path(path)
        kernel["source"] = render_from(variant, where) if where.is_dir() else where.read_text()
        kernel["key"] = f"{key}@{path if where.is_dir() else where.name}"
    kernel["hash"] = hashlib.sha256(kernel["source"].encode()).hexdigest()
    if base != key:
        kernel = dict(BUILDS[key[len(base) + 1:]](kernel), key=key + (f"@{path}" if path else ""))
    return kernel["key"], kernel


def resources(source: str, sass_dir: Path | None, name: str, options: list[str]) -> str:
    binary, log = _cc1d.compile(source, "sm_90", ["--ptxas-options=-v", *options])
    used = "; ".join(m.strip() for m in re.findall(r"Used [^\n]*", log))
    if sass_dir is not None:
        sass_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(binary)
        sass = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
        os.unlink(f.name)
        (sass_dir / (re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".sass")).write_text(sass)
    return used


def input_sets(problem, shape: Shape) -> list:
    """(inputs, outputs) sets, seeds 0, 1, ..., enough of them that a rotation through them
    runs past L2 (timing.n_buffers)."""
    sets = []
    for i in range(n_buffers(problem.bytes_moved(shape))):
        inputs = problem.make_inputs(shape, seed=i)
        sets.append((inputs, problem.make_outputs(shape, inputs)))
    return sets


def peer_calls(shape: Shape, sets: list) -> list | None:
    """causal-conv1d's forward or backward on each input set (None: not installed)."""
    silu = shape.activation == "silu"
    if shape.op == "fwd":
        fwd = causal_conv1d("causal_conv1d_fn")
        act = "silu" if silu else None
        return None if fwd is None else [
            lambda i=i: fwd(i["x"], i["weight"], i["bias"], seq_idx=i["seq_idx"], activation=act) for i, _ in sets]
    bwd = causal_conv1d_bwd()
    return None if bwd is None else [
        lambda i=i: bwd(i["x"], i["weight"], i["bias"], i["dout"], seq_idx=i["seq_idx"], silu=silu) for i, _ in sets]


def print_peer_row(shape: Shape, sets: list, nbytes: int, ceiling: float) -> None:
    """causal-conv1d's forward or backward on the same input sets, as a table row."""
    fns = peer_calls(shape, sets)
    if fns is None:
        print("| causal-conv1d (not installed) | — | — | — | — |")
        return
    try:
        us = graph_time_us(fns)
    except Exception as exc:  # a call it rejects, e.g. channel-first seq_idx
        print(f"| causal-conv1d (failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}) "
              "| — | — | — | — |", flush=True)
        return
    print(f"| causal-conv1d | {us:.1f} | {100 * nbytes / us / 1e3 / ceiling:.0f} % | — | — |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, help="op,layout,x/w dtypes,width,batch,dim,seqlen")
    ap.add_argument("--no-silu", action="store_true")
    ap.add_argument("--seq-idx", action="store_true",
                    help="calls with seq_idx (packed sequences; fwd and bwd shapes): a backward runs the "
                         "candidates' seq_idx build, as the runtime does")
    ap.add_argument("--sass-dir", type=Path)
    ap.add_argument("--peer", action="store_true", help="time causal-conv1d's forward or backward too (fwd, bwd shapes)")
    ap.add_argument("--rounds", type=int, default=1, help="times each candidate is timed, interleaved (default 1)")
    ap.add_argument("candidates", nargs="+", help="KEY, KEY@FILE.cu or KEY@TEMPLATES_DIR")
    args = ap.parse_args()
    shape = parse_shape(args.shape, not args.no_silu, args.seq_idx)
    if args.peer and shape.op not in ("fwd", "bwd"):
        ap.error(f"--peer: causal-conv1d is timed for fwd and bwd shapes, got op {shape.op!r}")
    if args.seq_idx and shape.op not in ("fwd", "bwd"):
        ap.error(f"--seq-idx: seq_idx is a feature of fwd and bwd shapes, got op {shape.op!r}")
    if args.rounds < 1:
        ap.error(f"--rounds: expected a whole number >= 1, got {args.rounds}")
    kernels = []
    for spec in args.candidates:  # every source at hand before the GPU is touched
        try:
            kernels.append(kernel_dict(spec))
        except Exception as exc:  # a bad key, a missing file or folder, a template error
            ap.error(f"candidate {spec!r}: {type(exc).__name__}: {exc}")
    problem = problem_for(shape.op)
    nbytes = problem.bytes_moved(shape)
    sets = input_sets(problem, shape)
    ref = problem.reference(shape, sets[0][0])
    ceiling = copy_ceiling_gbps()
    print(f"{torch.cuda.get_device_name()}; copy {ceiling:.0f} GB/s; {args.shape} silu={not args.no_silu}"
          f"{' seq_idx' if args.seq_idx else ''}")
    print("| candidate | µs | % copy | rel err | registers |")
    print("|---|---|---|---|---|")
    if args.peer:
        print_peer_row(shape, sets, nbytes, ceiling)
    stream = torch.cuda.current_stream().cuda_stream
    checked = []  # (name, launches, rel err, registers) of each candidate
    for name, kernel in kernels:
        used = resources(kernel["source"], args.sass_dir, name, compile_options(shape))
        # Fresh inputs (sets[0]'s seed) for each candidate: the update writes its state
        # in place, so sets[0] after an earlier candidate's timing no longer matches ref.
        inputs = problem.make_inputs(shape, seed=0)
        outputs = problem.make_outputs(shape, inputs)
        problem.launch(_cc1d, kernel, shape, inputs, outputs, stream)
        torch.cuda.synchronize()
        errs = []
        for k, want in ref.items():
            got = outputs[k].double()
            errs.append(((got - want).norm() / want.norm().clamp_min(1e-30)).item())
        fns = [lambda s=s, kernel=kernel: problem.launch(_cc1d, kernel, shape, s[0], s[1],
                                                         torch.cuda.current_stream().cuda_stream) for s in sets]
        checked.append((name, fns, max(errs), used))
    times: list[list[float]] = [[] for _ in checked]  # by candidate (a name may repeat)
    order = list(range(len(checked)))
    for r in range(args.rounds):
        for c in (order if r % 2 == 0 else order[::-1]):
            times[c].append(graph_time_us(checked[c][1]))
            print(f"round {r + 1}: {checked[c][0]} {times[c][-1]:.1f} µs", file=sys.stderr, flush=True)
    for (name, _, err, used), us in zip(checked, times):
        shown = " / ".join(f"{t:.1f}" for t in us)
        print(f"| {name} | {shown} | {100 * nbytes / min(us) / 1e3 / ceiling:.0f} % | {err:.1e} | {used} |",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
