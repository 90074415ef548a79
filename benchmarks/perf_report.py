"""Write docs/PERFORMANCE.md and its plot from the benchmarks' JSON results.

    python benchmarks/perf_report.py --fwd bench_fwd.json --bwd bench_bwd.json \
        [--update bench_update.json] [--overhead bench_overhead.json] [--out docs]
        [--notes-link ../PERFORMANCE_NOTES.md  (for a page in a folder below docs)]

Every number in the page comes from those files. Each file is one benchmark run,
and its percentages are of the copy measured in that run: each table names its
runs' devices and copy figures. The peers' columns are filled only where the peer
ran in the same run; ANCHORS.md's own peer measurements are quoted beside them,
marked as such.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

# ANCHORS.md (H100, causal-conv1d 1.6.1): the peer's % of copy per benchmark case, for reference
# only where the peer did not run beside us.
ANCHOR_PEER_PCT = {
    ("fwd", "cf", "bf16", 4, (1, 2048, 512)): 42, ("fwd", "cf", "bf16", 4, (2, 4096, 2048)): 87,
    ("fwd", "cf", "bf16", 4, (8, 5120, 2048)): 93, ("fwd", "cf", "bf16", 4, (4, 8192, 4096)): 96,
    ("fwd", "cf", "bf16", 4, (1, 5376, 32768)): 92, ("fwd", "cf", "f32", 4, (8, 5120, 2048)): 97,
    ("fwd", "cf", "f16", 4, (8, 5120, 2048)): 94, ("fwd", "cf", "bf16", 2, (8, 5120, 2048)): 94,
    ("fwd", "cf", "bf16", 3, (8, 5120, 2048)): 94, ("fwd", "cl", "bf16", 4, (8, 5120, 2048)): 86,
    ("fwd", "cl", "bf16", 4, (1, 5376, 32768)): 86,
    ("bwd", "cf", "bf16", 4, (8, 5120, 2048)): 91, ("bwd", "cf", "bf16", 4, (2, 4096, 2048)): 84,
    ("bwd", "cl", "bf16", 4, (8, 5120, 2048)): 62, ("bwd", "cl", "bf16", 4, (2, 4096, 2048)): 59,
}


def _load(path: str | None) -> dict | None:
    return json.loads(Path(path).read_text()) if path else None


def _pct(frac: float | None) -> str:
    return "—" if frac is None else f"{100 * frac:.0f} %"


def _us(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def _case_label(op: str, r: dict) -> str:
    lay = {"cf": "channel-first", "cl": "channel-last"}[r["layout"]]
    dt = r["x"] if r["x"] == r["w"] else f"{r['x']}/{r['w']}"
    return f"{op} {lay} {dt} w{r['width']} {tuple(r['shape'])}"


def rows_of(fwd: dict | None, bwd: dict | None) -> list[dict]:
    """One flat row per benchmark case: op, label, our time and fraction, the peer's."""
    out = []
    for op, res, us_key, frac_key in (("fwd", fwd, "cc1d_us", "cc1d_frac"), ("bwd", bwd, "bwd_us", "bwd_frac")):
        for r in (res or {}).get("rows", []):
            key = (op, r["layout"], r["x"], r["width"], tuple(r["shape"]))
            out.append(dict(op=op, label=_case_label(op, r), us=r[us_key], frac=r[frac_key],
                            peer_us=r.get("peer_us"), peer_frac=r.get("peer_frac"),
                            peer_error=r.get("peer_error"),
                            anchor_pct=ANCHOR_PEER_PCT.get(key) if r["x"] == r["w"] else None,
                            torch_frac=r.get("torch_frac")))
    return out


def _peer_name(res: dict) -> str:
    """causal-conv1d with its version where the benchmark recorded it (older JSON did not)."""
    return f"causal-conv1d {res['peer_version']}" if res.get("peer_version") else "causal-conv1d"


def _same_peer(*runs: dict | None) -> str:
    """The peer with its version where every given run recorded the same one."""
    given = [r for r in runs if r]
    versions = {r.get("peer_version") for r in given}
    return _peer_name(given[0]) if given and len(versions) == 1 else "causal-conv1d"


# What the tables show where the peer did not run.
_NO_PEER = "are empty, and ANCHORS.md's own measurement is quoted for reference."


def peer_sentence(rows: list[dict], peer: str = "causal-conv1d") -> str:
    """Which benchmarks timed the peer in their own run: the forward and backward runs are
    separate, and a device without the peer's wheel leaves one of them without it.
    `peer` names it (with its version where a run recorded one)."""
    names = {"fwd": "forward", "bwd": "backward"}
    ops = list(dict.fromkeys(r["op"] for r in rows))
    ran = [op for op in ops if any(r["peer_us"] or r["peer_error"] for r in rows if r["op"] == op)]
    missing = [names[op] for op in ops if op not in ran]
    if not ran:
        return f"Dao-AILab causal-conv1d was not installed in these runs: the peer columns of the same run {_NO_PEER}"
    text = (f"Dao-AILab {peer} (built from its sdist for sm_90) ran in the same run as the "
            f"{' and '.join(names[op] for op in ran)} benchmark{'s' if len(ran) > 1 else ''}.")
    if missing:
        text += f" It was not installed in the {' and '.join(missing)} run: those peer columns {_NO_PEER}"
    return text


def run_line(what: str, res: dict | None) -> str:
    """Which run a table's numbers come from: its device and the copy its % are of."""
    if not res:
        return ""
    copy = f", copy {res['copy_gbps']:.0f} GB/s" if res.get("copy_gbps") else ""
    how = " (cc1d and the others on the same inputs, their graph replays interleaved)" \
        if res.get("timing") == "interleaved" else ""
    return f"{what}: one run on {res.get('device', '?')}{copy}{how}."


def table(rows: list[dict]) -> list[str]:
    lines = ["| case (batch, dim, seqlen) | cc1d µs | cc1d % of copy | peer µs (same run) | peer % of copy "
             "(same run) | speed vs peer | peer % (ANCHORS) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['peer_us'] / r['us']:.2f}x" if r["peer_us"] else "—"
        peer_us = _us(r["peer_us"]) if not r["peer_error"] else "rejects it"
        anchor = f"{r['anchor_pct']} %" if r["anchor_pct"] else "—"
        lines.append(f"| {r['label']} | {_us(r['us'])} | {_pct(r['frac'])} | {peer_us} | "
                     f"{_pct(r['peer_frac'])} | {ratio} | {anchor} |")
    return lines


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["label"] for r in rows]
    ys = range(len(rows))
    fig, ax = plt.subplots(figsize=(9, 0.34 * len(rows) + 1.5))
    h = 0.38
    ax.barh([y - h / 2 for y in ys], [100 * r["frac"] for r in rows], h, label="cc1d", color="#1f77b4")
    peer = [100 * r["peer_frac"] if r["peer_frac"] else 0 for r in rows]
    ax.barh([y + h / 2 for y in ys], peer, h, label="causal-conv1d (same run)", color="#ff7f0e")
    anchors = [(y, r["anchor_pct"]) for y, r in zip(ys, rows) if r["anchor_pct"]]
    if anchors:
        ax.scatter([a for _, a in anchors], [y + h / 2 for y, _ in anchors], marker="|", s=120, color="k",
                   label="causal-conv1d (ANCHORS.md)", zorder=3)
    ax.set_yticks(list(ys))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 105)
    ax.set_xlabel("% of the device-to-device copy bandwidth (same run)")
    ax.axvline(95, color="grey", lw=0.6, ls="--")
    # Below the axes: inside, it covered the last bars once they reached the ceiling.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.07), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def update_table(res: dict) -> list[str]:
    """bench_update.py's rows: graph-timed device µs (inputs past L2), eager µs per call, % of
    copy; the peers of the same run (vLLM where bench_update had --vllm) and vLLM's ANCHORS.md
    numbers (another H100) for scale; where the run has them, both kernels' µs in an
    L2-resident loop and after a GEMM (each call preceded by a decode step's projection, its
    time taken off)."""
    anchors = {1: 2.3, 16: 2.8, 64: 4.2, 256: 10.9}
    lines = ["| batch | state layout | pool indices | cc1d µs (graph) | cc1d % of copy | cc1d eager µs | "
             "peer µs (same run) | vLLM µs (same run) | speed vs vLLM | vLLM µs (ANCHORS) | "
             "cc1d µs L2-resident | vLLM µs L2-resident | speed vs vLLM L2-resident | "
             "cc1d µs after a GEMM | vLLM µs after a GEMM | speed vs vLLM after a GEMM |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def ratio(theirs, ours):
        return f"{theirs / ours:.2f}x" if ours and theirs else "—"

    for r in res["rows"]:
        lay = {"cl": "dim-contiguous (vLLM)", "cf": "state-contiguous (peer)"}.get(r.get("layout"), "?")
        ours, vllm = r.get("cc1d_us"), r.get("vllm_us")
        ours_h, vllm_h = r.get("cc1d_l2_us"), r.get("vllm_l2_us")
        ours_g, vllm_g = r.get("cc1d_after_gemm_us"), r.get("vllm_after_gemm_us")

        def spread(name):  # half the rounds' range, where the run recorded it
            v = r.get(f"{name}_after_gemm_spread_us")
            return "" if v is None else f" ± {v / 2:.2f}"
        lines.append(f"| {r['batch']} | {lay} | {'yes' if r.get('indices') else 'no'} | {_us(ours, 2)} | "
                     f"{_pct(r.get('cc1d_frac'))} | {_us(r.get('cc1d_eager_us'))} | {_us(r.get('peer_us'), 2)} | "
                     f"{_us(vllm, 2)} | {ratio(vllm, ours)} | {anchors.get(r['batch'], '—')} | {_us(ours_h, 2)} | "
                     f"{_us(vllm_h, 2)} | {ratio(vllm_h, ours_h)} | {_us(ours_g, 2)}{spread('cc1d')} | "
                     f"{_us(vllm_g, 2)}{spread('vllm')} | {ratio(vllm_g, ours_g)} |")
    return lines


def varlen_table(res: dict) -> list[str]:
    lines = ["| layout | sequences | tokens | cc1d µs | % of copy | without max_seqlen µs | "
             "cc1d causal_conv1d_fn + seq_idx µs | peer causal_conv1d_fn + seq_idx µs (same run) | "
             "varlen speed vs peer's seq_idx | seq_idx speed vs peer |", "|---|---|---|---|---|---|---|---|---|---|"]

    def ratio(peer, ours):
        return f"{peer / ours:.2f}x" if ours and peer else "—"

    for r in res["rows"]:
        ours, peer, seq = r.get("cc1d_us"), r.get("peer_us"), r.get("fwd_seqidx_us")
        lines.append(f"| {r['layout']} | {r['num_seqs']} | {r['total_tokens']} | {_us(ours)} | "
                     f"{_pct(r.get('cc1d_frac'))} | {_us(r.get('cc1d_nobound_us'))} | {_us(seq)} | "
                     f"{_us(peer)} | {ratio(peer, ours)} | {ratio(peer, seq)} |")
    return lines


def overhead_table(res: dict) -> list[str]:
    lines = ["| path | layout | host µs per call | device µs |", "|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['path']} | {r.get('layout', '')} | {_us(r.get('host_us'))} | "
                     f"{_us(r.get('device_us'))} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fwd")
    ap.add_argument("--bwd")
    ap.add_argument("--update")
    ap.add_argument("--varlen")
    ap.add_argument("--overhead")
    ap.add_argument("--peer-run", help="a bench_fwd.py JSON of another run in which the peer was installed")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--notes-link", default="PERFORMANCE_NOTES.md",
                    help="the link to docs/PERFORMANCE_NOTES.md as seen from --out (e.g. ../PERFORMANCE_NOTES.md "
                         "for a page in docs/h200)")
    args = ap.parse_args(argv)
    fwd, bwd, upd, vl, ovh, pr = (_load(p) for p in (args.fwd, args.bwd, args.update, args.varlen, args.overhead,
                                                     args.peer_run))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = rows_of(fwd, bwd)
    devices = " and ".join(sorted({r.get("device", "?") for r in (fwd, bwd, upd, vl, ovh) if r})) or "?"
    text = ["# Performance", "",
            f"Measured by `benchmarks/` on {devices}: device time per call inside a CUDA "
            f"graph, inputs rotated over more than the L2, bandwidth as a fraction of a device-to-device "
            f"copy measured in the same run (each table names its runs and their copy figures; the tables "
            f"may come from different runs). cc1d runs through the "
            f"dispatch users get (the shipped tuning DB, else the default kernels). Written by "
            f"`python benchmarks/perf_report.py` from the JSON the benchmarks wrote; the commands are at "
            f"the end.", "",
            peer_sentence(rows, _same_peer(fwd, bwd)), ""]
    if "H100" not in devices:
        text += [f"ANCHORS.md's figures (the columns marked ANCHORS, the plot's ticks) were measured on an H100, "
                 f"these runs on {devices}: they give scale, not a same-device comparison; the same-run peer "
                 f"columns do.", ""]
    text += ["![% of copy per case](performance.png)", "", "## Forward and backward", ""]
    runs = " ".join(filter(None, (run_line("Forward", fwd), run_line("Backward", bwd))))
    text += ([runs, ""] if runs else []) + table(rows)
    if pr:
        text += ["", f"## Side by side with causal-conv1d (another run: {pr.get('device', '?')}, copy "
                 f"{pr.get('copy_gbps', 0):.0f} GB/s)", "",
                 f"The peer ({_peer_name(pr)}, built from its sdist for sm_90) was installed in that run; "
                 "both were timed in it, so the ratio is a same-run ratio.", ""] + table(rows_of(pr, None))
    if upd:
        text += ["", "## Decode update (dim 5120, width 4, bf16, bias, SiLU)", "", run_line("Decode update", upd),
                 ""] + update_table(upd)
    if vl:
        text += ["", "## Varlen prefill (dim 5120, width 4, bf16)", "", run_line("Varlen", vl),
                 ""] + varlen_table(vl)
    if ovh:
        text += ["", "## Host overhead", "", run_line("Host overhead", ovh), ""] + overhead_table(ovh)
    text += ["", "## Commands", "", "```",
             "python benchmarks/bench_fwd.py --out bench_fwd.json",
             "python benchmarks/bench_bwd.py --out bench_bwd.json",
             "python benchmarks/bench_update.py --indices [--vllm PATH/vllm/model_executor/layers/mamba/ops/causal_conv1d.py] "
             "--out bench_update.json",
             "python benchmarks/bench_varlen.py --out bench_varlen.json",
             "python benchmarks/bench_overhead.py --out bench_overhead.json",
             "python benchmarks/perf_report.py --fwd bench_fwd.json --bwd bench_bwd.json "
             "--update bench_update.json --varlen bench_varlen.json --overhead bench_overhead.json "
             "[--peer-run a bench_fwd.json with the peer installed] --out docs", "```", ""]
    sources = [f"`{p}`" for p in (args.fwd, args.bwd, args.update, args.varlen, args.overhead, args.peer_run) if p]
    text += ["## Notes", "", f"This page was written from {', '.join(sources) or 'no runs'}. What each session "
             "measured beside these tables (A/B runs, profiles, what was tried and not kept): "
             f"[PERFORMANCE_NOTES.md]({args.notes_link}).", ""]
    (out / "PERFORMANCE.md").write_text("\n".join(text))
    if rows:
        plot(rows, out / "performance.png")


if __name__ == "__main__":
    main()
