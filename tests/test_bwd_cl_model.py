"""The channel-last backward's streaming schedule (templates/bwd_channel_last.cu.j2),
modelled in Python and checked against a direct float64 formulation of the
gradients, without a GPU.

The model follows the kernel's control flow for one channel: the batch x
ceil(L / STEP) steps cut into equal ranges of whole steps (one per thread along
the sequence in the grid), each range's part in a batch row a run (which may be
shorter than HALO, or start within HALO of position 0), the run's start (FULL:
one batch of loads; EDGE: row by row), steps of STEP rows (FULL where whole
vectors, inside the run and the sequence, before its last HALO rows, and with
seq_idx inside one sequence; EDGE otherwise), the rolling x/g/id windows, and
which run counts which output's dweight/dbias terms. Steps near the sequence's end
(TAIL) load the whole step at once, as FULL does, where there is no seq_idx or
dfinal_states, and so does the run at 0's start (ZERO) without seq_idx. The reference scatters each output's
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
        if t0 == 0 and full_vec and pb.seq is None and H <= pb.L:  # cl_start_zero
            self.xc, self.gc, self.sc = [pb.x_at(i - H) for i in range(H)], [0.0] * H, [0] * H
            for i in range(H):
                d = self.row(i, masked=False, count=True)
                assert i - H not in self.dx, f"dinitial_states at {i - H} written twice"
                self.dx[i - H] = d + pb.dfinal_at(i - H)
            return "zero"
        self.gc = [0.0] * H
        self.xc = [pb.x_at(t0 - H + i) for i in range(H)]
        self.sc = [pb.seq_at(t0 - H + i) for i in range(H)]
        for i in range(H):
            d = self.row(t0 + i, masked=True, count=t0 == 0)
            if t0 == 0 and i - H < 0:  # the run at 0: dinitial_states (final states' gradient added)
                assert i - H not in self.dx, f"dinitial_states at {i - H} written twice"
                self.dx[i - H] = d + pb.dfinal_at(i - H)
        return "edge"

    def step(self, s: int, step: int, t1: int, full_vec: bool):
        pb, H = self.pb, self.pb.H
        full = full_vec and s + step <= t1 and s + step + H <= pb.L
        if full and (pb.seq is None or self.one_sequence([*range(s, s + H), *range(s + H, s + H + step)])):
            # cl_step_full compares the carried ids, which are those of s .. s+H-1
            assert pb.seq is None or self.sc == [pb.seq_at(p) for p in range(s, s + H)]
            for i in range(step):
                self.dx[s + i] = self.row(s + i + H, masked=False, count=True)
            return "full"
        if full_vec and s + step + H > pb.L and pb.seq is None and pb.dfinal is None:
            # cl_step_tail: rows past the end read as zero, rows past t1 count nothing
            for i in range(step):
                d = self.row(s + i + H, masked=False, count=s + i < t1)
                if s + i < t1:
                    self.dx[s + i] = d
            return "tail"
        for i in range(step):
            if s + i >= t1:
                break
            self.dx[s + i] = self.row(s + i + H, masked=True, count=True) + pb.dfinal_at(s + i)
        return "edge"


def kernel_model(pbs: list, *, step: int, ranges: int, full_vec: bool, paths: set):
    """Per batch row dx at -H .. L-1 (dinitial_states first), and dweight, dbias as
    the kernel computes them for one channel of batch rows `pbs`, with `ranges`
    threads along the sequence in the grid (gridDim.x * TL)."""
    L, W = pbs[0].L, pbs[0].W
    row_steps = -(-L // step)
    q, extra = divmod(len(pbs) * row_steps, ranges)
    dxs: list = [{} for _ in pbs]
    per_thread = []
    for j in range(ranges):
        lo = j * q + min(j, extra)
        hi = lo + q + (1 if j < extra else 0)
        sums = [0.0] * (W + 1)
        per_thread.append(sums)
        at = lo
        while at < hi:  # the range's part in each batch row: one run
            b = at // row_steps
            row0 = b * row_steps
            nxt = min(hi, row0 + row_steps)
            t0, t1 = (at - row0) * step, min(L, (nxt - row0) * step)
            r = Run(pbs[b], sums, dxs[b])
            paths.add("start_" + r.start(t0, full_vec))
            if 0 < t0 < pbs[b].H:
                paths.add("start_within_halo")
            for s in range(t0, t1, step):
                for u in range(s, min(s + step, t1)):
                    assert u not in dxs[b], f"dx at {u} of batch row {b} written twice"
                paths.add("step_" + r.step(s, step, t1, full_vec))
            at = nxt
    dw = [sum(s[k] for s in per_thread) for k in range(W)]
    db = sum(s[-1] for s in per_thread)
    return dxs, dw, db


# (step, ranges): long ranges, ranges crossing batch rows, runs shorter than HALO
# that put the next run's start within HALO of position 0, more ranges than steps.
SCHEDULES = ((4, 3), (2, 7), (8, 1), (16, 2), (2, 10_000))
CASES = [(L, W, batch, step, ranges) for L in (1, 2, 3, 7, 33, 131, 260) for W in (2, 4, 8) for batch in (1, 3)
         for step, ranges in SCHEDULES]


@pytest.mark.parametrize("L, W, batch, step, ranges", CASES)
def test_streaming_schedule_matches_direct_gradients(L, W, batch, step, ranges):
    rng = random.Random(f"{L}.{W}.{batch}.{step}.{ranges}")
    paths: set = set()
    for silu, seq, init, final in ((False, False, False, False), (True, False, True, True),
                                   (True, True, True, True), (False, True, False, True)):
        pbs = [Problem(rng, L, W, silu=silu, seq=seq, init=init, final=final) for _ in range(batch)]
        for full_vec in (True, False):
            dxs, dw, db = kernel_model(pbs, step=step, ranges=ranges, full_vec=full_vec, paths=paths)
            want_dw, want_db = [0.0] * W, 0.0
            for pb, dx in zip(pbs, dxs):
                want_dx, row_dw, row_db = reference(pb)
                want_dw = [a + b for a, b in zip(want_dw, row_dw)]
                want_db += row_db
                # every position inside the sequence written exactly once (asserted while writing)
                assert sorted(dx) == list(range(-W + 1, L))
                for u in range(-W + 1, L):
                    assert dx[u] == pytest.approx(want_dx[u], rel=1e-9, abs=1e-9), (u, silu, seq, full_vec)
            for k in range(W):
                assert dw[k] == pytest.approx(want_dw[k], rel=1e-9, abs=1e-9), (k, silu, seq, full_vec)
            assert db == pytest.approx(want_db, rel=1e-9, abs=1e-9)
    if L >= 131 and batch == 1 and 2 <= ranges <= 7:  # runs long enough for every path, not all at 0
        assert paths == {"start_full", "start_edge", "start_zero", "step_full", "step_edge", "step_tail"}, paths
    if ranges >= batch * L and step < W - 1 < L:  # one step per range: the second run starts at `step`
        assert "start_within_halo" in paths


def test_every_variant_covers_a_step_per_thread_along_the_sequence():
    for fam in families("bwd", "cl")[::5]:
        for v in variants(fam):
            g = v.geometry()
            ve = int(v.params["vec_bytes"]) // fam.x_bytes
            tl = g["threads"] // (g["tile_d"] // ve)
            assert g["tile_l"] == tl * v.params["step"], v.key()
            assert g["split_blocks"] % 132 == 0, v.key()  # whole waves on 132 SMs
