"""Host cost of cc1d's Python call path, piece by piece: how much of an eager
call is validation, argument building, allocation, stream/device lookups and
the runtime call, and what a whole forward and a forward+backward step cost.

Two modes:

* ``--mode host`` (the default without CUDA): a HOST-ONLY MICROBENCHMARK. CPU
  tensors; the C++ runtime is replaced by no-op stubs and the CUDA stream and
  device lookups by constants, so nothing is launched and no GPU is needed.
  It measures the Python work alone, on whatever CPU runs it: use it to
  compare two versions of the Python code on one machine, not as the real
  cost of a call (a real runtime call and CUDA allocations cost more).
* ``--mode cuda`` (the default with CUDA): CUDA tensors and the real runtime,
  synchronised once per round: the real per-piece costs on a GPU machine.

    python benchmarks/bench_python_path.py [--mode host|cuda] [--calls 20000] [--rounds 5] [--out FILE]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
from typing import Callable

import torch

import cc1d
from cc1d import backward, ops

WIDTH = 4
SHAPE = (1, 64, 128)  # (batch, dim, seqlen), bench_overhead.py's too: a kernel shorter than a launch
DTYPE = torch.bfloat16


class _StubPlan:
    """A runtime plan that launches nothing (host mode)."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, *args) -> None:
        pass

    def workspace_bytes(self, *args) -> int:
        return 4096

    def launcher(self):
        return self


class _StubRuntime:
    """cc1d._cc1d's call surface, launching nothing (host mode)."""
    FwdPlan = BwdPlan = _StubPlan

    @staticmethod
    def fwd(*args) -> None:
        pass

    @staticmethod
    def bwd(*args) -> None:
        pass

    @staticmethod
    def bwd_workspace_bytes(*args, **kwargs) -> int:
        return 4096


class _NoDevice:
    """torch.cuda.device without CUDA (host mode): a CPU tensor's device cannot be made current."""

    def __init__(self, device) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


@contextlib.contextmanager
def host_stubs():
    """Patch the runtime, the CUDA lookups and the device requirement away, for CPU tensors."""
    saved = []

    def patch(obj, name, value):
        if hasattr(obj, name):
            saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

    stub = _StubRuntime()
    real_validate = ops._validate
    patch(ops, "runtime", lambda: stub)
    patch(backward, "runtime", lambda: stub)
    patch(ops, "_current_device", lambda: None)  # a CPU tensor's device.index
    patch(ops, "_raw_stream", lambda index: 0)
    patch(ops, "_stream_handle", lambda device: 0)
    patch(ops, "_validate", lambda x, weight, bias, seq_idx, initial_states, final_states_out, activation,
          require_device=True: real_validate(x, weight, bias, seq_idx, initial_states, final_states_out,
                                             activation, require_device=False))
    patch(torch.cuda, "device", _NoDevice)
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_us(fn: Callable[[], object], calls: int, rounds: int, device: str) -> float:
    """Median over rounds of the time per call of `calls` back-to-back calls: wall time
    on the GPU (synchronised once per round), this thread's CPU time on the host (a
    shared, loaded machine preempts the benchmark, which wall time would count)."""
    clock = time.perf_counter if device == "cuda" else time.thread_time
    for _ in range(min(calls, 200)):
        fn()
    times = []
    for _ in range(rounds):
        _sync(device)
        start = clock()
        for _ in range(calls):
            fn()
        _sync(device)
        times.append((clock() - start) * 1e6 / calls)
    return statistics.median(times)


def _inputs(layout: str, device: str, grad: bool = False):
    b, d, n = SHAPE
    x = (torch.randn(b, d, n, device=device, dtype=DTYPE) if layout == "cf"
         else torch.randn(b, n, d, device=device, dtype=DTYPE).transpose(1, 2))
    w = torch.randn(d, WIDTH, device=device, dtype=DTYPE) / WIDTH ** 0.5
    bias = torch.randn(d, device=device, dtype=DTYPE)
    if grad:
        x = x.detach().requires_grad_()
        w.requires_grad_()
        bias.requires_grad_()
    return x, w, bias


class _NoOpFn(torch.autograd.Function):
    """The floor any custom autograd op pays: allocate the output and the gradients, launch nothing."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dout):
        x, weight, bias = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias)


def pieces(layout: str, device: str) -> list[tuple[str, Callable[[], object]]]:
    """(name, fn) of every piece timed for one layout; fns missing from this version are left out."""
    on_gpu = device == "cuda"
    x, w, bias = _inputs(layout, device)
    out = ops._empty_like_layout(x, x.shape)
    fn = cc1d.causal_conv1d_fn
    rows = [
        ("forward: cc1d.causal_conv1d_fn (whole call)", lambda: cc1d.causal_conv1d_fn(x, w, bias, activation="silu")),
        ("forward: ops.causal_conv1d_fn (no package attribute look-up)", lambda: fn(x, w, bias, activation="silu")),
        ("validation: ops._validate",
         lambda: ops._validate(x, w, bias, None, None, None, "silu", require_device=on_gpu)),
    ]
    if hasattr(ops, "_fwd_key"):
        rows.append(("plan look-up: ops._fwd_key + memo", lambda: ops._FWD_PLANS.get(
            ops._fwd_key(x, w, bias, None, None, None, False))))
    rows += [
        ("argument building: ops._fwd_call_args (tuples of ptrs, sizes, strides)",
         lambda: ops._fwd_call_args(x, w, bias, None, None, None, out, True, 0)),
        ("pointers: 4 data_ptr() calls", lambda: (x.data_ptr(), w.data_ptr(), bias.data_ptr(), out.data_ptr())),
        ("allocation: ops._empty_like_layout(x, x.shape)", lambda: ops._empty_like_layout(x, x.shape)),
        ("allocation: torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("allocation: torch.empty(shape, dtype=, device=)",
         lambda: torch.empty(SHAPE, dtype=DTYPE, device=x.device)),
        ("grad check: torch.is_grad_enabled() + requires_grad", lambda: torch.is_grad_enabled() and (
            x.requires_grad or w.requires_grad or bias.requires_grad)),
        ("compile check: torch.compiler.is_compiling()", torch.compiler.is_compiling),
    ]
    if on_gpu:
        from cc1d._runtime import runtime
        rt = runtime()
        stream = torch.cuda.current_stream().cuda_stream
        args = ops._fwd_call_args(x, w, bias, None, None, None, out, True, stream)
        rows += [
            ("stream + device look-ups", lambda: (ops._stream_handle(x.device), ops._current_device())),
            ("runtime: _cc1d.fwd(prebuilt args) (C++ dispatch + launch)", lambda: rt.fwd(*args)),
        ]
        if hasattr(rt, "FwdPlan"):
            plan = rt.FwdPlan(*args[1:6])
            ptrs = args[0]
            rows.append(("runtime: _cc1d.FwdPlan call (C++ dispatch + launch)", lambda: plan(*ptrs, stream)))
            if hasattr(plan, "launcher"):
                launch = plan.launcher()
                rows.append(("runtime: FwdPlan launcher call (what the API calls)", lambda: launch(*ptrs, stream)))
    xg, wg, bg = _inputs(layout, device, grad=True)
    dout = torch.randn_like(xg)
    rows += [
        ("autograd: forward with grad (cc1d.causal_conv1d_fn)", lambda: fn(xg, wg, bg, activation="silu")),
        ("autograd: forward + backward step (autograd.grad)", lambda: torch.autograd.grad(
            fn(xg, wg, bg, activation="silu"), (xg, wg, bg), dout)),
        ("autograd floor: no-op Function forward + backward step", lambda: torch.autograd.grad(
            _NoOpFn.apply(xg, wg, bg), (xg, wg, bg), dout)),
    ]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("host", "cuda"), default="cuda" if torch.cuda.is_available() else "host")
    ap.add_argument("--calls", type=int, default=20000, help="calls per timed round")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (the median is kept)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    if args.calls < 1 or args.rounds < 1:
        ap.error(f"--calls and --rounds: expected positive numbers, got {args.calls} and {args.rounds}")
    device = "cuda" if args.mode == "cuda" else "cpu"
    if device == "cuda":
        cc1d.warmup([SHAPE], dtype=DTYPE, weight_dtype=DTYPE, width=WIDTH, layout="cf")
        cc1d.warmup([SHAPE], dtype=DTYPE, weight_dtype=DTYPE, width=WIDTH, layout="cl")
    stubs = host_stubs() if args.mode == "host" else contextlib.nullcontext()
    rows = []
    with stubs:
        for layout in ("cf", "cl"):
            for name, fn in pieces(layout, device):
                rows.append(dict(piece=name, layout=layout, us=time_us(fn, args.calls, args.rounds, device)))

    where = (torch.cuda.get_device_name() if device == "cuda"
             else f"HOST ONLY: CPU tensors, runtime and CUDA look-ups stubbed ({platform.processor() or 'cpu'})")
    print(f"\n{where}; torch {torch.__version__}; python {platform.python_version()}; shape "
          f"(batch, dim, seqlen) = {SHAPE} {str(DTYPE).replace('torch.', '')}, width {WIDTH}, bias, SiLU; "
          f"{args.calls} calls x {args.rounds} rounds (median)\n")
    print("| piece | cf µs | cl µs |")
    print("|---|---|---|")
    by = {(r["piece"], r["layout"]): r["us"] for r in rows}
    for name in dict.fromkeys(r["piece"] for r in rows):
        print(f"| {name} | {by[(name, 'cf')]:.2f} | {by[(name, 'cl')]:.2f} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(dict(mode=args.mode, device=where, host=platform.node(), torch=torch.__version__,
                           shape=list(SHAPE), dtype=str(DTYPE), width=WIDTH, calls=args.calls,
                           rounds=args.rounds, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
