"""benchmarks/peers.py: the peer's backward, called by keyword, reaches causal-conv1d's
autograd-Function signature with the arguments in their places (no GPU: a stand-in)."""
from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _peers():
    sys.path.insert(0, str(BENCH))
    try:
        import peers
    finally:
        sys.path.remove(str(BENCH))
    return peers


def test_peer_backward_passes_its_arguments_in_the_functions_order(monkeypatch):
    peers = _peers()
    calls = []
    monkeypatch.setattr(peers, "_causal_conv1d_bwd_raw", lambda: lambda *a: calls.append(a) or "grads")
    bwd = peers.causal_conv1d_bwd()
    assert bwd("x", "w", "b", "dout") == "grads"
    bwd("x", "w", "b", "dout", seq_idx="si", silu=False)
    assert calls == [("x", "w", "b", "dout", None, None, None, None, False, True),
                     ("x", "w", "b", "dout", "si", None, None, None, False, False)]


def test_no_peer_backward_where_causal_conv1d_is_missing(monkeypatch):
    peers = _peers()
    monkeypatch.setattr(peers, "_causal_conv1d_bwd_raw", lambda: None)
    assert peers.causal_conv1d_bwd() is None
