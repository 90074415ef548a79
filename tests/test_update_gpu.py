"""GPU: causal_conv1d_update against the float64 reference (cc1d.reference.
causal_conv1d_update_ref): every covering variant with NaN-poisoned outputs,
every feature combination, padded slots, circular buffers with wrap-around,
state pools with repeated and out-of-order indices, vLLM's speculative window,
multi-token calls equal to single tokens one after another, torch.compile, and
100 calls captured in a CUDA graph replayed with new inputs."""
from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")]

import cc1d  # noqa: E402
from cc1d.reference import causal_conv1d_update_ref  # noqa: E402
from cc1d.update import _upd_call_args  # noqa: E402

from conftest import precompile  # noqa: E402
from cc1d.generator.covering import covering_variants  # noqa: E402

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
PAIRS = (("f32", "f32"), ("f16", "f16"), ("f16", "f32"), ("bf16", "bf16"), ("bf16", "f32"))
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}
DEV = "cuda"


@pytest.fixture(scope="module")
def rt():
    from cc1d._runtime import runtime
    return runtime()


def _gen(seed):
    return torch.Generator(device=DEV).manual_seed(seed)


def make(batch, dim, seqlen, state_len, width, x_dtype, w_dtype, *, layout="cl", pool=None, bias=True,
         two_d=None, seed=0):
    """Fresh random inputs; conv_state (pool, dim, state_len) with state_len ("cf") or dim ("cl") contiguous."""
    g = _gen(seed)
    pool = batch if pool is None else pool
    two_d = seqlen == 1 if two_d is None else two_d
    x = torch.randn(batch, dim, generator=g, device=DEV) if two_d else \
        torch.randn(batch, dim, seqlen, generator=g, device=DEV)
    if layout == "cf":
        state = torch.randn(pool, dim, state_len, generator=g, device=DEV)
    else:
        state = torch.randn(pool, state_len, dim, generator=g, device=DEV).transpose(1, 2)
    w = torch.randn(dim, width, generator=g, device=DEV) / width ** 0.5
    b = torch.randn(dim, generator=g, device=DEV) if bias else None
    return (x.to(DT[x_dtype]), state.to(DT[x_dtype]), w.to(DT[w_dtype]),
            None if b is None else b.to(DT[w_dtype]))


def rel_l2(got, want):
    got, want = got.double(), want.double()
    assert not torch.isnan(got).any(), "NaN in the output (unwritten or poisoned element)"
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def reference(x, state, w, b, **kw):
    """(out in float64, the expected state) without touching `state`."""
    want_state = state.clone()
    out = causal_conv1d_update_ref(x, want_state, w.double(), None if b is None else b.double(),
                                   out_dtype=torch.float64, **kw)
    return out, want_state


def check(x, state, w, b, **kw):
    """The public call against the reference: outputs within tolerance, state bitwise."""
    want_out, want_state = reference(x, state, w, b, **kw)
    out = cc1d.causal_conv1d_update(x, state, w, b, **kw)
    assert out.shape == x.shape and out.dtype == x.dtype
    err = rel_l2(out, want_out)
    assert err < TOL[x.dtype], err
    assert torch.equal(state, want_state), "conv_state differs from the reference"
    return out


def _bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


# ---- every covering variant, launched as itself, NaN-poisoned outputs ----------

def test_every_covering_variant_matches_the_reference(rt):
    target = rt.device_target("hip" if torch.version.hip else "cuda", torch.cuda.current_device())
    chosen = [*covering_variants("upd", "cf", target), *covering_variants("upd", "cl", target)]
    precompile(rt, [v.source for v in chosen], target)
    failures = []
    for i, v in enumerate(chosen):
        f = v.family
        g = v.geometry()
        dim = 2 * g["tile_d"] + 8  # not a multiple of the tile; rows stay 16-byte aligned
        batch = 2 * g["tile_l"] + 1
        # Every other variant takes the batched decode step (one token, state_len =
        # width-1, no cache_seqlens or num_accepted_tokens), plain or with indices.
        batched = i % 2 == 0
        seqlen = 1 if batched else (1, 3)[i // 2 % 2]
        # >= 2: a (pool, dim, 1) state has dim contiguous too, and would read as "cl"
        state_len = max(2, f.width - 1 + (0 if batched else 1 + i // 2 % 2))
        # plain, cache_seqlens, indices, indices + num_accepted_tokens
        mode = (0, 2)[i // 2 % 2] if batched else (1, 3)[i // 4 % 2]
        x, state, w, b = make(batch, dim, seqlen, state_len, f.width, f.x_dtype, f.w_dtype, layout=f.layout,
                              pool=batch + 3, bias=i // 3 % 2 == 0, seed=i)
        kw = dict(activation="silu" if i % 3 else None)
        if mode == 1:
            kw["cache_seqlens"] = torch.randint(0, 50, (batch,), dtype=torch.int32, device=DEV)
        if mode >= 2:
            kw["conv_state_indices"] = torch.randperm(batch + 3, device=DEV)[:batch].to(torch.int32)
            kw["conv_state_indices"][1] = -1  # a padded row
            kw["conv_state_indices"][batch - 1] = kw["conv_state_indices"][0]  # a slot named twice
        if mode == 3:
            kw["num_accepted_tokens"] = torch.randint(1, seqlen + 1, (batch,), dtype=torch.int32, device=DEV)
        want_out, want_state = reference(x, state, w, b, **kw)
        out = torch.full_like(x, float("nan"))
        args = _upd_call_args(x, state, w, b, kw.get("cache_seqlens"), kw.get("conv_state_indices"),
                              kw.get("num_accepted_tokens"), out, -1, kw["activation"] is not None)
        rt.launch_upd(v.as_runtime_dict(), *args, torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
        err = rel_l2(out, want_out) if not torch.isnan(out).any() else float("nan")
        if not err < TOL[x.dtype] or not torch.equal(state, want_state):
            failures.append(f"{v.key()} (dim {dim}, batch {batch}, seqlen {seqlen}, state_len {state_len}, "
                            f"mode {mode}): out error {err}, state equal {torch.equal(state, want_state)}")
    assert not failures, "\n".join(failures)


# ---- every feature combination through the public API --------------------------

@pytest.mark.parametrize("mode", ["plain", "cache_seqlens", "indices", "accepted"])
@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}w{p[1]}")
@pytest.mark.parametrize("seqlen", [1, 4])
def test_features(pair, layout, mode, seqlen):
    for bias, act in itertools.product((False, True), (None, "silu")):
        width = 4
        state_len = width - 2 + seqlen if mode == "accepted" else width - 1 + (seqlen > 1) * 2
        batch, pool = 7, 11
        x, state, w, b = make(batch, 200, seqlen, state_len, width, *pair, layout=layout, pool=pool, bias=bias,
                              seed=hash((pair, layout, mode, seqlen, bias, act)) % 1000)
        kw = dict(activation=act)
        if mode == "cache_seqlens":
            kw["cache_seqlens"] = torch.randint(0, 3 * state_len, (batch,), dtype=torch.int32, device=DEV)
        if mode in ("indices", "accepted"):
            kw["conv_state_indices"] = torch.randperm(pool, device=DEV)[:batch].to(torch.int32)
        if mode == "accepted":
            kw["num_accepted_tokens"] = torch.randint(1, seqlen + 1, (batch,), dtype=torch.int32, device=DEV)
        check(x, state, w, b, **kw)


@pytest.mark.parametrize("width", range(2, 9))
@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_every_width_and_odd_sizes(width, layout):
    # dim 37: no vector divides it (the general fallback), state_len past width-1
    for dim, state_len, seqlen in ((37, width - 1, 1), (37, width + 3, 2), (4096 + 8, width - 1, 1)):
        x, state, w, b = make(5, dim, seqlen, state_len, width, "bf16", "f32", layout=layout, seed=width)
        check(x, state, w, b, activation=True)


def test_activation_spellings_and_the_peer_return_shapes():
    x, state, w, b = make(3, 64, 1, 3, 4, "f32", "f32")
    outs = []
    for act in ("silu", "swish", True):
        s = state.clone()
        outs.append(cc1d.causal_conv1d_update(x, s, w, b, activation=act))
    assert outs[0].shape == (3, 64) and all(torch.equal(o, outs[0]) for o in outs)
    x3 = x.unsqueeze(-1)
    assert cc1d.causal_conv1d_update(x3, state.clone(), w, b).shape == (3, 64, 1)


# ---- padded slots, circular buffers, pools ---------------------------------------

@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("seqlen, state_len", [(2, 5), (1, 3)])  # (1, width-1): the batched decode step
def test_padded_slots_output_zero_and_leave_the_state_untouched(layout, seqlen, state_len):
    batch, pool, pad = 6, 5, 1000
    x, state, w, b = make(batch, 96, seqlen, state_len, 4, "bf16", "bf16", layout=layout, pool=pool)
    before = state.clone()
    idx = torch.tensor([pad, 2, -3, 4, pool + 7, pad], dtype=torch.int32, device=DEV)
    out = check(x, state, w, b, activation="silu", conv_state_indices=idx, pad_slot_id=pad)
    for row in (0, 2, 4, 5):
        assert torch.equal(out[row], torch.zeros_like(out[row])), row
    for slot in (0, 1, 3):  # named by no live row
        assert torch.equal(_bits(state[slot]), _bits(before[slot])), slot
    assert not torch.equal(state[2], before[2]) and not torch.equal(state[4], before[4])


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("seqlen", [1, 3, 9])  # 9 > state_len: the buffer wraps within one call
def test_circular_buffer_wraps_around(layout, seqlen):
    state_len = 6
    x, state, w, b = make(6, 80, seqlen, state_len, 4, "f16", "f32", layout=layout, seed=seqlen)
    seqlens = torch.tensor([0, 1, 5, 6, 13, 2 ** 20 + 3], dtype=torch.int32, device=DEV)
    check(x, state, w, b, activation="silu", cache_seqlens=seqlens)


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("seqlen, state_len", [(2, 4), (1, 3)])  # (1, width-1): the batched decode step
def test_pool_with_repeated_and_out_of_order_indices(layout, seqlen, state_len):
    """Repeated indices mean: rows naming one slot run one after another in batch order,
    each seeing the state the previous one left (as separate calls would)."""
    batch, pool = 7, 5
    x, state, w, b = make(batch, 130, seqlen, state_len, 4, "bf16", "f32", layout=layout, pool=pool, seed=3)
    idx = torch.tensor([3, 0, 3, 2, 0, 3, 4], dtype=torch.int32, device=DEV)
    s0 = state.clone()
    out = check(x, state, w, b, activation="silu", conv_state_indices=idx)
    # the same as one call per row, in order
    seq_state = s0.clone()
    for row in range(batch):
        one = cc1d.causal_conv1d_update(x[row:row + 1], seq_state, w, b, activation="silu",
                                        conv_state_indices=idx[row:row + 1])
        assert torch.equal(one[0], out[row]), row
    assert torch.equal(seq_state, state)
    assert torch.equal(_bits(state[1]), _bits(s0[1]))  # never named


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("batch", [1024, 1025, 2100])
def test_pool_on_both_sides_of_the_blocks_shared_index_copy(layout, batch):
    """The batched decode step copies up to 1024 indices into shared memory for the slots
    and the repeated-slot scan; larger batches read conv_state_indices directly. Repeated
    slots (one named three times, far apart), padded rows and out-of-order slots."""
    pool = batch + 40
    x, state, w, b = make(batch, 72, 1, 3, 4, "bf16", "f32", layout=layout, pool=pool, seed=batch)
    idx = torch.randperm(pool, device=DEV)[:batch].to(torch.int32)
    idx[batch - 1] = idx[0]
    idx[batch // 2] = idx[0]
    idx[5] = -1
    idx[batch - 7] = -1
    s0 = state.clone()
    out = check(x, state, w, b, activation="silu", conv_state_indices=idx)
    assert torch.equal(out[5], torch.zeros_like(out[5]))
    unnamed = sorted(set(range(pool)) - set(idx.tolist()))
    assert torch.equal(_bits(state[unnamed]), _bits(s0[unnamed]))


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("batch", [1, 16, 64, 256])
def test_tuned_decode_shapes_with_a_pool(layout, batch):
    """The shipped DB's update shapes, where calls with conv_state_indices have winners of
    their own ("pool"); batch 1 skips the duplicate-slot scan. A padded row past batch 1."""
    pool = 2 * batch + 1
    x, state, w, b = make(batch, 5120, 1, 3, 4, "bf16", "bf16", layout=layout, pool=pool, seed=batch)
    idx = torch.randperm(pool, device=DEV)[:batch].to(torch.int32)
    if batch > 1:
        idx[batch // 2] = -1
    e = cc1d.explain_update(x, state, w, b, activation="silu", conv_state_indices=idx)
    assert e["shape"] == f"b{batch}.d5120.l1.bias.silu.pool" and e["reason"] == "exact", e
    assert e["key"].startswith(f"upd.{layout}.bf16wbf16.w4."), e
    out = check(x, state, w, b, activation="silu", conv_state_indices=idx)
    if batch > 1:
        assert torch.equal(out[batch // 2], torch.zeros_like(out[batch // 2]))


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("pair", [("bf16", "bf16"), ("f32", "f32")], ids=lambda p: f"{p[0]}w{p[1]}")
@pytest.mark.parametrize("batch, pool", [(1, None), (7, None), (64, None), (7, 12), (64, 131)])
def test_states_keeping_width_entries(layout, pair, batch, pool, monkeypatch):
    """HF transformers' Mamba caches keep width entries, the one before the window too: a
    plan's fixed kernel runs their decode step batched (upd.cu.j2, CC1D_UPD_FAST_STATE_LEN).
    Two steps in turn against the reference, NaN-poisoned outputs, dim 5120 + 8 (the last
    block's channels part-filled); through a pool, a padded row and a slot named twice."""
    from cc1d import update
    monkeypatch.setattr(update, "_new_out", lambda t: torch.full_like(t, float("nan")))
    x, state, w, b = make(batch, 5128, 1, 4, 4, *pair, layout=layout, pool=pool, seed=batch)
    kw = dict(activation="silu")
    if pool is not None:
        idx = torch.randperm(pool, device=DEV)[:batch].to(torch.int32)
        idx[1] = -1
        idx[batch - 1] = idx[0]
        kw["conv_state_indices"] = idx
    for step in range(2):
        out = check(x, state, w, b, **kw)
        if pool is not None:
            assert torch.equal(out[1], torch.zeros_like(out[1]))
        x = torch.randn(x.shape, generator=_gen(step + 50), device=DEV).to(x.dtype)


# ---- speculative decoding (vLLM's num_accepted_tokens) ------------------------------

@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("width", [2, 4, 6])
def test_num_accepted_tokens(layout, width):
    seqlen = 4  # 1 + 3 draft tokens; vLLM's state_len = width - 2 + seqlen
    state_len = width - 2 + seqlen
    batch = 9
    x, state, w, b = make(batch, 160, seqlen, state_len, width, "bf16", "bf16", layout=layout, pool=12,
                          seed=width)
    idx = torch.randperm(12, device=DEV)[:batch].to(torch.int32)
    # in range 1..seqlen, and out of range (clamped: 0 -> 1, 50 -> seqlen)
    acc = torch.tensor([1, 2, 3, 4, 0, 50, 4, 1, 2], dtype=torch.int32, device=DEV)
    check(x, state, w, b, activation="silu", conv_state_indices=idx, num_accepted_tokens=acc)


def test_all_accepted_equals_the_plain_update():
    # vLLM's window with every token accepted is the peer's last width-1 entries.
    x, state, w, b = make(4, 64, 3, 5, 4, "f32", "f32", layout="cl")
    s_plain = state.clone()
    out_spec = cc1d.causal_conv1d_update(x, state, w, b, num_accepted_tokens=torch.full(
        (4,), 3, dtype=torch.int32, device=DEV))
    x2 = torch.randn_like(x)
    out_a = cc1d.causal_conv1d_update(x2, state, w, b, num_accepted_tokens=torch.full(
        (4,), 3, dtype=torch.int32, device=DEV))
    cc1d.causal_conv1d_update(x, s_plain, w, b)
    out_b = cc1d.causal_conv1d_update(x2, s_plain, w, b)
    assert torch.equal(out_a, out_b) and torch.equal(state, s_plain)
    assert out_spec.shape == x.shape


# ---- multi-token = single tokens one after another --------------------------------

@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("circular", [False, True])
def test_multi_token_equals_single_tokens_in_turn(layout, circular):
    seqlen, state_len = 5, 7
    x, state, w, b = make(6, 200, seqlen, state_len, 4, "bf16", "f32", layout=layout, seed=9)
    seqlens = torch.tensor([0, 3, 6, 7, 11, 100], dtype=torch.int32, device=DEV) if circular else None
    s_single = state.clone()
    out = cc1d.causal_conv1d_update(x, state, w, b, activation="silu", cache_seqlens=seqlens)
    for t in range(seqlen):
        one = cc1d.causal_conv1d_update(x[:, :, t], s_single, w, b, activation="silu",
                                        cache_seqlens=None if seqlens is None else seqlens + t)
        assert torch.equal(one, out[:, :, t]), t
    assert torch.equal(s_single, state)


# ---- torch.compile and CUDA graphs ---------------------------------------------------

def test_torch_compile_keeps_the_mutation():
    x, state, w, b = make(8, 256, 1, 3, 4, "bf16", "bf16", layout="cl")
    s_eager = state.clone()
    idx = torch.randperm(8, device=DEV).to(torch.int32)

    def step(x, s):
        return cc1d.causal_conv1d_update(x, s, w, b, activation="silu", conv_state_indices=idx) * 2

    out = torch.compile(step, fullgraph=True)(x, state)
    want = step(x, s_eager)
    assert torch.equal(out, want) and torch.equal(state, s_eager)


def test_a_compiled_update_launches_the_plans_fixed_kernel():
    """torch.compile's op runs through the eager plans: the graph's first run loads the plan's
    fixed kernel (the one the tuner ranked), later runs load nothing, and out and the state
    equal the generic kernel's bit for bit."""
    from cc1d import update
    x, state, w, b = make(5, 2072, 1, 3, 4, "bf16", "f32", layout="cl", pool=9, seed=77)
    idx = torch.tensor([4, 0, -1, 7, 2], dtype=torch.int32, device=DEV)
    s_generic = state.clone()
    update._UPD_PLANS.clear()
    generic = update._update_impl(x, s_generic, w, b, True, None, idx, None, -1)

    def step(x, s):
        return cc1d.causal_conv1d_update(x, s, w, b, activation="silu", conv_state_indices=idx) * 1

    compiled = torch.compile(step, fullgraph=True)
    torch.cuda.synchronize()
    before = cc1d.dispatch_stats()
    out = compiled(x, state)
    torch.cuda.synchronize()
    assert cc1d.dispatch_stats()["loads"] == before["loads"] + 1, "the graph's op did not go through a plan"
    assert torch.equal(out, generic) and torch.equal(state, s_generic)
    compiled(x, state.clone())
    torch.cuda.synchronize()
    assert cc1d.dispatch_stats()["loads"] == before["loads"] + 1


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_cuda_graph_of_100_updates_replays_like_eager_calls(layout):
    calls, batch, dim, pool = 100, 16, 512, 24
    x, state, w, b = make(batch, dim, 1, 3, 4, "bf16", "f32", layout=layout, pool=pool)
    xs = torch.randn(calls, batch, dim, device=DEV).to(torch.bfloat16)
    idx = torch.randperm(pool, device=DEV)[:batch].to(torch.int32)
    idx[3] = -1  # a padded row
    kw = dict(activation="silu", conv_state_indices=idx)
    cc1d.causal_conv1d_update(xs[0], state.clone(), w, b, **kw)  # loads the kernel
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    outs = []
    with torch.cuda.graph(graph):
        for i in range(calls):
            outs.append(cc1d.causal_conv1d_update(xs[i], state, w, b, **kw))
    # new inputs and a new starting state, then replay
    xs.copy_(torch.randn(calls, batch, dim, device=DEV).to(torch.bfloat16))
    s0 = torch.randn(pool, 3, dim, device=DEV).to(torch.bfloat16).transpose(1, 2) if layout == "cl" else \
        torch.randn(pool, dim, 3, device=DEV).to(torch.bfloat16)
    state.copy_(s0)
    graph.replay()
    torch.cuda.synchronize()
    eager_state = s0.clone()
    for i in range(calls):
        want = cc1d.causal_conv1d_update(xs[i], eager_state, w, b, **kw)
        assert torch.equal(outs[i], want), i
    assert torch.equal(state, eager_state)
    # and the graph's results are the reference's
    ref_state = s0.clone()
    for i in range(calls):
        want64 = causal_conv1d_update_ref(xs[i], ref_state, w.double(), b.double(), out_dtype=torch.float64,
                                          **kw)
        if i % 25 == 0:
            assert rel_l2(outs[i], want64) < TOL[torch.bfloat16], i
    assert torch.equal(state, ref_state)


@pytest.mark.parametrize("layout", ["cl", "cf"])
def test_back_to_back_updates_wait_for_the_kernel_before(layout):
    """On sm_90 the update is launched before the kernel ahead of it ends
    (programmatic dependent launch) and waits for it on the device. A chain where
    every step reads what the kernel just before wrote (its state from the previous
    update, its x from a torch kernel on the previous output), queued without a
    synchronization, must equal the same steps run one at a time."""
    steps, batch, dim, pool = 40, 256, 5120, 300
    x, state, w, b = make(batch, dim, 1, 3, 4, "bf16", "bf16", layout=layout, pool=pool, seed=7)
    idx = torch.randperm(pool, device=DEV)[:batch].to(torch.int32)
    noise = torch.randn(steps, batch, dim, device=DEV).to(torch.bfloat16)
    kw = dict(activation="silu", conv_state_indices=idx)

    def run(sync):
        s, xi, outs = state.clone(), x.clone(), []
        torch.cuda.synchronize()
        for i in range(steps):
            out = cc1d.causal_conv1d_update(xi, s, w, b, **kw)
            if sync:
                torch.cuda.synchronize()
            xi = out * 0.5 + noise[i]  # a torch kernel between two updates
            outs.append(out)
        torch.cuda.synchronize()
        return outs, s

    queued, queued_state = run(sync=False)
    stepped, stepped_state = run(sync=True)
    for i, (a, e) in enumerate(zip(queued, stepped)):
        assert torch.equal(a, e), i
    assert torch.equal(queued_state, stepped_state)


def test_in_a_graph_the_update_launches_early_only_after_cc1d_kernels():
    """Programmatic dependent launch measured slower after another library's kernel (a
    GEMM) and faster after cc1d's own, which let the next grid launch at their start: under
    capture, a launch is early only where the node it follows is a cc1d kernel. The graph
    (GEMM, update, update, a torch kernel, update) replays like the same calls run eagerly."""
    from cc1d import _cc1d
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90")
    batch, dim = 16, 5120
    x, state, w, b = make(batch, dim, 1, 3, 4, "bf16", "bf16", layout="cl", seed=5)
    a = torch.randn(batch, 1024, device=DEV).to(torch.bfloat16)
    proj = (torch.randn(1024, dim, device=DEV) / 32).to(torch.bfloat16)
    kw = dict(activation="silu")
    cc1d.causal_conv1d_update(x, state.clone(), w, b, **kw)  # loads the kernels
    cc1d.causal_conv1d_update(x, state.clone(), w, b, **kw)
    torch.mm(a, proj)  # cuBLAS sets up outside the capture
    torch.cuda.synchronize()
    s0 = state.clone()

    def early():
        return _cc1d.early_launch_helps("cuda", torch.cuda.current_stream().cuda_stream)

    seen, outs = [], []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seen.append(early())  # the graph's first node: nothing to overlap
        xp = torch.mm(a, proj)
        seen.append(early())  # after the GEMM
        outs.append(cc1d.causal_conv1d_update(xp, state, w, b, **kw))
        seen.append(early())  # after cc1d's update
        outs.append(cc1d.causal_conv1d_update(outs[-1], state, w, b, **kw))
        xt = outs[-1] * 0.5
        seen.append(early())  # after a torch kernel
        outs.append(cc1d.causal_conv1d_update(xt, state, w, b, **kw))
    assert seen == [False, False, True, False]
    assert early(), "outside a capture the stream's last kernel is unknown: early, as before"
    state.copy_(s0)
    graph.replay()
    torch.cuda.synchronize()
    eager_state = s0.clone()
    xp = torch.mm(a, proj)
    want = [cc1d.causal_conv1d_update(xp, eager_state, w, b, **kw)]
    want.append(cc1d.causal_conv1d_update(want[-1], eager_state, w, b, **kw))
    want.append(cc1d.causal_conv1d_update(want[-1] * 0.5, eager_state, w, b, **kw))
    torch.cuda.synchronize()
    for i, (got, exp) in enumerate(zip(outs, want)):
        assert torch.equal(got, exp), i
    assert torch.equal(state, eager_state)


def test_warmup_update_loads_the_kernel_calls_use():
    x, state, w, b = make(64, 5120, 1, 3, 4, "bf16", "bf16", layout="cl")
    e = cc1d.warmup_update(64, 5120, dtype=torch.bfloat16, width=4)
    stats = cc1d.dispatch_stats()
    cc1d.causal_conv1d_update(x, state, w, b, activation="silu")
    torch.cuda.synchronize()
    assert cc1d.dispatch_stats() == stats
    assert e["key"].startswith("upd.cl.bf16wbf16.w4.")


def test_warmup_update_with_state_indices_loads_the_pool_kernel():
    """conv_state_indices select the tuned "pool" kernels: warming them up leaves the calls
    with indices nothing to decide or load (so they can be captured in a CUDA graph)."""
    pool = 80
    x, _, w, b = make(16, 5120, 1, 3, 4, "bf16", "bf16", layout="cl")
    state = torch.randn(pool, 3, 5120, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    idx = torch.randperm(pool, device="cuda")[:16].to(torch.int32)
    e = cc1d.warmup_update(16, 5120, dtype=torch.bfloat16, width=4, state_indices=True, pool=pool)
    stats = cc1d.dispatch_stats()
    cc1d.causal_conv1d_update(x, state, w, b, activation="silu", conv_state_indices=idx)
    torch.cuda.synchronize()
    assert cc1d.dispatch_stats() == stats
    assert e["key"] == cc1d.explain_update(x, state, w, b, "silu", conv_state_indices=idx)["key"]
    with pytest.raises(ValueError, match="pool: expected an int >= 1, with state_indices=True"):
        cc1d.warmup_update(16, 5120, pool=pool)
    with pytest.raises(TypeError, match="state_indices: expected a bool"):
        cc1d.warmup_update(16, 5120, state_indices=1)


# ---- the eager path's plans (cc1d.update._UPD_PLANS) -------------------------------------

def test_planned_calls_match_the_reference_with_fresh_buffers_each_time(rt):
    """One signature, many calls: every call after the first runs through its plan with new
    pointers (and the runtime's remembered kernel) and still matches the reference; the
    activation and the optional arguments switch between calls."""
    from cc1d import update
    update._UPD_PLANS.clear()
    pool = 9
    for i in range(6):
        x, state, w, b = make(5, 2056, 1, 3, 4, "bf16", "f32", layout="cl", pool=pool, seed=100 + i)
        kw = dict(activation="silu" if i % 2 else None)
        if i >= 2:
            kw["conv_state_indices"] = torch.tensor([3, -1, 0, 8, 5], dtype=torch.int32, device=DEV)
        check(x, state, w, b, **kw)
    assert len(update._UPD_PLANS) == 2  # with and without indices
    stats = cc1d.dispatch_stats()
    x, state, w, b = make(5, 2056, 1, 3, 4, "bf16", "f32", layout="cl", pool=pool, seed=200)
    check(x, state, w, b, activation="silu")
    assert cc1d.dispatch_stats() == stats, "a planned call decides and loads nothing"
    rt.clear_dispatch_cache()
    x, state, w, b = make(5, 2056, 1, 3, 4, "bf16", "f32", layout="cl", pool=pool, seed=201)
    check(x, state, w, b, activation="silu")  # decided again after the dispatcher forgot


def test_a_planned_signature_still_refuses_overlapping_buffers():
    """The plan skips the Python checks, not the runtime's: a call whose conv_state overlaps x
    fails even where its signature was planned by a valid call."""
    buf = torch.randn(4 * 3 * 256 + 4 * 256, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(256, 4, device=DEV, dtype=torch.bfloat16)
    apart = torch.randn(4 * 256, device=DEV, dtype=torch.bfloat16)
    state = buf[:4 * 3 * 256].view(4, 3, 256).transpose(1, 2)
    cc1d.causal_conv1d_update(apart.view(4, 256), state, w)
    cc1d.causal_conv1d_update(apart.view(4, 256), state, w)
    over = buf[4 * 3 * 256 - 256:4 * 3 * 256 + 3 * 256].view(4, 256)  # x's first row is the state's last entry
    with pytest.raises(ValueError, match="overlap"):
        cc1d.causal_conv1d_update(over, state, w)


def test_explain_update_names_the_state_layout():
    x, state, w, b = make(2, 64, 1, 3, 4, "bf16", "f32", layout="cf")
    assert cc1d.explain_update(x, state, w, b)["key"].startswith("upd.cf.bf16wf32.w4.")


# ---- plans' fixed kernels (the call's sizes and strides compiled in) ------------------

def _fixed_case(i):
    """Case i: layout, dtypes, width, sizes, optional inputs and activation all vary; dim is
    not a multiple of any tile."""
    layout = ("cl", "cf")[i % 2]
    xd, wd = PAIRS[i % len(PAIRS)]
    width = (4, 2, 3, 4)[i % 4]
    mode = ("plain", "indices", "cache_seqlens", "accepted")[i // 2 % 4]
    seqlen = 1 if mode in ("plain", "indices") else 3
    # One token: states of width-1 entries (vLLM's), and of width (HF transformers') in cases
    # 8-11, which the fixed kernel runs through the batched step and the generic one row by row.
    state_len = (width - 1 + i // 8 % 2) if mode in ("plain", "indices") else width + 1
    batch, dim = (1, 16, 5, 64)[i % 4], (5120 + 8, 100, 2072, 640 + 24)[i // 4 % 4]
    return layout, xd, wd, width, mode, seqlen, state_len, batch, dim


def _generic(rt, x, state, w, b, silu, cache_seqlens, indices, accepted):
    """The dispatcher's variant for the call, its generic kernel (launch_upd, not as a plan):
    what the fixed kernels are held to. (The plain entry, update._update_impl, launches it
    too, except for steps on states of width entries, which take the fixed kernel.)"""
    from cc1d import update
    out = update._new_out(x)
    args = update._upd_call_args(x, state, w, b, cache_seqlens, indices, accepted, out, -1, silu)
    stream = torch.cuda.current_stream().cuda_stream
    rt.launch_upd(rt.select_upd(*args, stream, ""), *args, stream, as_plan=False)
    return out


@pytest.mark.parametrize("i", range(16))
def test_a_plans_fixed_kernel_equals_the_generic_kernel_bit_for_bit(i, rt, monkeypatch):
    """Eager calls run through plans, which launch their variant compiled with the call's
    sizes and strides as constants (one more module load); the generic kernel takes them
    at run time. With NaN-poisoned outputs both agree bit for bit, and with the reference."""
    from cc1d import update
    layout, xd, wd, width, mode, seqlen, state_len, batch, dim = _fixed_case(i)
    pool = batch + 3
    x, state, w, b = make(batch, dim, seqlen, state_len, width, xd, wd, layout=layout, pool=pool,
                          bias=i % 3 != 2, seed=300 + i)
    kw = dict(activation="silu" if i % 3 else None)
    if mode == "cache_seqlens":
        kw["cache_seqlens"] = torch.randint(0, 50, (batch,), dtype=torch.int32, device=DEV)
    if mode in ("indices", "accepted"):
        kw["conv_state_indices"] = torch.randperm(pool, device=DEV)[:batch].to(torch.int32)
        if batch > 2:
            kw["conv_state_indices"][1] = -1  # a padded row
            kw["conv_state_indices"][batch - 1] = kw["conv_state_indices"][0]  # a slot named twice
    if mode == "accepted":
        kw["num_accepted_tokens"] = torch.randint(1, seqlen + 1, (batch,), dtype=torch.int32, device=DEV)
    monkeypatch.setattr(update, "_new_out", lambda t: torch.full_like(t, float("nan")))
    update._UPD_PLANS.clear()
    want_out, want_state = reference(x, state, w, b, **kw)
    s_generic = state.clone()
    generic = _generic(rt, x, s_generic, w, b, kw["activation"] is not None, kw.get("cache_seqlens"),
                       kw.get("conv_state_indices"), kw.get("num_accepted_tokens"))
    torch.cuda.synchronize()
    before = cc1d.dispatch_stats()
    fixed = cc1d.causal_conv1d_update(x, state, w, b, **kw)
    torch.cuda.synchronize()
    assert cc1d.dispatch_stats()["loads"] == before["loads"] + 1, "the plan did not load its fixed kernel"
    assert torch.equal(_bits(fixed), _bits(generic)) and torch.equal(_bits(state), _bits(s_generic))
    assert rel_l2(fixed, want_out) < TOL[x.dtype] and torch.equal(state, want_state)
    again = cc1d.causal_conv1d_update(x, s_generic, w, b, **kw)  # the second call: planned, loaded
    assert cc1d.dispatch_stats()["loads"] == before["loads"] + 1
    assert not torch.isnan(again).any()


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_a_one_shot_step_on_width_entry_states_runs_the_fixed_kernel(rt, layout, monkeypatch):
    """The runtime's plain entry (causal_conv1d_update, no plan; update._update_impl) runs a
    one-token step on states of width entries through the fixed kernel a plan would launch:
    the generic kernel has no batched step for them and takes them row by row. Its first
    call loads it, a plan then finds it loaded; the results equal the generic kernel's bit
    for bit and the reference."""
    from cc1d import update
    monkeypatch.setattr(update, "_new_out", lambda t: torch.full_like(t, float("nan")))
    x, state, w, b = make(48, 2056, 1, 4, 4, "bf16", "bf16", layout=layout, seed=91)
    update._UPD_PLANS.clear()
    s_generic, s_one = state.clone(), state.clone()
    want_out, want_state = reference(x, state, w, b, activation="silu")
    generic = _generic(rt, x, s_generic, w, b, True, None, None, None)  # loads the generic kernel
    torch.cuda.synchronize()
    before = cc1d.dispatch_stats()
    one = update._update_impl(x, s_one, w, b, True, None, None, None, -1)
    torch.cuda.synchronize()
    assert cc1d.dispatch_stats()["loads"] == before["loads"] + 1, "the one-shot call did not load the fixed kernel"
    assert torch.equal(_bits(one), _bits(generic)) and torch.equal(_bits(s_one), _bits(s_generic))
    assert rel_l2(one, want_out) < TOL[x.dtype] and torch.equal(s_one, want_state)
    planned = cc1d.causal_conv1d_update(x, state, w, b, activation="silu")
    torch.cuda.synchronize()
    assert cc1d.dispatch_stats()["loads"] == before["loads"] + 1, "the plan loaded another kernel"
    assert torch.equal(_bits(planned), _bits(one)) and torch.equal(_bits(state), _bits(s_one))


@pytest.mark.parametrize("layout", ["cl", "cf"])
def test_a_capture_before_the_fixed_kernel_is_loaded_records_the_generic_one(layout):
    """A plan loads nothing while its stream captures a graph (capture_error_mode "global"
    refuses module loads): the graph records the generic kernel, loaded by an earlier call,
    and replays correctly; the next eager call loads the fixed kernel."""
    from cc1d import update
    update._UPD_PLANS.clear()
    batch, dim = 8, 776
    x, state, w, b = make(batch, dim, 1, 3, 4, "bf16", "bf16", layout=layout, seed=77)
    s_first = state.clone()
    update._update_impl(x, s_first, w, b, True, None, None, None, -1)  # loads the generic kernel
    torch.cuda.synchronize()
    before = cc1d.dispatch_stats()
    graph = torch.cuda.CUDAGraph()
    s0 = state.clone()
    with torch.cuda.graph(graph, capture_error_mode="global"):
        out = cc1d.causal_conv1d_update(x, state, w, b, activation="silu")
    assert cc1d.dispatch_stats() == before, "the capture compiled or loaded a kernel"
    state.copy_(s0)
    graph.replay()
    torch.cuda.synchronize()
    want_out, want_state = reference(x, s0, w, b, activation="silu")
    assert rel_l2(out, want_out) < TOL[x.dtype] and torch.equal(state, want_state)
    cc1d.causal_conv1d_update(x, state, w, b, activation="silu")
    torch.cuda.synchronize()
    assert cc1d.dispatch_stats()["loads"] == before["loads"] + 1  # now the fixed kernel
