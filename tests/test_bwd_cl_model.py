"""The channel-last backward's streaming schedule (templates/bwd_channel_last.cu.j2),
modelled in Python and checked against a direct float64 formulation of the
gradients, without a GPU.

The model follows the kernel's control flow for one channel: work items of
TILE_L positions, runs of RUN positions per thread, the run's start (FULL: one
batch of loads; EDGE: row by row), steps of STEP rows (FULL where whole
vectors, inside the sequence, before its last HALO rows, and with seq_idx inside
one sequence; EDGE otherwise), the rolling x/g/id windows, and which run counts
which output's dweight/dbias terms. The reference scatters each output's
gradient to its inputs instead, so an index slip in the model (or a schedule
that counts a position twice or never) shows up as a mismatch."""
from __future__ import annotations

import math
import random

import pytest

from cc1d.generator import Family, Variant, families, variants


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


class Problem:
    """One channel of one batch row, with every feature of the backward."""

    def __init__(self, rng: random.Random, L: int, W: int, *, silu: bool, seq: bool, init: bool, final: bool):
        self.L, self.W, self.H = L, W, W - 1
        self.x = [rng.gauss(0, 1) for _ in range(L)]
        self.dout = [rng.gauss(0, 1) for _ in range(L)]
        self.w = [rng.gauss(0, 1) for _ in range(W)]
        self.bias = rng.gauss(0, 1)
        self.silu = silu
        self.init = [rng.gauss(0, 1) for _ in range(self.H)] if init else None
        self.dfinal = [rng.gauss(0, 1) for _ in range(self.H)] if final else None
        self.seq = None
        if seq:  # runs of sequences with padding (-1) between some of them
            ids, cur = [], 0
            while len(ids) < L:
                n = rng.choice((1, 2, 3, 5, 17, 40, 100))
                ids += [-1 if rng.random() < 0.25 else cur] * n
                cur += 1
            self.seq = ids[:L]

    def x_at(self, pos: int) -> float:
        if 0 <= pos < self.L:
            return self.x[pos]
        if -self.H <= pos < 0 and self.init is not None:
            return self.init[self.H + pos]
        return 0.0

    def seq_at(self, pos: int) -> int:
        if self.seq is None:
            return 0
        return self.seq[min(max(pos, 0), self.L - 1)]

    def dfinal_at(self, u: int) -> float:
        h = u - (self.L - self.H)
        return self.dfinal[h] if self.dfinal is not None and 0 <= h < self.H else 0.0


def reference(pb: Problem):
    """dx at positions -H .. L-1 (dinitial_states, then dx), dweight, dbias by scattering
    each output's gradient g[t] to the inputs it read."""
    H, L = pb.H, pb.L
    dx = {u: 0.0 for u in range(-H, L)}
    dw, db = [0.0] * pb.W, 0.0
    for t in range(L):
        if pb.seq_at(t) < 0:
            continue  # padding: the output was a constant 0
        taps = [(k, t - H + k) for k in range(pb.W) if pb.seq_at(t - H + k) == pb.seq_at(t)]
        g = pb.dout[t]
        if pb.silu:
            z = pb.bias + sum(pb.w[k] * pb.x_at(pos) for k, pos in taps)
            s = _sigmoid(z)
            g *= s * (1 + z * (1 - s))
        db += g
        for k, pos in taps:
            dw[k] += g * pb.x_at(pos)
            if pos >= -H:
                dx[pos] += g * pb.w[k]
    for u in range(-H, L):
        dx[u] += pb.dfinal_at(u)
    return dx, dw, db


class Run:
    """One thread's run over its rows, as the kernel walks it."""

    def __init__(self, pb: Problem, sums: list, dx: dict):
        self.pb, self.sums, self.dx = pb, sums, dx
        self.xc = self.gc = self.sc = None

    def row(self, q: int, masked: bool, count: bool) -> float:
        """cl_row: row q arrives; returns dx at q - H. Unmasked (the FULL path):
        no sequence ids are read or compared."""
        pb, H = self.pb, self.pb.H
        xn = pb.x_at(q)
        dn = pb.dout[q] if q < pb.L else 0.0
        sn = pb.seq_at(q) if masked else 0
        differ = (lambda a, b: a != b) if masked else (lambda a, b: False)
        live = q < pb.L and (not masked or sn >= 0)
        g = 0.0
        if live:
            g = dn
            if pb.silu:
                z = pb.bias + sum(0.0 if differ(self.sc[k], sn) else pb.w[k] * self.xc[k] for k in range(H))
                z += pb.w[H] * xn
                s = _sigmoid(z)
                g *= s * (1 + z * (1 - s))
        acc = 0.0
        for k in range(pb.W):
            gk, sk = (g, sn) if k == 0 else (self.gc[H - k], self.sc[H - k])
            acc += 0.0 if differ(self.sc[0], sk) else pb.w[k] * gk
        if count:
            self.sums[-1] += g
            for k in range(pb.W):
                xk = self.xc[k] if k < H else xn
                self.sums[k] += 0.0 if (k < H and differ(self.sc[k], sn)) else g * xk
        self.xc = self.xc[1:] + [xn]
        self.gc = self.gc[1:] + [g]
        if masked:
            self.sc = self.sc[1:] + [sn]
        return acc

    def one_sequence(self, positions) -> bool:
        ids = [self.pb.seq_at(p) for p in positions]
        return ids[0] >= 0 and all(i == ids[0] for i in ids)

    def start(self, t0: int, full_vec: bool):
        pb, H = self.pb, self.pb.H
        full = full_vec and t0 >= H and t0 + H <= pb.L
        if full and (pb.seq is None or self.one_sequence(range(t0 - H, t0 + H))):
            self.xc = [pb.x[t0 - H + i] for i in range(H)]
            self.gc = [0.0] * H
            self.sc = [pb.seq_at(t0 - H)] * H if pb.seq is not None else [0] * H
            for i in range(H):
                self.row(t0 + i, masked=False, count=False)
            return "full"
        self.gc = [0.0] * H
        self.xc = [pb.x_at(t0 - H + i) for i in range(H)]
        self.sc = [pb.seq_at(t0 - H + i) for i in range(H)]
        for i in range(H):
            d = self.row(t0 + i, masked=True, count=t0 == 0)
            if t0 + i - H < 0:  # the run at 0: dinitial_states (final states' gradient added)
                self.dx[t0 + i - H] = d + pb.dfinal_at(t0 + i - H)
        return "edge"

    def step(self, s: int, step: int, full_vec: bool):
        pb, H = self.pb, self.pb.H
        full = full_vec and s + step + H <= pb.L
        if full and (pb.seq is None or self.one_sequence([*range(s, s + H), *range(s + H, s + H + step)])):
            # cl_step_full compares the carried ids, which are those of s .. s+H-1
            assert pb.seq is None or self.sc == [pb.seq_at(p) for p in range(s, s + H)]
            for i in range(step):
                self.dx[s + i] = self.row(s + i + H, masked=False, count=True)
            return "full"
        for i in range(step):
            if s + i >= pb.L:
                break
            self.dx[s + i] = self.row(s + i + H, masked=True, count=True) + pb.dfinal_at(s + i)
        return "edge"


def kernel_model(pb: Problem, *, run: int, step: int, tl: int, full_vec: bool, paths: set):
    """dx at -H .. L-1 (dinitial_states first), dweight, dbias as the kernel computes
    them for one channel, with tl runs per work item (the block's threads along
    the sequence)."""
    H, L = pb.H, pb.L
    tile_l = tl * run
    dx: dict = {}
    per_thread = []
    for chunk in range(-(-L // tile_l)):
        for t in range(tl):
            t0 = chunk * tile_l + t * run
            sums = [0.0] * (pb.W + 1)
            per_thread.append(sums)
            if t0 >= L:
                continue
            r = Run(pb, sums, dx)
            paths.add("start_" + r.start(t0, full_vec))
            for j in range(run // step):
                s = t0 + j * step
                if s >= L:
                    break
                for u in range(s, min(s + step, L)):
                    assert u not in dx, f"dx at {u} written twice"
                paths.add("step_" + r.step(s, step, full_vec))
    dw = [sum(s[k] for s in per_thread) for k in range(pb.W)]
    db = sum(s[-1] for s in per_thread)
    return dx, dw, db


CASES = [(L, W, run, step, tl) for L in (1, 2, 3, 7, 33, 131, 260) for W in (2, 4, 8)
         for run, step, tl in ((16, 4, 2), (8, 2, 3), (16, 8, 1))]


@pytest.mark.parametrize("L, W, run, step, tl", CASES)
def test_streaming_schedule_matches_direct_gradients(L, W, run, step, tl):
    rng = random.Random(f"{L}.{W}.{run}.{step}.{tl}")
    paths: set = set()
    for silu, seq, init, final in ((False, False, False, False), (True, False, True, True),
                                   (True, True, True, True), (False, True, False, True)):
        pb = Problem(rng, L, W, silu=silu, seq=seq, init=init, final=final)
        want_dx, want_dw, want_db = reference(pb)
        for full_vec in (True, False):
            dx, dw, db = kernel_model(pb, run=run, step=step, tl=tl, full_vec=full_vec, paths=paths)
            # every position inside the sequence written exactly once (asserted while writing)
            assert sorted(dx) == list(range(-W + 1, L))
            for u in range(-W + 1, L):
                assert dx[u] == pytest.approx(want_dx[u], rel=1e-9, abs=1e-9), (u, silu, seq, full_vec)
            for k in range(W):
                assert dw[k] == pytest.approx(want_dw[k], rel=1e-9, abs=1e-9), (k, silu, seq, full_vec)
            assert db == pytest.approx(want_db, rel=1e-9, abs=1e-9)
    if L >= 2 * run * tl:  # long enough for every path
        assert paths == {"start_full", "start_edge", "step_full", "step_edge"}, paths


def test_every_variant_tiles_the_sequence_in_whole_runs():
    for fam in families("bwd", "cl")[::5]:
        for v in variants(fam):
            g = v.geometry()
            ve = int(v.params["vec_bytes"]) // fam.x_bytes
            tl = g["threads"] // (g["tile_d"] // ve)
            assert g["tile_l"] == tl * v.params["run"] and v.params["run"] % v.params["step"] == 0, v.key()
