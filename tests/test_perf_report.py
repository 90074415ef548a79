"""benchmarks/perf_report.py names, for each table, the run its numbers come from: each
benchmark JSON is its own run with its own copy measurement."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import benchmark_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "perf_report.py"
report = benchmark_script("perf_report")


def _write(path: Path, data: dict) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def _fwd_row(us: float, frac: float) -> dict:
    return dict(layout="cf", x="bf16", w="bf16", width=4, shape=[8, 5120, 2048], cc1d_us=us, cc1d_frac=frac)


def test_each_table_names_its_runs_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "plot", lambda rows, path: None)  # no matplotlib needed
    fwd = _write(tmp_path / "fwd.json", dict(device="GPU A", copy_gbps=2991.8, rows=[_fwd_row(114.1, 0.98)]))
    bwd_row = dict(_fwd_row(0, 0), bwd_us=184.5, bwd_frac=0.91)
    bwd = _write(tmp_path / "bwd.json", dict(device="GPU A", copy_gbps=3001.6, rows=[bwd_row]))
    upd = _write(tmp_path / "upd.json", dict(device="GPU B", copy_gbps=2997.4, rows=[
        dict(batch=256, layout="cl", indices=False, cc1d_us=10.1, cc1d_frac=0.69)]))
    report.main(["--fwd", fwd, "--bwd", bwd, "--update", upd, "--out", str(tmp_path / "out")])
    page = (tmp_path / "out" / "PERFORMANCE.md").read_text()
    assert "on GPU A and GPU B:" in page
    assert "Forward: one run on GPU A, copy 2992 GB/s. Backward: one run on GPU A, copy 3002 GB/s." in page
    assert "Decode update: one run on GPU B, copy 2997 GB/s." in page
    # one copy figure for the whole page would misstate the other runs' percentages
    assert "same run (2992 GB/s)" not in page
    assert "| fwd channel-first bf16 w4 (8, 5120, 2048) | 114.1 | 98 % |" in page
    assert "| bwd channel-first bf16 w4 (8, 5120, 2048) | 184.5 | 91 % |" in page


def test_a_run_without_a_copy_figure_says_only_its_device(tmp_path):
    ovh = _write(tmp_path / "ovh.json", dict(device="GPU A", rows=[dict(path="cc1d.causal_conv1d_fn", layout="cf",
                                                                         host_us=11.1, device_us=2.5)]))
    report.main(["--overhead", ovh, "--out", str(tmp_path / "out")])
    page = (tmp_path / "out" / "PERFORMANCE.md").read_text()
    assert "Host overhead: one run on GPU A." in page
    assert "| cc1d.causal_conv1d_fn | cf | 11.1 | 2.5 |" in page


@pytest.mark.parametrize("device, warned", [("NVIDIA H200", True), ("NVIDIA H100 80GB HBM3", False)])
def test_a_page_off_the_h100_says_the_anchors_are_another_device(tmp_path, monkeypatch, device, warned):
    """ANCHORS.md's peer figures are H100 ones: a page of runs on another device says so."""
    monkeypatch.setattr(report, "plot", lambda rows, path: None)
    fwd = _write(tmp_path / "fwd.json", dict(device=device, copy_gbps=4242.0, rows=[_fwd_row(81.0, 0.98)]))
    report.main(["--fwd", fwd, "--out", str(tmp_path / "out")])
    page = (tmp_path / "out" / "PERFORMANCE.md").read_text()
    assert ("were measured on an H100, these runs on NVIDIA H200" in page) == warned
    assert "| fwd channel-first bf16 w4 (8, 5120, 2048) | 81.0 | 98 % |" in page


def test_the_page_says_which_runs_timed_the_peer(tmp_path, monkeypatch):
    """The forward and backward tables are separate runs: a forward run without the
    peer beside a backward run with it must not read as if the peer ran in both."""
    monkeypatch.setattr(report, "plot", lambda rows, path: None)
    fwd = _write(tmp_path / "fwd.json", dict(device="GPU A", copy_gbps=2807.0, rows=[_fwd_row(2.9, 0.49)]))
    bwd_row = dict(_fwd_row(0, 0), bwd_us=184.5, bwd_frac=0.91, peer_us=189.5, peer_frac=0.89)
    bwd = _write(tmp_path / "bwd.json", dict(device="GPU A", copy_gbps=3001.6, rows=[bwd_row]))
    peer_run = _write(tmp_path / "old_fwd.json", dict(device="GPU A", copy_gbps=2992.0, peer_version="1.7.0",
                                                     rows=[dict(_fwd_row(3.5, 0.40), peer_us=3.8, peer_frac=0.37)]))
    report.main(["--fwd", fwd, "--bwd", bwd, "--peer-run", peer_run, "--out", str(tmp_path / "out")])
    page = (tmp_path / "out" / "PERFORMANCE.md").read_text()
    assert "ran in the same run as the backward benchmark." in page
    assert "It was not installed in the forward run" in page
    assert "| fwd channel-first bf16 w4 (8, 5120, 2048) | 2.9 | 49 % | — | — | — |" in page
    assert "The peer (causal-conv1d 1.7.0, built from its sdist for sm_90) was installed in that run" in page
    assert "| fwd channel-first bf16 w4 (8, 5120, 2048) | 3.5 | 40 % | 3.8 | 37 % | 1.09x |" in page

    both = _write(tmp_path / "fwd_peer.json", dict(device="GPU A", copy_gbps=2994.0, peer_version="1.7.0",
                                                   rows=[dict(_fwd_row(2.9, 0.49), peer_us=3.8, peer_frac=0.37)]))
    bwd_v = _write(tmp_path / "bwd_v.json", dict(device="GPU A", copy_gbps=3001.6, peer_version="1.7.0",
                                                rows=[bwd_row]))
    report.main(["--fwd", both, "--bwd", bwd_v, "--out", str(tmp_path / "both")])
    page = (tmp_path / "both" / "PERFORMANCE.md").read_text()
    assert ("Dao-AILab causal-conv1d 1.7.0 (built from its sdist for sm_90) ran in the same run as the "
            "forward and backward benchmarks.") in page
    assert "not installed" not in page

    report.main(["--fwd", fwd, "--out", str(tmp_path / "none")])
    page = (tmp_path / "none" / "PERFORMANCE.md").read_text()
    assert "Dao-AILab causal-conv1d was not installed in these runs" in page


def test_the_update_table_sets_each_loop_against_vllms_same_loop(tmp_path):
    """Past L2, L2-resident and after a GEMM are three loops: each ratio is vLLM's time in
    that loop over cc1d's in it. A run from before the L2-resident loop shows a dash."""
    new = dict(batch=1, layout="cl", indices=True, cc1d_us=2.0, cc1d_frac=0.02, vllm_us=2.5,
               cc1d_l2_us=1.44, vllm_l2_us=1.37, cc1d_after_gemm_us=2.5, vllm_after_gemm_us=3.25)
    old = dict(batch=16, layout="cf", indices=False, cc1d_us=1.81, cc1d_frac=0.24, vllm_us=2.96)
    upd = _write(tmp_path / "upd.json", dict(device="GPU B", copy_gbps=3000.0, rows=[new, old]))
    report.main(["--update", upd, "--out", str(tmp_path / "out")])
    page = (tmp_path / "out" / "PERFORMANCE.md").read_text()
    assert ("| 1 | dim-contiguous (vLLM) | yes | 2.00 | 2 % | — | — | 2.50 | 1.25x | 2.3 | 1.44 | 1.37 | 0.95x | "
            "2.50 | 3.25 | 1.30x |") in page
    assert ("| 16 | state-contiguous (peer) | no | 1.81 | 24 % | — | — | 2.96 | 1.64x | 2.8 | — | — | — | "
            "— | — | — |") in page


# The pages perf_report.py wrote, and what it was told besides the runs.
SHIPPED_PAGES = [("docs/PERFORMANCE.md", []),
                 ("docs/h200/PERFORMANCE.md", ["--notes-link", "../PERFORMANCE_NOTES.md"])]


@pytest.mark.parametrize("page, extra", SHIPPED_PAGES, ids=[p for p, _ in SHIPPED_PAGES])
def test_the_shipped_page_is_what_its_stored_runs_give(tmp_path, monkeypatch, page, extra):
    """Each shipped performance page is perf_report.py's output from the runs kept in
    docs/performance (the paths its Notes section names), not text edited by hand, and its
    link to the notes resolves."""
    repo = SCRIPT.parents[1]
    shipped = (repo / page).read_text()
    named = shipped.split("This page was written from ", 1)[1].split(". What each session", 1)[0]
    paths = [p.strip("` ") for p in named.split(",")]
    flags = dict(bench_fwd="--fwd", bench_bwd="--bwd", bench_update="--update", bench_varlen="--varlen",
                 bench_overhead="--overhead")
    argv = []
    for p in paths:
        assert (repo / p).is_file(), p
        argv += [next(f for stem, f in flags.items() if Path(p).stem.startswith(stem)), p]
    monkeypatch.chdir(repo)
    report.main(argv + extra + ["--out", str(tmp_path)])
    assert (tmp_path / "PERFORMANCE.md").read_text() == shipped
    link = shipped.rsplit("[PERFORMANCE_NOTES.md](", 1)[1].split(")", 1)[0]
    assert ((repo / page).parent / link).resolve() == (repo / "docs" / "PERFORMANCE_NOTES.md").resolve()


def test_a_run_timed_interleaved_says_so(tmp_path, monkeypatch):
    """bench_fwd/bench_bwd mark runs whose cc1d and peer replays were interleaved
    (timing.graph_times_us); older runs, timed one after the other, are not so described."""
    monkeypatch.setattr(report, "plot", lambda rows, path: None)
    fwd = _write(tmp_path / "fwd.json", dict(device="GPU A", copy_gbps=3000.0, timing="interleaved",
                                              rows=[_fwd_row(81.0, 0.98)]))
    bwd = _write(tmp_path / "bwd.json", dict(device="GPU A", copy_gbps=3000.0,
                                              rows=[dict(_fwd_row(0, 0), bwd_us=184.5, bwd_frac=0.91)]))
    report.main(["--fwd", fwd, "--bwd", bwd, "--out", str(tmp_path / "out")])
    page = (tmp_path / "out" / "PERFORMANCE.md").read_text()
    assert ("Forward: one run on GPU A, copy 3000 GB/s (cc1d and the others on the same inputs, their graph "
            "replays interleaved). Backward: one run on GPU A, copy 3000 GB/s.") in page
