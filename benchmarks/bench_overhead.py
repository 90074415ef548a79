"""Host overhead of a forward call: wall time per call of back-to-back eager calls
on a tiny shape after warm-up (synchronised once, at the end), through
cc1d.causal_conv1d_fn, through the bare runtime calls cc1d._cc1d.fwd (arguments
built once), a cc1d._cc1d.FwdPlan (pointers and stream per call) and its
launcher (what the API calls: the same without pybind11's dispatch), through
Dao-AILab causal_conv1d_fn when installed, and a one-kernel torch op for scale; and of an eager training step (forward, then torch.autograd.grad)
through cc1d and through a no-op autograd.Function (the floor torch's autograd
sets); and of a decode update (batch 16, dim 5120, vLLM's state layout) through
cc1d.causal_conv1d_update, its plan's launcher and, with --vllm, vLLM's Triton
update. The graph-timed device time of the same cc1d call says whether a row is
bound by the host (wall time above it) or by the GPU. benchmarks/bench_python_path.py
splits the Python side into its pieces.

    python benchmarks/bench_overhead.py [--out overhead.json] [--calls 20000] [--rounds 5]
        [--vllm path/to/vllm/.../causal_conv1d.py]
"""
from __future__ import annotations

import argparse
import json
import platform

import torch

import cc1d
from cc1d import ops, update
from cc1d._runtime import runtime
from bench_python_path import DTYPE, SHAPE, WIDTH, _NoOpFn, _inputs  # one shape and floor for both
from peers import causal_conv1d, vllm_update
from timing import graph_time_us, host_time_us


def _bare_call(x, w, bias):
    """cc1d._cc1d.fwd with its arguments built once: the C++ dispatch + launch alone."""
    out = torch.empty_like(x)
    args = ops._fwd_call_args(x, w, bias, None, None, None, out, True,
                              torch.cuda.current_stream().cuda_stream)
    fwd = runtime().fwd
    return lambda: fwd(*args)


def _plan_call(x, w, bias):
    """A cc1d._cc1d.FwdPlan made once, called with the pointers and stream: what the API's
    eager calls pay in C++ (the binding's conversions included)."""
    out = torch.empty_like(x)
    ptrs, *rest, stream = ops._fwd_call_args(x, w, bias, None, None, None, out, True,
                                             torch.cuda.current_stream().cuda_stream)
    plan = runtime().FwdPlan(*rest)
    return lambda: plan(*ptrs, stream)


def _launcher_call(x, w, bias):
    """_plan_call through the plan's launcher (a builtin function, no pybind11 dispatch):
    what the API's eager calls pay in C++ since the launcher exists."""
    out = torch.empty_like(x)
    ptrs, *rest, stream = ops._fwd_call_args(x, w, bias, None, None, None, out, True,
                                             torch.cuda.current_stream().cuda_stream)
    launch = runtime().FwdPlan(*rest).launcher()
    return lambda: launch(*ptrs, stream)


def _training_steps(layout: str):
    """Forward + torch.autograd.grad (x, weight, bias need grad): through cc1d, and through _NoOpFn."""
    x, w, bias = _inputs(layout, "cuda", grad=True)
    dout = torch.randn_like(x)
    inputs = (x, w, bias)
    return [(lambda: torch.autograd.grad(cc1d.causal_conv1d_fn(x, w, bias, activation="silu"), inputs, dout)),
            (lambda: torch.autograd.grad(_NoOpFn.apply(x, w, bias), inputs, dout))]


UPD_BATCH, UPD_DIM = 16, 5120  # a decode step of bench_update.py's


def _update_cases(vllm):
    """(name, layout, fn, graphable) of the decode update: the API, its plan's launcher
    with the arguments built once, vLLM's (always given indices) when loaded."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(UPD_BATCH, UPD_DIM, generator=g, device="cuda").to(DTYPE)
    state = torch.randn(UPD_BATCH, WIDTH - 1, UPD_DIM, generator=g, device="cuda").to(DTYPE).transpose(1, 2)
    w = torch.randn(UPD_DIM, WIDTH, generator=g, device="cuda").to(DTYPE)
    bias = torch.randn(UPD_DIM, generator=g, device="cuda").to(DTYPE)
    out = torch.empty_like(x)
    ptrs, *rest, silu = update._upd_call_args(x, state, w, bias, None, None, None, out, -1, True)
    launch = runtime().UpdPlan(*rest, silu).launcher()
    stream = torch.cuda.current_stream().cuda_stream
    rows = [("cc1d.causal_conv1d_update (batch 16, dim 5120)", "cl",
             lambda: cc1d.causal_conv1d_update(x, state, w, bias, activation="silu"), True),
            ("cc1d._cc1d.UpdPlan launcher (bare runtime call)", "cl", lambda: launch(*ptrs, stream), False)]
    if vllm is not None:
        idx = torch.arange(UPD_BATCH, device="cuda", dtype=torch.int32)
        rows.append(("vLLM causal_conv1d_update (Triton; batch 16, dim 5120)", "cl",
                     lambda: vllm(x, state, w, bias, activation="silu", conv_state_indices=idx,
                                  null_block_id=None, out=out), True))
    return rows


def cases(peer, vllm=None):
    """(name, layout, fn, graphable) of every path timed. The bare calls keep the
    stream they were built with, so they cannot be captured on the timing graph's;
    nor can autograd's steps."""
    out = []
    for layout in ("cf", "cl"):
        x, w, bias = _inputs(layout, "cuda")
        out.append(("cc1d.causal_conv1d_fn", layout,
                    lambda x=x, w=w, bias=bias: cc1d.causal_conv1d_fn(x, w, bias, activation="silu"), True))
        out.append(("cc1d._cc1d.fwd (bare runtime call)", layout, _bare_call(x, w, bias), False))
        out.append(("cc1d._cc1d.FwdPlan (bare runtime call)", layout, _plan_call(x, w, bias), False))
        out.append(("cc1d._cc1d.FwdPlan launcher (bare runtime call)", layout, _launcher_call(x, w, bias), False))
        if peer is not None:
            out.append(("causal_conv1d.causal_conv1d_fn", layout,
                        lambda x=x, w=w, bias=bias: peer(x, w, bias, activation="silu"), True))
    out += _update_cases(vllm)
    x, _, _ = _inputs("cf", "cuda")
    y = torch.empty_like(x)
    out.append(("torch.mul(x, 1, out=y) (one kernel, for scale)", "cf", lambda: torch.mul(x, 1.0, out=y), True))
    for layout in ("cf", "cl"):
        step, floor = _training_steps(layout)
        out.append(("cc1d training step: causal_conv1d_fn + autograd.grad", layout, step, False))
        out.append(("no-op autograd.Function step (torch's floor)", layout, floor, False))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--calls", type=int, default=20000, help="calls per timed round")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (the median is kept)")
    ap.add_argument("--vllm", default=None, metavar="CAUSAL_CONV1D_PY",
                    help="vLLM's causal_conv1d.py (a source tree's or sdist's): time its update too")
    args = ap.parse_args()
    if args.calls < 1 or args.rounds < 1:
        ap.error(f"--calls and --rounds: expected positive numbers, got {args.calls} and {args.rounds}")
    peer = causal_conv1d("causal_conv1d_fn")
    explained = {layout: cc1d.warmup([SHAPE], dtype=DTYPE, weight_dtype=DTYPE, width=WIDTH, layout=layout)[0]
                 for layout in ("cf", "cl")}
    rows = []
    for name, layout, fn, graphable in cases(peer, vllm_update(args.vllm)):
        row = dict(path=name, layout=layout)
        try:
            for _ in range(100):  # warm: first-call work (peer's included), clocks
                fn()
            torch.cuda.synchronize()
            before = cc1d.dispatch_stats()
            row["host_us"] = host_time_us(fn, args.calls, args.rounds)
            if graphable:
                row["device_us"] = graph_time_us([fn])
            if name.startswith("cc1d"):
                row["warm"] = cc1d.dispatch_stats() == before  # no decision or load while timed
        except Exception as exc:  # the peer rejects some layouts
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)

    dev = torch.cuda.get_device_name()
    print(f"\n{dev}; torch {torch.__version__}; python {platform.python_version()}; shape "
          f"(batch, dim, seqlen) = {SHAPE} {str(DTYPE).replace('torch.', '')}, width {WIDTH}, bias, SiLU; "
          f"{args.calls} calls x {args.rounds} rounds (median); causal_conv1d "
          f"{'installed' if peer else 'not installed'}\n")
    print("| path | layout | host µs per call | device µs per call (graph) |")
    print("|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['path']} | {r['layout']} | {r['error']} | — |")
        else:
            warm = "" if r.get("warm", True) else " (NOT warm: decided or loaded while timed)"
            device = (f"{r['device_us']:.2f}" if "device_us" in r
                      else "— (same kernel as above)" if "_cc1d" in r["path"] else "—")
            print(f"| {r['path']} | {r['layout']} | {r['host_us']:.2f}{warm} | {device} |")
    for layout, e in explained.items():
        print(f"\ncc1d {layout}: {e['key']} ({e['reason']}, from {e['source']})")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(dict(device=dev, host=platform.node(), torch=torch.__version__, shape=list(SHAPE),
                           dtype=str(DTYPE), width=WIDTH, calls=args.calls, rounds=args.rounds,
                           peer_installed=peer is not None, vllm=args.vllm, rows=rows,
                           dispatch={k: {f: e[f] for f in ("key", "reason", "source")}
                                     for k, e in explained.items()}), fh, indent=1)


if __name__ == "__main__":
    main()
