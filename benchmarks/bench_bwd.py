"""Backward benchmark: cc1d's backward (and forward + backward) on the backward
shapes of ANCHORS.md and the forward's long-context one, graph-timed, as a
fraction of the copy ceiling measured in the same run (minimal bytes: read x and
dout, write dx). The peer's backward
(Dao-AILab causal_conv1d) is timed through its own low-level function when
that is installed. With --seq-idx, each case is also timed with packed sequences
(seq_idx: 64 sequences a row, or one per --seq-len tokens, random lengths; the peer takes
seq_idx in channel-last only); CC1D_BWD_GENERIC=1 in the environment gives the A/B against
the plain build.

    python benchmarks/bench_bwd.py [--seq-idx [--seq-len N]] [--out results.json]
"""
from __future__ import annotations

import argparse

import torch

import cc1d
from peers import causal_conv1d_bwd, causal_conv1d_version
from timing import (copy_ceiling_gbps, graph_time_us, graph_times_us, n_buffers, peer_columns, record_times,
                    run_header, write_interleaved_run)

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

# (layout, x dtype, weight dtype, width, batch, dim, seqlen)
CASES = [
    ("cf", "bf16", "bf16", 4, 8, 5120, 2048),
    ("cf", "bf16", "bf16", 4, 2, 4096, 2048),
    ("cl", "bf16", "bf16", 4, 8, 5120, 2048),
    ("cl", "bf16", "bf16", 4, 2, 4096, 2048),
    ("cf", "f32", "f32", 4, 8, 5120, 2048),
    # Long-context training: the forward's (1, 5376, 32768) anchor.
    ("cf", "bf16", "bf16", 4, 1, 5376, 32768),
    ("cl", "bf16", "bf16", 4, 1, 5376, 32768),
]


def _tensor(layout, batch, dim, seqlen, dtype):
    if layout == "cf":
        return torch.randn(batch, dim, seqlen, device="cuda", dtype=dtype)
    return torch.randn(batch, seqlen, dim, device="cuda", dtype=dtype).transpose(1, 2)


def packed_seq_idx(batch, seqlen, sequences=64, seed=0):
    """(batch, seqlen) int32 ids of `sequences` packed sequences a row, lengths random
    (each at least 1), the way packed training batches are."""
    gen = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(seqlen - 1, generator=gen)[:sequences - 1] + 1
    starts = torch.zeros(seqlen, dtype=torch.int32)
    starts[cuts] = 1
    return torch.cumsum(starts, 0).to(torch.int32).expand(batch, seqlen).contiguous().cuda()


def bench_case(case, copy_gbps, peer, with_seq_idx=False, seq_len=None):
    layout, xd, wd, width, batch, dim, seqlen = case
    nbytes = 3 * batch * dim * seqlen * torch.finfo(DT[xd]).bits // 8
    sets = [(_tensor(layout, batch, dim, seqlen, DT[xd]), _tensor(layout, batch, dim, seqlen, DT[xd]))
            for _ in range(n_buffers(nbytes))]
    w = torch.randn(dim, width, device="cuda", dtype=DT[wd]) / width ** 0.5
    b = torch.randn(dim, device="cuda", dtype=DT[wd])
    row = dict(layout=layout, x=xd, w=wd, width=width, shape=[batch, dim, seqlen])

    def frac(us):
        return nbytes / (us * 1e-6) / 1e9 / copy_gbps

    # cc1d and the peer on the same inputs, their replays interleaved (timing.graph_times_us)
    plain = {"cc1d": [lambda s=s: cc1d.causal_conv1d_bwd(s[0], w, b, s[1], activation="silu") for s in sets]}
    if peer is not None:
        plain["peer"] = [lambda s=s: peer(s[0], w, b, s[1]) for s in sets]
    record_times(row, graph_times_us(plain), frac, {"cc1d": "bwd"})

    def step(x, dout):
        cc1d.causal_conv1d_fn(x, w, b, activation="silu")
        cc1d.causal_conv1d_bwd(x, w, b, dout, activation="silu")
    row.update(fwd_bwd_us=graph_time_us([lambda s=s: step(*s) for s in sets]))
    if with_seq_idx:
        sequences = 64 if seq_len is None else max(1, seqlen // seq_len)
        si = packed_seq_idx(batch, seqlen, sequences)
        row.update(sequences=sequences)
        packed = {"cc1d": [lambda s=s: cc1d.causal_conv1d_bwd(s[0], w, b, s[1], seq_idx=si, activation="silu")
                           for s in sets]}
        if peer is not None and layout == "cl":
            packed["peer"] = [lambda s=s: peer(s[0], w, b, s[1], seq_idx=si) for s in sets]
        record_times(row, graph_times_us(packed), frac, {"cc1d": "seq_bwd", "peer": "peer_seq"})
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--seq-idx", action="store_true", help="also time every case with packed sequences")
    ap.add_argument("--seq-len", type=int, default=None, metavar="N",
                    help="with --seq-idx: one sequence per N tokens of a row on average (default: 64 a row)")
    args = ap.parse_args()
    if args.seq_len is not None and (args.seq_len < 1 or not args.seq_idx):
        ap.error(f"--seq-len needs --seq-idx and a positive length, got {args.seq_len}")
    copy_gbps = copy_ceiling_gbps()
    peer = causal_conv1d_bwd()
    rows = [bench_case(c, copy_gbps, peer, args.seq_idx, args.seq_len) for c in CASES]
    dev = torch.cuda.get_device_name()
    print(run_header(dev, copy_gbps, peer is not None))
    print("| layout | x/w | width | (batch, dim, seqlen) | bwd µs | bwd % copy | fwd+bwd µs | "
          "peer bwd µs | peer % | cc1d/peer speed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        peer_cols = peer_columns(r, r["bwd_us"])
        print(f"| {r['layout']} | {r['x']}/{r['w']} | {r['width']} | {tuple(r['shape'])} | "
              f"{r['bwd_us']:.1f} | {100 * r['bwd_frac']:.0f} % | {r['fwd_bwd_us']:.1f} | {peer_cols} |")
    if args.seq_idx:
        print("\n| layout | x/w | (batch, dim, seqlen) | bwd µs | with seq_idx µs | % copy | peer seq_idx µs |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            peer_seq = (f"{r['peer_seq_us']:.1f}" if "peer_seq_us" in r
                        else f"error: {r['peer_seq_error'][:60]}" if "peer_seq_error" in r else "—")
            print(f"| {r['layout']} | {r['x']}/{r['w']} | {tuple(r['shape'])} | {r['bwd_us']:.1f} | "
                  f"{r['seq_bwd_us']:.1f} | {100 * r['seq_bwd_frac']:.0f} % | {peer_seq} |")
    if args.out:
        write_interleaved_run(args.out, rows, device=dev, copy_gbps=copy_gbps,
                              peer_version=causal_conv1d_version())


if __name__ == "__main__":
    main()
