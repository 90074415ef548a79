"""benchmarks/timing.py's graph_times_us without a GPU: torch.cuda's graphs, streams and
events replaced by fakes on a simulated clock. Candidates' replays are interleaved, so a
device that slows down during the run slows each alike (their ratio holds where timing
one after the other does not), and a candidate that fails to capture gets its error."""
from __future__ import annotations

import contextlib
import json

import pytest

from conftest import benchmark_script

pytest.importorskip("torch")
timing = benchmark_script("timing")


class FakeDevice:
    """A device whose every replay takes a candidate's cost times a slowdown that grows
    with each replay (the drift), and records the order of replays."""

    def __init__(self, drift: float):
        self.drift, self.clock, self.replays, self.capturing = drift, 0.0, [], None

    def install(self, monkeypatch):
        dev = self

        class Graph:
            def __init__(self):
                self.calls = []

            def replay(self):
                dev.replays.append(self.name)
                dev.clock += sum(self.calls) * (1.0 + dev.drift * len(dev.replays))

        @contextlib.contextmanager
        def graph(g):
            dev.capturing = g
            try:
                yield
            finally:
                dev.capturing = None

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = dev.clock

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return end.t - self.t  # "ms"

        class Stream:
            def wait_stream(self, other):
                pass

        cuda = timing.torch.cuda
        monkeypatch.setattr(cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(cuda, "graph", graph)
        monkeypatch.setattr(cuda, "Event", Event)
        monkeypatch.setattr(cuda, "Stream", lambda: Stream())
        monkeypatch.setattr(cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(cuda, "current_stream", lambda: Stream())
        monkeypatch.setattr(cuda, "synchronize", lambda: None)

    def kernel(self, name: str, cost: float):
        """A benchmarked function: inside a capture it adds its cost to the graph."""
        def fn():
            g = self.capturing
            if g is not None:
                g.name = name
                g.calls.append(cost)
        return fn


def test_interleaved_replays_keep_the_ratio_of_a_drifting_device(monkeypatch):
    dev = FakeDevice(drift=0.01)
    dev.install(monkeypatch)
    times = timing.graph_times_us({"cc1d": [dev.kernel("cc1d", 1.0)] * 2, "peer": [dev.kernel("peer", 1.0)] * 2},
                                  replays=30)
    assert list(times) == ["cc1d", "peer"]
    assert times["peer"] / times["cc1d"] == pytest.approx(1.0, abs=0.02)  # equal kernels stay equal
    assert dev.replays == ["cc1d", "peer"] + ["cc1d", "peer", "peer", "cc1d"] * 15  # one after capture, then rounds
    # the same two timed one after the other: the drift alone makes the second 30 % slower
    dev2 = FakeDevice(drift=0.01)
    dev2.install(monkeypatch)
    a = timing.graph_time_us([dev2.kernel("cc1d", 1.0)] * 2, replays=30)
    b = timing.graph_time_us([dev2.kernel("peer", 1.0)] * 2, replays=30)
    assert b / a > 1.25


def test_a_candidate_that_fails_gets_its_error_and_the_others_are_timed(monkeypatch):
    dev = FakeDevice(drift=0.0)
    dev.install(monkeypatch)

    def refuses():
        raise RuntimeError("causal_conv1d: width 8 is not supported")

    times = timing.graph_times_us({"cc1d": [dev.kernel("cc1d", 2.0)], "peer": [refuses]}, replays=5)
    assert times["cc1d"] == pytest.approx(2.0 * 1000.0)  # "ms" per call, reported in µs
    assert times["peer"] == "causal_conv1d: width 8 is not supported"
    assert set(dev.replays) == {"cc1d"}


def test_record_times_fills_a_row_and_refuses_a_failed_cc1d(tmp_path):
    row = dict(layout="cf", shape=[2, 64, 128])
    timing.record_times(row, {"cc1d": 10.0, "peer": "width 8 is not supported"}, lambda us: 1.0 / us,
                        {"cc1d": "bwd", "peer": "peer_seq"})
    assert row == dict(layout="cf", shape=[2, 64, 128], bwd_us=10.0, bwd_frac=0.1,
                       peer_seq_error="width 8 is not supported")
    timing.record_times(row, {"cc1d": 4.0, "torch": 8.0, "peer": 5.0}, lambda us: 2.0 / us)
    assert (row["cc1d_frac"], row["torch_us"], row["peer_frac"]) == (0.5, 8.0, 0.4)
    with pytest.raises(RuntimeError, match=r"torch failed on cf \[2, 64, 128\]: out of memory"):
        timing.record_times(row, {"cc1d": 4.0, "torch": "out of memory"}, lambda us: 1.0)
    path = tmp_path / "run.json"
    timing.write_interleaved_run(str(path), [row], device="GPU A", copy_gbps=3000.0)
    assert json.loads(path.read_text()) == dict(device="GPU A", copy_gbps=3000.0, timing="interleaved", rows=[row])


def test_table_cells_the_benchmarks_share():
    """run_header and peer_columns print what bench_fwd, bench_bwd and bench_near printed
    each for themselves: the speed is the peer's time over cc1d's."""
    assert timing.run_header("H200", 4265.4, True) == "\nH200; copy ceiling 4265 GB/s; causal_conv1d installed\n"
    assert timing.run_header("H200", 4265.4, False).endswith("causal_conv1d not installed\n")
    row = dict(peer_us=29.04, peer_frac=0.537)
    assert timing.peer_columns(row, 24.8) == "29.0 | 54 % | 1.17"
    assert timing.peer_columns(row, 24.8, speed_suffix="x") == "29.0 | 54 % | 1.17x"
    assert timing.peer_columns(dict(peer_error="rejects it"), 24.8) == "— | — | —"


def test_setup_runs_before_each_candidates_capture(monkeypatch):
    """bench_moves.py times one call twice, the dispatcher pointed at another DB before each
    capture: the same functions, captured after their own setup, keep what it chose."""
    dev = FakeDevice(drift=0.0)
    dev.install(monkeypatch)
    state = {"db": None}
    order = []

    def call():  # a kernel whose cost the current "DB" decides when it is captured
        order.append(state["db"])
        dev.kernel(state["db"], {"old": 3.0, "new": 2.0}[state["db"]])()

    def point_at(db):
        return lambda: state.update(db=db)

    times = timing.graph_times_us({"after": [call], "before": [call]}, replays=4,
                                  setup={"after": point_at("new"), "before": point_at("old")})
    assert times["after"] == pytest.approx(2.0 * 1000.0) and times["before"] == pytest.approx(3.0 * 1000.0)
    half = len(order) // 2  # warm-up and capture of each, one candidate after the other
    assert half > 0 and order == ["new"] * half + ["old"] * half
