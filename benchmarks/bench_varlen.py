"""Varlen prefill benchmark: cc1d.causal_conv1d_varlen_fn (packed sequences of
mixed lengths, a shuffled state pool read and written) as a fraction of the copy
ceiling measured in the same run, graph-timed like bench_fwd.py. For scale, the
same tokens through cc1d.causal_conv1d_fn with seq_idx (one packed row, no
state pool) and, when installed, the peer's causal_conv1d_fn with seq_idx
(channel-last only). Minimal bytes: read x, write out, read and write the
states of each sequence.

    python benchmarks/bench_varlen.py [--out results.json]
"""
from __future__ import annotations

import argparse
import json
import platform

import torch

import cc1d
from cc1d.tuner.problems import varlen_lengths
from peers import causal_conv1d
from timing import copy_ceiling_gbps, graph_time_us, n_buffers

# (layout, num_seqs, total_tokens); dim 5120, bf16 x and weight, width 4, SiLU, bias
CASES = [("cf", 8, 16384), ("cf", 64, 16384), ("cf", 8, 65536), ("cf", 64, 65536),
         ("cl", 8, 16384), ("cl", 64, 16384), ("cl", 8, 65536), ("cl", 64, 65536)]
DIM, WIDTH, STATE_LEN = 5120, 4, 3


def make_set(layout, num, total, gen):
    lens = varlen_lengths(num, total)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(num)], dtype=torch.int32, device="cuda")
    seq_idx = torch.repeat_interleave(torch.arange(num, dtype=torch.int32), torch.tensor(lens)).cuda()[None]
    # drawn on the GPU: CPU draws of 65536 x 5120 took most of the benchmark's time
    x = torch.randn(DIM, total, device="cuda", dtype=torch.bfloat16) if layout == "cf" else \
        torch.randn(total, DIM, device="cuda", dtype=torch.bfloat16).t()
    pool = torch.randn(num + 16, STATE_LEN, DIM, generator=gen).to(torch.bfloat16).cuda().transpose(1, 2)
    ci = torch.randperm(num + 16, generator=gen)[:num].to(torch.int32).cuda()
    his = (torch.rand(num, generator=gen) < 0.7).cuda()
    return dict(x=x, cu=cu, seq_idx=seq_idx, pool=pool, ci=ci, his=his, max_seqlen=max(lens))


def bench_case(case, copy_gbps, peer):
    layout, num, total = case
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(DIM, WIDTH, generator=gen) / 2).to(torch.bfloat16).cuda()
    b = torch.randn(DIM, generator=gen).to(torch.bfloat16).cuda()
    nbytes = 2 * DIM * total * 2 + 2 * num * DIM * STATE_LEN * 2
    sets = [make_set(layout, num, total, gen) for _ in range(n_buffers(nbytes))]
    row = dict(layout=layout, num_seqs=num, total_tokens=total, dim=DIM, width=WIDTH, bytes=nbytes)

    def frac(us):
        return nbytes / (us * 1e-6) / 1e9 / copy_gbps

    def varlen(s, bound):
        return cc1d.causal_conv1d_varlen_fn(s["x"], w, b, s["cu"], conv_states=s["pool"], cache_indices=s["ci"],
                                            has_initial_state=s["his"], activation="silu", max_seqlen=bound)

    us = graph_time_us([lambda s=s: varlen(s, s["max_seqlen"]) for s in sets])
    row.update(cc1d_us=us, cc1d_frac=frac(us))
    us = graph_time_us([lambda s=s: varlen(s, None) for s in sets])  # grid bounded by total_tokens
    row.update(cc1d_nobound_us=us, cc1d_nobound_frac=frac(us))
    us = graph_time_us([lambda s=s: cc1d.causal_conv1d_fn(s["x"][None], w, b, seq_idx=s["seq_idx"],
                                                          activation="silu") for s in sets])
    row.update(fwd_seqidx_us=us)
    if peer is not None and layout == "cl":
        try:
            us = graph_time_us([lambda s=s: peer(s["x"][None], w, b, seq_idx=s["seq_idx"], activation="silu")
                                for s in sets])
            row.update(peer_us=us)
        except Exception as exc:  # noqa: BLE001 - report, do not abort the table
            row.update(peer_error=str(exc)[:200])
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    copy_gbps = copy_ceiling_gbps()
    peer = causal_conv1d("causal_conv1d_fn")
    rows = []
    for c in CASES:
        rows.append(bench_case(c, copy_gbps, peer))
        print(f"{c}: {rows[-1]['cc1d_us']:.1f} us", flush=True)
    dev = torch.cuda.get_device_name()
    print(f"\n{dev}; copy ceiling {copy_gbps:.0f} GB/s; dim {DIM}, bf16, width {WIDTH}, SiLU, bias, "
          f"state pool (state_len {STATE_LEN}); causal_conv1d {'installed' if peer else 'not installed'}\n")
    print("| layout | seqs | tokens | cc1d µs (max_seqlen) | % copy | cc1d µs (no bound) | % copy | "
          "fwd+seq_idx µs | peer seq_idx µs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        peer = f"{r['peer_us']:.1f}" if "peer_us" in r else "—"
        print(f"| {r['layout']} | {r['num_seqs']} | {r['total_tokens']} | {r['cc1d_us']:.1f} | "
              f"{100 * r['cc1d_frac']:.0f} % | {r['cc1d_nobound_us']:.1f} | {100 * r['cc1d_nobound_frac']:.0f} % | "
              f"{r['fwd_seqidx_us']:.1f} | {peer} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(dict(device=dev, copy_gbps=copy_gbps, host=platform.node(), rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
