"""Near-shape benchmark: cc1d at sequence lengths around a tuned one, against the peer.

Untuned calls run the nearest tuned winner (docs/DISPATCH.md). A kernel runs whole
tiles or warp segments on its fast path and the rest of a row on a checked edge path,
so a length just short of a tuned one can cost far more per position (session 57: a
channel-first backward at seqlen 2000 served by the seqlen-2048 winner ran 2.6x
slower). For each op and layout this times the forward or backward at every length
given, cc1d and causal-conv1d on the same inputs with their graph replays interleaved
(timing.graph_times_us), and prints µs, % of a copy measured in the same run, the time
per position against the first length's, and the speed against the peer.

    python benchmarks/bench_near.py [--batch 2 --dim 4096] [--lengths 2048,2047,2000,1536,1000,3000]
        [--ops fwd,bwd] [--layouts cf,cl] [--out near.json]

bf16 x and weight, width 4, bias, SiLU.
"""
from __future__ import annotations

import argparse

OPS = ("fwd", "bwd")
LAYOUTS = ("cf", "cl")
DEFAULT_LENGTHS = "2048,2047,2000,1536,1000,3000"


def positive_ints(text: str, option: str, ap: argparse.ArgumentParser) -> list[int]:
    """A comma-separated option's positive integers, or ap.error naming the option (cross_serve.py
    parses its grid with it too)."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        ap.error(f"{option} expects positive integers separated by commas, got {text!r}")
    return values


def _choices(text: str, option: str, allowed: tuple[str, ...], ap: argparse.ArgumentParser) -> list[str]:
    values = text.split(",")
    bad = [v for v in values if v not in allowed]
    if bad:
        ap.error(f"{option} expects some of {', '.join(allowed)} separated by commas, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--dim", type=int, default=4096)
    ap.add_argument("--lengths", default=DEFAULT_LENGTHS,
                    help=f"sequence lengths, the first the reference (default {DEFAULT_LENGTHS})")
    ap.add_argument("--ops", default="fwd,bwd", help="fwd, bwd or both (default both)")
    ap.add_argument("--layouts", default="cf,cl", help="cf, cl or both (default both)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    for name in ("batch", "dim"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} expects a positive integer, got {getattr(args, name)}")
    args.lengths = positive_ints(args.lengths, "--lengths", ap)
    args.ops = _choices(args.ops, "--ops", OPS, ap)
    args.layouts = _choices(args.layouts, "--layouts", LAYOUTS, ap)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)  # before torch touches a GPU: a bad option costs nothing
    import torch

    import cc1d
    from peers import causal_conv1d, causal_conv1d_bwd, causal_conv1d_version
    from timing import (copy_ceiling_gbps, graph_times_us, n_buffers, peer_columns, record_times, run_header,
                        write_interleaved_run)

    dt, width, b_, d_ = torch.bfloat16, 4, args.batch, args.dim
    w = torch.randn(d_, width, device="cuda", dtype=dt) / width ** 0.5
    bias = torch.randn(d_, device="cuda", dtype=dt)
    peers = {"fwd": causal_conv1d("causal_conv1d_fn"), "bwd": causal_conv1d_bwd()}
    copy_gbps = copy_ceiling_gbps()

    def tensor(layout: str, length: int) -> torch.Tensor:
        if layout == "cf":
            return torch.randn(b_, d_, length, device="cuda", dtype=dt)
        return torch.randn(b_, length, d_, device="cuda", dtype=dt).transpose(1, 2)

    rows = []
    for op in args.ops:
        for layout in args.layouts:
            base = None
            for length in args.lengths:
                nbytes = (2 if op == "fwd" else 3) * b_ * d_ * length * 2
                sets = [(tensor(layout, length), tensor(layout, length)) for _ in range(n_buffers(nbytes))]
                peer = peers[op]
                if op == "fwd":
                    cands = {"cc1d": [lambda s=s: cc1d.causal_conv1d_fn(s[0], w, bias, activation="silu")
                                      for s in sets]}
                    if peer is not None:
                        cands["peer"] = [lambda s=s: peer(s[0], w, bias, activation="silu") for s in sets]
                else:
                    cands = {"cc1d": [lambda s=s: cc1d.causal_conv1d_bwd(s[0], w, bias, s[1], activation="silu")
                                      for s in sets]}
                    if peer is not None:
                        cands["peer"] = [lambda s=s: peer(s[0], w, bias, s[1]) for s in sets]
                row = dict(op=op, layout=layout, shape=[b_, d_, length])
                record_times(row, graph_times_us(cands), lambda us, n=nbytes: n / (us * 1e-6) / 1e9 / copy_gbps)
                base = base or (row["cc1d_us"], length)
                row["per_position_vs_first"] = (row["cc1d_us"] / length) / (base[0] / base[1])
                rows.append(row)
                del sets

    dev = torch.cuda.get_device_name()
    print(run_header(dev, copy_gbps, any(peers.values())))
    print("| op | layout | (batch, dim, seqlen) | cc1d µs | cc1d % copy | per position vs first length | "
          "peer µs | peer % | cc1d/peer speed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        peer_cols = peer_columns(r, r["cc1d_us"], speed_suffix="x")
        print(f"| {r['op']} | {r['layout']} | {tuple(r['shape'])} | {r['cc1d_us']:.1f} | "
              f"{100 * r['cc1d_frac']:.0f} % | {r['per_position_vs_first']:.2f}x | {peer_cols} |")
    if args.out:
        write_interleaved_run(args.out, rows, device=dev, copy_gbps=copy_gbps,
                              peer_version=causal_conv1d_version())


if __name__ == "__main__":
    main()
