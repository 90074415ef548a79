"""Decode-update benchmark: cc1d.causal_conv1d_update per call at batch 1, 16, 64,
256, dim 5120, width 4, bf16, bias, SiLU (ANCHORS.md's update rows): inside a CUDA
graph (device time), eagerly (wall time per call from Python), its fraction of the
copy ceiling (minimal bytes: read x and the state window, write out and the new
state), the peer's update when ``causal_conv1d`` is importable, and vLLM's Triton
update when ``--vllm`` names its source file (vLLM is not installed on the device:
the file comes from its sdist).
Two graph loops per kernel:
- past L2 (ANCHORS.md's method, the table's main column): the graph cycles through
  enough input sets (x, state or state pool, indices) to move 256 MB, so every call
  finds its inputs in DRAM, as a decode step does between a model's GEMMs. At batch 1
  that is ~3300 sets.
- L2-resident: the same calls over the first sets that fit in 16 MB (at least one,
  21 MB at batch 256), which a loop of one kernel leaves in L2 (what runs before
  session 44 timed at batch 1 and 16, where their 64 sets did not reach past L2).
Also each kernel's time after a GEMM (a decode step's projection, (batch, 5120) @
(5120, 10240) bf16, before every update in the graph, its own time taken off; over the
first 64 sets: the GEMM's 100 MB of weights leave the update's inputs outside L2).
Both conv_state layouts: "cl" (dim contiguous, vLLM's pools) and "cf" (state_len
contiguous, the peer's). vLLM always takes pool indices: where cc1d runs without,
vLLM gets the identity (arange), so both touch the same state rows.
``--state-len`` sets conv_state's length (default width-1, vLLM's; HF transformers'
Mamba caches keep width entries): the state then shifts by the token, the window
being its last width-1 entries.

    python benchmarks/bench_update.py [--out results.json] [--indices] [--vllm causal_conv1d.py]
                                      [--state-len N]
"""
from __future__ import annotations

import argparse
import json
import platform

import torch

import cc1d
from peers import causal_conv1d, vllm_update
from timing import copy_ceiling_gbps, graph_time_us, host_time_us, n_buffers

BATCHES = (1, 16, 64, 256)
DIM, WIDTH, DTYPE = 5120, 4, torch.bfloat16
L2_RESIDENT_BYTES = 16 << 20  # the L2-resident loop's sets: well inside the H100's 50 MB L2
GEMM_SETS = 64                # the after-GEMM loop's sets


def minimal_bytes(batch: int, state_len: int) -> int:
    """Read x and what the step needs of the state (the window, and the entries the shift
    keeps: all but the first), write out and the whole new state."""
    read = 1 + max(state_len - 1, WIDTH - 1)
    return batch * DIM * (read + 1 + state_len) * 2


def make_sets(batch, layout, with_indices, state_len=WIDTH - 1):
    bytes_per_set = minimal_bytes(batch, state_len)
    sets = []
    for _ in range(n_buffers(bytes_per_set)):
        x = torch.randn(batch, DIM, device="cuda", dtype=DTYPE)
        if layout == "cf":
            state = torch.randn(batch, DIM, state_len, device="cuda", dtype=DTYPE)
        else:
            state = torch.randn(batch, state_len, DIM, device="cuda", dtype=DTYPE).transpose(1, 2)
        idx = torch.randperm(batch, device="cuda").to(torch.int32) if with_indices else None
        sets.append((x, state, idx))
    w = torch.randn(DIM, WIDTH, device="cuda", dtype=DTYPE) / WIDTH ** 0.5
    b = torch.randn(DIM, device="cuda", dtype=DTYPE)
    return sets, w, b, bytes_per_set


def _vllm_caller(vllm, sets, w, b):
    """vLLM's update over `sets`, writing a separate out (by default it overwrites x),
    with no null block (cc1d pads nothing here either)."""
    outs = [torch.empty_like(x) for x, _, _ in sets]
    arange = torch.arange(sets[0][0].shape[0], device="cuda", dtype=torch.int32)

    def call(k):
        x, s, i = sets[k]
        return vllm(x, s, w, b, activation="silu", conv_state_indices=arange if i is None else i,
                    null_block_id=None, out=outs[k])
    return call


class _Gemm:
    """A decode step's projection before each update: (batch, DIM) @ (DIM, 2 * DIM) bf16."""

    def __init__(self, batch: int) -> None:
        self.a = torch.randn(batch, DIM, device="cuda", dtype=DTYPE)
        self.w = torch.randn(DIM, 2 * DIM, device="cuda", dtype=DTYPE)
        self.y = torch.empty(batch, 2 * DIM, device="cuda", dtype=DTYPE)
        self.us = graph_time_us([self], calls_per_graph=40)

    def __call__(self):
        return torch.mm(self.a, self.w, out=self.y)


def l2_resident_sets(bytes_per_set: int) -> int:
    """How many of the sets the L2-resident loop cycles through: those within L2_RESIDENT_BYTES,
    at least 1 and at most 64."""
    return max(1, min(64, L2_RESIDENT_BYTES // max(bytes_per_set, 1)))


def _after_gemm_us(fns, gemm: _Gemm, rounds: int = 5, pairs_per_graph: int = 60) -> tuple[float, float]:
    """Device µs per call of fns (cycled) with the GEMM before each, the GEMM's own time taken
    off: per round, the pairs' graph time less the mean of the GEMM's timed just before and just
    after (the GEMM's own time drifts by a few per cent). Returns the rounds' median and their
    spread (max - min)."""
    pairs = [f for fn in fns for f in (gemm, fn)]
    calls = 2 * max(len(fns), pairs_per_graph)
    times = []
    for _ in range(rounds):
        before = graph_time_us([gemm], calls_per_graph=pairs_per_graph)
        both = 2 * graph_time_us(pairs, calls_per_graph=calls)
        after = graph_time_us([gemm], calls_per_graph=pairs_per_graph)
        times.append(both - (before + after) / 2)
    times.sort()
    return times[len(times) // 2], times[-1] - times[0]


def bench(batch, layout, copy_gbps, peer, with_indices, vllm=None, state_len=WIDTH - 1):
    sets, w, b, nbytes = make_sets(batch, layout, with_indices, state_len)
    row = dict(batch=batch, dim=DIM, layout=layout, indices=with_indices, state_len=state_len)
    gemm = _Gemm(batch)
    row.update(gemm_us=gemm.us)

    def ours(x, s, i):
        return cc1d.causal_conv1d_update(x, s, w, b, activation="silu", conv_state_indices=i)

    fns = [lambda a=a: ours(*a) for a in sets]
    hot = l2_resident_sets(nbytes)
    row.update(sets=len(sets), l2_resident_sets=hot)
    us = graph_time_us(fns)
    row.update(cc1d_us=us, cc1d_frac=nbytes / (us * 1e-6) / 1e9 / copy_gbps, cc1d_l2_us=graph_time_us(fns[:hot]),
               cc1d_eager_us=host_time_us(lambda: ours(*sets[0]), calls=2000),
               **dict(zip(("cc1d_after_gemm_us", "cc1d_after_gemm_spread_us"),
                          _after_gemm_us(fns[:GEMM_SETS], gemm))))
    if peer is not None:
        def theirs(x, s, i):
            return peer(x, s, w, b, activation="silu", conv_state_indices=i) if i is not None else \
                peer(x, s, w, b, activation="silu")
        try:
            peer_fns = [lambda a=a: theirs(*a) for a in sets]
            us = graph_time_us(peer_fns)
            row.update(peer_us=us, peer_frac=nbytes / (us * 1e-6) / 1e9 / copy_gbps,
                       peer_l2_us=graph_time_us(peer_fns[:hot]),
                       peer_eager_us=host_time_us(lambda: theirs(*sets[0]), calls=2000))
        except Exception as exc:  # the peer refuses some layouts
            row.update(peer_error=str(exc)[:200])
    if vllm is not None:
        try:
            call = _vllm_caller(vllm, sets, w, b)
            vllm_fns = [lambda k=k: call(k) for k in range(len(sets))]
            us = graph_time_us(vllm_fns)
            row.update(vllm_us=us, vllm_frac=nbytes / (us * 1e-6) / 1e9 / copy_gbps,
                       vllm_l2_us=graph_time_us(vllm_fns[:hot]),
                       **dict(zip(("vllm_after_gemm_us", "vllm_after_gemm_spread_us"),
                                  _after_gemm_us(vllm_fns[:GEMM_SETS], gemm))))
        except Exception as exc:
            row.update(vllm_error=f"{type(exc).__name__}: {str(exc)[:300]}")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--indices", action="store_true", help="also with conv_state_indices (a shuffled pool)")
    ap.add_argument("--vllm", default=None, metavar="causal_conv1d.py",
                    help="vLLM's vllm/model_executor/layers/mamba/ops/causal_conv1d.py: time its update too")
    ap.add_argument("--state-len", type=int, default=WIDTH - 1,
                    help=f"conv_state's length, >= width-1 (default {WIDTH - 1}; HF transformers' caches: {WIDTH})")
    args = ap.parse_args()
    if args.state_len < WIDTH - 1:
        ap.error(f"--state-len must be >= width-1 = {WIDTH - 1}, got {args.state_len}")
    copy_gbps = copy_ceiling_gbps()
    peer = causal_conv1d("causal_conv1d_update")
    vllm = vllm_update(args.vllm)
    rows = [bench(bt, layout, copy_gbps, peer, ind, vllm, args.state_len) for layout in ("cl", "cf") for ind in
            ((False, True) if args.indices else (False,)) for bt in BATCHES]
    dev = torch.cuda.get_device_name()
    print(f"\n{dev}; copy ceiling {copy_gbps:.0f} GB/s; causal_conv1d "
          f"{'installed' if peer else 'not installed'}; dim {DIM}, width {WIDTH}, state_len {args.state_len}, "
          "bf16, bias, SiLU\n")
    print("| state layout | indices | batch | cc1d graph µs | cc1d % copy | cc1d eager µs/call | "
          "peer graph µs | peer % copy | peer eager µs/call | vLLM graph µs | cc1d L2-resident µs | "
          "vLLM L2-resident µs | cc1d after a GEMM µs | vLLM after a GEMM µs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        peer_cols = (f"{r['peer_us']:.2f} | {100 * r['peer_frac']:.0f} % | {r['peer_eager_us']:.1f}"
                     if "peer_us" in r else "— | — | —")
        vllm_col = f"{r['vllm_us']:.2f}" if "vllm_us" in r else r.get("vllm_error", "—")
        vllm_l2 = f"{r['vllm_l2_us']:.2f}" if "vllm_l2_us" in r else "—"
        vllm_gemm = (f"{r['vllm_after_gemm_us']:.2f} ± {r['vllm_after_gemm_spread_us'] / 2:.2f}"
                     if "vllm_after_gemm_us" in r else "—")
        print(f"| {r['layout']} | {'yes' if r['indices'] else 'no'} | {r['batch']} | {r['cc1d_us']:.2f} | "
              f"{100 * r['cc1d_frac']:.0f} % | {r['cc1d_eager_us']:.1f} | {peer_cols} | {vllm_col} | "
              f"{r['cc1d_l2_us']:.2f} | {vllm_l2} | "
              f"{r['cc1d_after_gemm_us']:.2f} ± {r['cc1d_after_gemm_spread_us'] / 2:.2f} | {vllm_gemm} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(dict(device=dev, copy_gbps=copy_gbps, host=platform.node(), rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
