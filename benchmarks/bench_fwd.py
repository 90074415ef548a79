"""Forward benchmark: cc1d (default dispatch) vs torch conv1d and, when installed,
Dao-AILab causal_conv1d, on the shapes of ANCHORS.md. Prints a markdown table
and writes JSON; bandwidth is a fraction of the copy ceiling measured in the
same run (minimal bytes: read x, write out).

    python benchmarks/bench_fwd.py [--out results.json] [--quick]
"""
from __future__ import annotations

import argparse
import platform

import torch
import torch.nn.functional as F

import cc1d
from peers import causal_conv1d, causal_conv1d_version
from timing import (copy_ceiling_gbps, graph_times_us, n_buffers, peer_columns, record_times, run_header,
                    write_interleaved_run)

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}

# (layout, x dtype, weight dtype, width, batch, dim, seqlen)
CASES = [
    ("cf", "bf16", "bf16", 4, 1, 2048, 512),
    ("cf", "bf16", "bf16", 4, 2, 4096, 2048),
    ("cf", "bf16", "bf16", 4, 8, 5120, 2048),
    ("cf", "bf16", "bf16", 4, 4, 8192, 4096),
    ("cf", "bf16", "bf16", 4, 1, 5376, 32768),
    ("cf", "f32", "f32", 4, 8, 5120, 2048),
    ("cf", "f16", "f16", 4, 8, 5120, 2048),
    ("cf", "bf16", "bf16", 2, 8, 5120, 2048),
    ("cf", "bf16", "bf16", 3, 8, 5120, 2048),
    ("cf", "bf16", "f32", 4, 8, 5120, 2048),
    ("cl", "bf16", "bf16", 4, 8, 5120, 2048),
    ("cl", "bf16", "bf16", 4, 1, 5376, 32768),
    ("cl", "bf16", "bf16", 4, 2, 4096, 2048),
    ("cf", "bf16", "bf16", 8, 8, 5120, 2048),
    ("cl", "bf16", "bf16", 8, 8, 5120, 2048),
]


def make_sets(layout, xd, wd, width, batch, dim, seqlen):
    bytes_per_set = 2 * batch * dim * seqlen * torch.finfo(DT[xd]).bits // 8
    sets = []
    for _ in range(n_buffers(bytes_per_set)):
        if layout == "cf":
            x = torch.randn(batch, dim, seqlen, device="cuda", dtype=DT[xd])
        else:
            x = torch.randn(batch, seqlen, dim, device="cuda", dtype=DT[xd]).transpose(1, 2)
        sets.append(x)
    w = torch.randn(dim, width, device="cuda", dtype=DT[wd]) / width ** 0.5
    b = torch.randn(dim, device="cuda", dtype=DT[wd])
    return sets, w, b, bytes_per_set


def bench_case(case, copy_gbps, peer):
    layout, xd, wd, width, batch, dim, seqlen = case
    sets, w, b, nbytes = make_sets(*case)
    row = dict(layout=layout, x=xd, w=wd, width=width, shape=[batch, dim, seqlen])

    def frac(us):
        return nbytes / (us * 1e-6) / 1e9 / copy_gbps

    wc = w.to(sets[0].dtype)[:, None, :]
    bc = b.to(sets[0].dtype)

    def torch_conv(x):
        return F.silu(F.conv1d(x, wc, bc, padding=width - 1, groups=dim)[..., :seqlen])
    # on the same inputs, their replays interleaved (timing.graph_times_us)
    candidates = {"cc1d": [lambda x=x: cc1d.causal_conv1d_fn(x, w, b, activation="silu") for x in sets],
                  "torch": [lambda x=x: torch_conv(x) for x in sets]}
    if peer is not None:
        candidates["peer"] = [lambda x=x: peer(x, w, b, activation="silu") for x in sets]
    record_times(row, graph_times_us(candidates), frac)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="first three cases only")
    args = ap.parse_args()
    copy_gbps = copy_ceiling_gbps()
    peer = causal_conv1d("causal_conv1d_fn")
    cases = CASES[:3] if args.quick else CASES
    rows = [bench_case(c, copy_gbps, peer) for c in cases]
    dev = torch.cuda.get_device_name()
    print(run_header(dev, copy_gbps, peer is not None))
    print("| layout | x/w | width | (batch, dim, seqlen) | cc1d µs | cc1d % copy | torch µs | "
          "torch % | peer µs | peer % | cc1d/peer speed |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        peer_cols = peer_columns(r, r["cc1d_us"])
        print(f"| {r['layout']} | {r['x']}/{r['w']} | {r['width']} | {tuple(r['shape'])} | "
              f"{r['cc1d_us']:.1f} | {100 * r['cc1d_frac']:.0f} % | {r['torch_us']:.1f} | "
              f"{100 * r['torch_frac']:.0f} % | {peer_cols} |")
    if args.out:
        write_interleaved_run(args.out, rows, device=dev, copy_gbps=copy_gbps, host=platform.node(),
                              peer_version=causal_conv1d_version())


if __name__ == "__main__":
    main()
