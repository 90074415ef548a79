"""Varlen prefill on the GPU (marker: gpu): outputs against the float64 reference
of each sequence run alone (causal_conv1d_ref with its initial state); pool
states bitwise equal to the reference's copies; padded sequences zero; untouched
pool rows unchanged; every covering variant; CUDA-graph replay with new inputs
equal to eager calls; varlen_states against its reference."""
from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cc1d  # noqa: E402
from cc1d import varlen  # noqa: E402
from cc1d.generator import Family, fallback_chain  # noqa: E402
from cc1d.reference import causal_conv1d_varlen_ref, causal_conv1d_varlen_states_ref  # noqa: E402

from conftest import precompile, worth_precompiling  # noqa: E402
from cc1d.generator.covering import covering_variants  # noqa: E402
from fwd_cases import assert_close  # noqa: E402

pytestmark = pytest.mark.gpu
TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
DTYPE_CODES = {"f32": 0, "f16": 1, "bf16": 2}
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
PAD = -1
# Empty sequences, lengths below width-1 and below state_len, odd lengths, and one
# longer than any tile (channel-first bf16 default: 2048 tokens).
LENS = [5, 0, 1, 2, 3, 131, 7, 4100, 0, 64, 1, 999, 6, 2049]


@pytest.fixture(scope="module")
def target(rt):
    return rt.device_target("cuda", torch.cuda.current_device())


@pytest.fixture(scope="module", autouse=True)
def warm_compile_cache(rt, target, request):
    if not worth_precompiling(request):
        return
    sources = [e["source"] for e in rt.catalog() if e["family"].startswith("vfwd.")]
    sources += [v.source for lay in ("cf", "cl") for v in covering_variants("vfwd", lay, target)]
    precompile(rt, sources, target)


@pytest.fixture(autouse=True)
def poison_api_outputs(monkeypatch):
    """The API allocates through varlen._empty_like_layout / _new_states: fill with NaN."""
    real_out, real_states = varlen._empty_like_layout, varlen._new_states
    monkeypatch.setattr(varlen, "_empty_like_layout", lambda x: real_out(x).fill_(float("nan")))
    monkeypatch.setattr(varlen, "_new_states", lambda b, s, x: real_states(b, s, x).fill_(float("nan")))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(BITS[t.dtype])


def make_case(seed, *, dim=96, lens=LENS, width=4, x_dtype="bf16", w_dtype="f32", layout="cf", state_len=None,
              pool=None, pad_every=5, bias=True, silu=True, dim_contiguous_pool=True, align=1):
    """Inputs with a pool in shuffled order, some padded sequences, random initial-state flags.
    align: x's outer stride padded to this many elements (vector-aligned variants)."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    xd, wd = TORCH_DTYPES[x_dtype], TORCH_DTYPES[w_dtype]
    total = sum(lens)
    state_len = state_len or width - 1 + rng.randint(0, 3)
    num = len(lens)
    pool = pool or num + 3
    if layout == "cf":
        tp = -(-total // align) * align
        x = torch.randn(dim, tp, generator=gen).to(xd).cuda()[:, :total]
    else:
        dp = -(-dim // align) * align
        x = torch.randn(total, dp, generator=gen).to(xd).cuda()[:, :dim].t()
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), dtype=torch.int32).cuda()
    if dim_contiguous_pool:  # vLLM's allocation: (pool, state_len, dim) memory
        cs = torch.randn(pool, state_len, dim, generator=gen).to(xd).cuda().transpose(1, 2)
    else:
        cs = torch.randn(pool, dim, state_len, generator=gen).to(xd).cuda()
    rows = list(range(pool))
    rng.shuffle(rows)
    ci = [PAD if pad_every and i % pad_every == pad_every - 1 else rows[i] for i in range(num)]
    his = torch.tensor([rng.random() < 0.6 for _ in range(num)], dtype=torch.bool).cuda()
    return dict(x=x, weight=(torch.randn(dim, width, generator=gen) / width ** 0.5).to(wd).cuda(),
                bias=torch.randn(dim, generator=gen).to(wd).cuda() if bias else None, cu_seqlens=cu,
                conv_states=cs, cache_indices=torch.tensor(ci, dtype=torch.int32).cuda(), has_initial_state=his,
                activation="silu" if silu else None, pad_slot_id=PAD)


def expected(case):
    """float64 output, and the pool the call must leave (native dtype: exact copies)."""
    d = lambda t: None if t is None else t.double()  # noqa: E731
    args = dict(cache_indices=case["cache_indices"], has_initial_state=case["has_initial_state"],
                activation=case["activation"], pad_slot_id=case["pad_slot_id"])
    out, _ = causal_conv1d_varlen_ref(d(case["x"]), d(case["weight"]), d(case["bias"]), case["cu_seqlens"],
                                      d(case["conv_states"]), **args)
    _, states = causal_conv1d_varlen_ref(case["x"], case["weight"], case["bias"], case["cu_seqlens"],
                                         case["conv_states"], **args)
    return out, states


def check(name, case, out, pool_after, want_out, want_pool, x_dtype):
    assert out.shape == case["x"].shape, (name, out.shape)
    assert varlen._is_channel_last(out) == varlen._is_channel_last(case["x"]), f"{name}: out's layout is not x's"
    assert_close(f"{name} out", out, want_out, x_dtype)
    # Padded sequences output exact zeros.
    cu = case["cu_seqlens"].tolist()
    for i, row in enumerate(case["cache_indices"].tolist()):
        if row == PAD and cu[i + 1] > cu[i]:
            assert torch.count_nonzero(out[:, cu[i]:cu[i + 1]]) == 0, f"{name}: padded sequence {i} not zero"
    assert torch.equal(bits(pool_after), bits(want_pool)), \
        f"{name}: conv_states differ from the reference in {int((bits(pool_after) != bits(want_pool)).sum())} elements"


def call_api(case, **kw):
    return cc1d.causal_conv1d_varlen_fn(case["x"], case["weight"], case["bias"], case["cu_seqlens"],
                                        conv_states=case["conv_states"], cache_indices=case["cache_indices"],
                                        has_initial_state=case["has_initial_state"], activation=case["activation"],
                                        pad_slot_id=case["pad_slot_id"], **kw)


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("x_dtype, w_dtype", [("bf16", "f32"), ("f16", "f16"), ("f32", "f32"), ("bf16", "bf16")])
@pytest.mark.parametrize("width", [2, 4, 8])
def test_api_matches_each_sequence_alone(layout, x_dtype, w_dtype, width):
    case = make_case(width * 10 + len(layout), width=width, x_dtype=x_dtype, w_dtype=w_dtype, layout=layout)
    want_out, want_pool = expected(case)
    out = call_api(case)
    torch.cuda.synchronize()
    check(f"{layout} {x_dtype}/{w_dtype} w{width}", case, out, case["conv_states"], want_out, want_pool, x_dtype)


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("opts", [dict(bias=False, silu=False), dict(pad_every=0, dim_contiguous_pool=False),
                                  dict(state_len=9, lens=[1, 2, 0, 3, 20, 8]), dict(dim=5), dict(dim=1),
                                  dict(lens=[1]), dict(lens=[0, 0, 7, 0])])
def test_api_features_and_edge_shapes(layout, opts):
    case = make_case(7, layout=layout, **opts)
    want_out, want_pool = expected(case)
    out = call_api(case, max_seqlen=max(opts.get("lens", LENS)) or None)
    torch.cuda.synchronize()
    check(f"{layout} {opts}", case, out, case["conv_states"], want_out, want_pool, "bf16")


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_without_state_pool_and_int32_flags(layout):
    case = make_case(3, layout=layout)
    d = lambda t: None if t is None else t.double()  # noqa: E731
    want, _ = causal_conv1d_varlen_ref(d(case["x"]), d(case["weight"]), d(case["bias"]), case["cu_seqlens"],
                                       activation="silu")
    out = cc1d.causal_conv1d_varlen_fn(case["x"], case["weight"], case["bias"], case["cu_seqlens"],
                                       activation="silu")
    assert_close("no pool", out, want, "bf16")
    # int32 has_initial_state, no cache_indices (row i), max_seqlen given exactly.
    case["has_initial_state"] = case["has_initial_state"].to(torch.int32)
    case["cache_indices"] = None
    want_out, want_pool = expected(case)
    out = cc1d.causal_conv1d_varlen_fn(case["x"], case["weight"], case["bias"], case["cu_seqlens"],
                                       conv_states=case["conv_states"], has_initial_state=case["has_initial_state"],
                                       activation="silu", max_seqlen=max(LENS), validate_data=True)
    torch.cuda.synchronize()
    assert_close("row i out", out, want_out, "bf16")
    assert torch.equal(bits(case["conv_states"]), bits(want_pool))


# More sequences than any block has threads (mend "tile" then searches cu_seqlens), of
# 0 to 40 tokens: many starts in every tile, some just before a tile's first position.
MANY_LENS = [random.Random(7).randint(0, 40) for _ in range(300)]


def _variant_cases(variant):
    fam = variant.family
    align = variant.geometry()["align_bytes"] // fam.x_bytes
    shapes = [(1, 96, LENS), (2, 131, [3, 0, 517, 2, 1031])]
    if variant.params.get("mend") == "tile":
        shapes.append((3, 40, MANY_LENS))
    return [make_case(s, width=fam.width, x_dtype=fam.x_dtype, w_dtype=fam.w_dtype, layout=fam.layout,
                      align=align, dim=dim, lens=lens, silu=s % 2 == 0, bias=s % 3 != 0)
            for s, dim, lens in shapes]


def _launch(rt, variant, case, max_seqlen=0):
    x = case["x"]
    out = (torch.full((x.shape[1], x.shape[0]), float("nan"), dtype=x.dtype, device="cuda").t()
           if varlen._is_channel_last(x) else torch.full_like(x, float("nan")))
    align = variant.geometry()["align_bytes"] // variant.family.x_bytes
    if align > 1:  # the variant needs the output's outer stride aligned like x's
        if varlen._is_channel_last(x):
            out = torch.full((x.shape[1], x.stride(1)), float("nan"), dtype=x.dtype, device="cuda")[:, :x.shape[0]].t()
        else:
            out = torch.full((x.shape[0], x.stride(0)), float("nan"), dtype=x.dtype, device="cuda")[:, :x.shape[1]]
    args = varlen._call_args(x, case["weight"], case["bias"], case["cu_seqlens"], case["conv_states"],
                             case["cache_indices"], case["has_initial_state"], out, case["activation"] is not None,
                             PAD, max_seqlen, case["weight"].shape[1], torch.cuda.current_stream().cuda_stream)
    rt.launch_varlen(variant.as_runtime_dict(), *args)
    torch.cuda.synchronize()
    return out


def _covering(target):
    return [v for lay in ("cf", "cl") for v in covering_variants("vfwd", lay, target)]


def test_every_covering_variant(rt, target):
    failures = []
    for variant in _covering(target):
        for case in _variant_cases(variant):
            want_out, want_pool = expected(case)
            try:
                out = _launch(rt, variant, case, max_seqlen=max(case["cu_seqlens"].diff().tolist()))
                check(variant.key(), case, out, case["conv_states"], want_out, want_pool, variant.family.x_dtype)
            except AssertionError as exc:
                failures.append(str(exc)[:300])
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_every_fallback_variant(rt, layout):
    for fam in (Family("vfwd", layout, "bf16", "f32", 4), Family("vfwd", layout, "f32", "f32", 3)):
        for variant in fallback_chain(fam):
            for case in _variant_cases(variant):
                want_out, want_pool = expected(case)
                out = _launch(rt, variant, case)  # max_seqlen unknown: total_tokens bounds the grid
                check(variant.key(), case, out, case["conv_states"], want_out, want_pool, fam.x_dtype)


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_cuda_graph_replay_with_new_inputs_equals_eager(layout):
    lens_a, lens_b = [300, 0, 5, 1200, 2], [1, 700, 3, 0, 803]
    assert sum(lens_a) == sum(lens_b)
    static = make_case(11, layout=layout, lens=lens_a, state_len=5)
    bound = sum(lens_a)
    call = lambda: call_api(static, max_seqlen=bound)  # noqa: E731
    saved = static["conv_states"].clone()
    call()  # warm-up: decide, compile, load
    torch.cuda.synchronize()
    before = cc1d.dispatch_stats()
    static["conv_states"].copy_(saved)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_static = call()
    assert cc1d.dispatch_stats() == before, "the captured call decided or loaded again"
    for seed, lens in ((21, lens_b), (22, lens_a)):
        new = make_case(seed, layout=layout, lens=lens, state_len=5)
        for k in ("x", "weight", "bias", "cu_seqlens", "conv_states", "cache_indices", "has_initial_state"):
            static[k].copy_(new[k])  # every input the graph reads: new weights too
        want_out, want_pool = expected(new)
        graph.replay()
        torch.cuda.synchronize()
        check(f"graph {layout} {lens}", new, out_static, static["conv_states"], want_out, want_pool, "bf16")
        eager_pool = new["conv_states"]
        eager = call_api(new, max_seqlen=bound)
        torch.cuda.synchronize()
        assert torch.equal(bits(eager), bits(out_static)) and torch.equal(bits(eager_pool), bits(static["conv_states"]))


def test_torch_compile_keeps_the_op_and_mutates_the_pool():
    case = make_case(5, layout="cl")
    want_out, want_pool = expected(case)

    def f(x, w, b, cu, cs, ci, his):
        return cc1d.causal_conv1d_varlen_fn(x, w, b, cu, conv_states=cs, cache_indices=ci, has_initial_state=his,
                                            activation="silu", max_seqlen=4100) * 2

    compiled = torch.compile(f, fullgraph=True)
    out = compiled(case["x"], case["weight"], case["bias"], case["cu_seqlens"], case["conv_states"],
                   case["cache_indices"], case["has_initial_state"])
    torch.cuda.synchronize()
    assert_close("compiled", out / 2, want_out, "bf16")
    assert torch.equal(bits(case["conv_states"]), bits(want_pool))


@pytest.mark.parametrize("x_dtype", ["bf16", "f32", "f16"])
@pytest.mark.parametrize("state_len", [1, 3, 8])
@pytest.mark.parametrize("transposed", [False, True])
def test_varlen_states(x_dtype, state_len, transposed):
    gen = torch.Generator().manual_seed(state_len)
    lens = [5, 0, 1, 2, 3, 131, 7, 4100, 0, 64]
    total, dim = sum(lens), 77
    xd = TORCH_DTYPES[x_dtype]
    x = (torch.randn(dim, total, generator=gen).to(xd).cuda().t() if transposed
         else torch.randn(total, dim, generator=gen).to(xd).cuda())
    cu = torch.tensor([0] + list(__import__("itertools").accumulate(lens)), dtype=torch.int32).cuda()
    got = cc1d.causal_conv1d_varlen_states(x, cu, state_len)
    torch.cuda.synchronize()
    want = causal_conv1d_varlen_states_ref(x, cu, state_len)
    assert got.shape == (len(lens), dim, state_len)
    assert torch.equal(bits(got), bits(want))


def test_api_validation_messages():
    case = make_case(1)
    x, w, cu = case["x"], case["weight"], case["cu_seqlens"]
    with pytest.raises(TypeError, match="cu_seqlens: expected dtype int32, got int64"):
        cc1d.causal_conv1d_varlen_fn(x, w, None, cu.long())
    with pytest.raises(TypeError, match="cache_indices: expected dtype int32"):
        cc1d.causal_conv1d_varlen_fn(x, w, None, cu, conv_states=case["conv_states"],
                                     cache_indices=case["cache_indices"].long())
    with pytest.raises(ValueError, match="cache_indices: expected None when conv_states is None"):
        cc1d.causal_conv1d_varlen_fn(x, w, None, cu, cache_indices=case["cache_indices"])
    with pytest.raises(ValueError, match=r"conv_states: expected shape \(pool >= 1, dim=96, state_len >= width-1=3\)"):
        cc1d.causal_conv1d_varlen_fn(x, w, None, cu, conv_states=case["conv_states"][:, :, :2])
    with pytest.raises(ValueError, match=r"cache_indices: expected shape \(num_seqs\)"):
        cc1d.causal_conv1d_varlen_fn(x, w, None, cu, conv_states=case["conv_states"],
                                     cache_indices=case["cache_indices"][:3])
    with pytest.raises(ValueError, match="cu_seqlens: expected first value 0, got 1"):
        bad = cu.clone()
        bad[0] = 1
        cc1d.causal_conv1d_varlen_fn(x, w, None, bad, validate_data=True)
    with pytest.raises(ValueError, match="cu_seqlens: expected last value total_tokens"):
        bad = cu.clone()
        bad[-1] -= 1
        cc1d.causal_conv1d_varlen_fn(x, w, None, bad, validate_data=True)
    with pytest.raises(ValueError, match=r"max_seqlen: expected >= the longest sequence \(4100\)"):
        cc1d.causal_conv1d_varlen_fn(x, w, None, cu, max_seqlen=100, validate_data=True)
    with pytest.raises(ValueError, match="state_len: expected an int >= 0"):
        cc1d.causal_conv1d_varlen_states(x.t(), cu, -1)
