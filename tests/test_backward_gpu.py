"""Backward kernels and autograd on the GPU against float64 autograd of the
reference (marker: gpu): every covering variant, the API's defaults over every
feature combination, awkward lengths (just past every tile), padding tokens,
bitwise determinism, gradcheck, and torch.compile training."""
from __future__ import annotations

import hashlib
import itertools
import random

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cc1d  # noqa: E402
from cc1d import backward, ops  # noqa: E402

from conftest import precompile, worth_precompiling  # noqa: E402
from cc1d.generator.covering import all_covering  # noqa: E402
from cc1d.generator.variant import realigned, walk_cut  # noqa: E402
from cc1d.tuner.problems import bwd_splits  # noqa: E402  (the runtime's split rule)
from cc1d.tuner.shapes import Shape  # noqa: E402
from fwd_cases import TORCH_DTYPES, Case, make_inputs, poisoned, rel_l2, rows_from  # noqa: E402
from fwd_cases import _layout as place  # noqa: E402
from variant_sets import covering_and_shipped  # noqa: E402

pytestmark = pytest.mark.gpu

# dx is rounded to x's dtype; dweight/dbias are fp32 sums rounded to the weight's.
TOL = {"f32": 5e-5, "f16": 5e-3, "bf16": 3e-2}
BWD_COVERING = [v for v in all_covering("sm_90") if v.family.op == "bwd"]


@pytest.fixture(scope="module", autouse=True)
def warm_compile_cache(rt, request):
    if not worth_precompiling(request):
        return
    target = rt.device_target("cuda", torch.cuda.current_device())
    precompile(rt, [e["source"] for e in rt.catalog() if e["key"].startswith("bwd.")]
               + [v.source for v in BWD_COVERING], target)


@pytest.fixture(autouse=True)
def poison_gradient_buffers(monkeypatch):
    """Every buffer the backward allocates starts as NaN: an unwritten element fails."""
    real_layout, real_like, real_new = ops._empty_like_layout, ops._empty_like, backward._new_output
    monkeypatch.setattr(ops, "_empty_like_layout",
                        lambda x, shape, dtype=None: real_layout(x, shape, dtype).fill_(float("nan")))
    monkeypatch.setattr(ops, "_empty_like", lambda x: real_like(x).fill_(float("nan")))
    monkeypatch.setattr(backward, "_new_output",
                        lambda shape, dtype, device: real_new(shape, dtype, device).fill_(float("nan")))


def reference_grads(case: Case, inp: dict, dout, dfinal):
    """float64 autograd of the reference: dx, dweight, dbias, dinitial_states."""
    leaf = lambda t: None if t is None else t.detach().double().requires_grad_()  # noqa: E731
    x, w, b, s = leaf(inp["x"]), leaf(inp["weight"]), leaf(inp["bias"]), leaf(inp["initial_states"])
    out, fs = cc1d.causal_conv1d_ref(x, w, b, initial_states=s, return_final_states=True,
                                     activation="silu" if case.silu else None, seq_idx=inp["seq_idx"])
    loss = (out * dout.double()).sum()
    if dfinal is not None:
        loss = loss + (fs * dfinal.double()).sum()
    loss.backward()
    return x.grad, w.grad, None if b is None else b.grad, None if s is None else s.grad


def check_grads(name, case, got, want):
    labels = ("dx", "dweight", "dbias", "dinitial_states")
    for label, g, r in zip(labels, got, want):
        if r is None:
            assert g is None, f"{name} {label}: expected None"
            continue
        assert g is not None and g.shape == r.shape, (name, label, None if g is None else g.shape)
        n_nan = int(torch.isnan(g).sum())
        assert n_nan == 0, f"{name} {label}: {n_nan} NaN elements (unwritten or invalid)"
        err = rel_l2(g, r)
        tol = TOL[case.x_dtype] if label in ("dx", "dinitial_states") else TOL[case.w_dtype]
        assert err <= max(tol, TOL[case.x_dtype]), f"{name} {label}: relative L2 error {err:.3e}"


def grads_through_api(case: Case, inp: dict, dout, dfinal, dx=None):
    return cc1d.causal_conv1d_bwd(inp["x"], inp["weight"], inp["bias"], dout, seq_idx=inp["seq_idx"],
                                  initial_states=inp["initial_states"], dfinal_states=dfinal, dx=dx,
                                  return_dinitial_states=inp["initial_states"] is not None,
                                  activation="silu" if case.silu else None)


def make_grads(case: Case, inp: dict, seed: int):
    """dout in x's layout and alignment padding; dfinal_states when the case returns final states."""
    gen = torch.Generator().manual_seed(seed + 7)
    dout = torch.randn(case.batch, case.dim, case.seqlen, generator=gen).to(TORCH_DTYPES[case.x_dtype])
    dout = place(dout, case.layout, False, case.align, gen, "cuda")
    dfinal = None
    if case.final:
        dfinal = torch.randn(case.batch, case.dim, case.width - 1, generator=gen).to(TORCH_DTYPES[case.x_dtype])
        dfinal = dfinal.cuda()
    return dout, dfinal


# ---- every covering variant, launched exactly -----------------------------------------

def launch_bwd_variant(rt, variant, case, inp, dout, dfinal, runtime_dict=None, as_plan=False, dx=None):
    """Exactly `variant` (its plain build, or with `as_plan` what bwd() launches for it)
    on poisoned gradients (dx: a poisoned one of the caller's, or a fresh one): dx,
    dweight, dbias, dinitial_states."""
    x, w, b = inp["x"], inp["weight"], inp["bias"]
    dx = poisoned(x.shape, x.dtype, case.layout, case.align) if dx is None else dx
    dweight = backward._new_output(w.shape, w.dtype, x.device)
    dbias = None if b is None else backward._new_output(b.shape, b.dtype, x.device)
    s = inp["initial_states"]
    dis = None if s is None else backward._new_output(s.shape, x.dtype, x.device)
    g = variant.geometry()
    shape = Shape("bwd", case.layout, case.x_dtype, case.w_dtype, case.width, case.batch, case.dim, case.seqlen)
    nbytes = bwd_splits(shape, g["tile_l"], g["tile_d"], g["split_blocks"]) * case.dim * (case.width + 1) * 4
    ws = torch.full((nbytes // 4,), float("nan"), dtype=torch.float32, device="cuda")
    ptrs, sizes, strides, xd, wd, silu = backward._bwd_call_args(
        x, w, b, inp["seq_idx"], s, dout, dfinal, dx, dis, dweight, dbias, ws, case.silu)
    rt.launch_bwd(runtime_dict or variant.as_runtime_dict(), ptrs, sizes, strides, xd, wd, silu, nbytes,
                  torch.cuda.current_stream().cuda_stream, as_plan=as_plan)
    torch.cuda.synchronize()
    return dx, dweight, dbias, dis


@pytest.mark.parametrize("variant", BWD_COVERING, ids=lambda v: v.key())
def test_covering_variants_match_reference(rt, variant):
    rng = random.Random(variant.key())
    f = variant.family
    align = variant.geometry()["align_bytes"] // f.x_bytes
    tile_l = variant.geometry()["tile_l"]
    for n in range(3):
        feats = dict(bias=rng.random() < 0.7, silu=rng.random() < 0.7, seq_idx=rng.random() < 0.4,
                     states=rng.random() < 0.4, final=rng.random() < 0.4)
        # (A channel-last call with dim or seqlen 1 reads as channel-first: the API
        # handles that, an exact channel-last variant is refused. Not tested here.)
        tiny = (1,) if f.layout == "cf" else ()
        case = Case(layout=f.layout, x_dtype=f.x_dtype, w_dtype=f.w_dtype, width=f.width,
                    batch=rng.choice((1, 2, 3)), dim=rng.choice((*tiny, 5, 67, 130)),
                    seqlen=rng.choice((*tiny, 2, max(2, tile_l - 1), tile_l + 1, 2 * tile_l + 3, 1001)),
                    align=align, **feats)
        inp = make_inputs(case, seed=n)
        dout, dfinal = make_grads(case, inp, n)
        got = launch_bwd_variant(rt, variant, case, inp, dout, dfinal)
        want = reference_grads(case, inp, dout, dfinal)
        check_grads(f"{variant.key()} {case.id()}", case, got, want)


WALKED = [v for v in covering_and_shipped("bwd", "cf") if v.params["nvec"] > 4]


def cf_segment_positions(variant) -> int:
    """The positions of one warp's segment of a channel-first backward variant."""
    tpr = variant.params["threads"] // variant.params["rows"]
    return min(tpr, 32) * variant.geometry()["tile_l"] // tpr


@pytest.mark.parametrize("variant", WALKED, ids=lambda v: v.key())
def test_walked_segments_match_reference(rt, variant):
    """Channel-first variants that walk their segments (nvec above 4: loads staged through
    a ring in shared memory), covering and shipped, at lengths of whole tiles and an edge past
    them (whole segments walked, the rest on the edge path) and at one that cuts a segment
    halfway (the edge path takes its top vectors, the walk the whole ones below, g handed
    over through the ring); rows past the last channel; with and without SiLU, bias,
    initial states and the final states' gradient."""
    assert WALKED and variant.why_invalid() is None
    f, g = variant.family, variant.geometry()
    # whole tiles and an edge; a segment cut halfway (the edge path above, a walk below)
    lengths = (2 * g["tile_l"] + 37, 2 * g["tile_l"] + 38, g["tile_l"] + cf_segment_positions(variant) // 2 + 3)
    for n, feats in enumerate((dict(silu=True, bias=True, final=True), dict(silu=False, bias=False, states=True),
                               dict(silu=True, bias=True, final=True, states=True))):
        case = Case(layout="cf", x_dtype=f.x_dtype, w_dtype=f.w_dtype, width=f.width, batch=2,
                    dim=2 * g["tile_d"] + 1, seqlen=lengths[n], align=g["align_bytes"] // f.x_bytes, **feats)
        inp = make_inputs(case, seed=n)
        dout, dfinal = make_grads(case, inp, n)
        got = launch_bwd_variant(rt, variant, case, inp, dout, dfinal)
        check_grads(f"{variant.key()} {case.id()}", case, got, reference_grads(case, inp, dout, dfinal))


@pytest.mark.parametrize("variant", WALKED, ids=lambda v: v.key())
def test_walk_cut_builds_match_reference(rt, variant):
    """The walk-cut build (CC1D_BWD_WALK_CUT, what the dispatcher runs where the sequence's
    end cuts a walked segment) at lengths that are a whole number of vectors and cut a
    segment (the walk takes the cut vectors, lanes past the end loading zeros): halfway, one
    vector short of a whole segment (the top vector cut), three vectors into a tile (the
    segment's first vector cut), a tile and a half, and a sequence shorter than a segment;
    contiguous rows. Where the kernel keeps the edge path: the final states' gradient, and
    padded rows on the vector boundary whose length is not a whole number of vectors. And
    whole tiles, which the build walks as the plain one does."""
    f, g = variant.family, variant.geometry()
    build = walk_cut(variant.as_runtime_dict())
    ve = g["align_bytes"] // f.x_bytes
    seg_l = cf_segment_positions(variant)
    cases = ((g["tile_l"] + seg_l // 2, 1, dict(silu=True, bias=True)),
             (seg_l - ve, 1, dict(silu=False, bias=False, states=True)),
             (2 * g["tile_l"] + 3 * ve, 1, dict(silu=True, bias=True, states=True)),
             (g["tile_l"] + g["tile_l"] // 2 + ve, 1, dict(silu=True, bias=False)),
             (max(ve, seg_l // 4 - ve), 1, dict(silu=True, bias=True)),
             (g["tile_l"] + seg_l // 2, 1, dict(silu=True, bias=True, final=True)),
             (g["tile_l"] + seg_l // 2 + 3, ve, dict(silu=True, bias=True)),
             (2 * g["tile_l"], 1, dict(silu=True, bias=True)))
    for n, (seqlen, align, fe) in enumerate(cases):
        assert (seqlen % ve == 0) == (align == 1)
        case = Case(layout="cf", x_dtype=f.x_dtype, w_dtype=f.w_dtype, width=f.width, batch=2,
                    dim=2 * g["tile_d"], seqlen=seqlen, align=align, **fe)
        inp = make_inputs(case, seed=100 + n)
        dout, dfinal = make_grads(case, inp, n)
        got = launch_bwd_variant(rt, variant, case, inp, dout, dfinal, runtime_dict=build)
        check_grads(f"{build['key']} {case.id()}", case, got, reference_grads(case, inp, dout, dfinal))


def contiguous_bf16_through_api(rt, batch, dim, seqlen, seq_idx) -> dict:
    """A contiguous bf16 width-4 backward with bias and SiLU through the API, its gradients
    checked against the reference; returns the dispatcher's explain of the call."""
    case = Case(x_dtype="bf16", w_dtype="bf16", dim=dim, seqlen=seqlen, batch=batch, bias=True, silu=True,
                seq_idx=seq_idx)
    inp = make_inputs(case, seed=seqlen + dim)
    x, w, b = inp["x"].contiguous(), inp["weight"], inp["bias"]
    dout, dfinal = make_grads(case, inp, seqlen)
    dout = dout.contiguous()
    e = rt.explain_bwd(*backward._bwd_call_args(x, w, b, inp.get("seq_idx"), None, dout, None,
                                                 torch.empty_like(x), None, torch.empty_like(w),
                                                 torch.empty_like(b), None, True))
    got = grads_through_api(case, dict(inp, x=x), dout, dfinal)
    check_grads(f"api {case.id()}", case, got, reference_grads(case, inp, dout, dfinal))
    return e


def test_cut_lengths_run_the_walk_cut_build_through_the_api(rt):
    """Aligned rows whose sequence cuts a walked winner's segment: the dispatcher serves the
    walk-cut build and the gradients match; with seq_idx no walk-cut build serves (the
    shapes: shipped walked winners of bf16 width 4, and one near them)."""
    for batch, dim, seqlen, seq_idx in ((1, 5120, 3000, False), (1, 2560, 1000, False), (2, 2560, 1200, False),
                                        (1, 5120, 3000, True)):
        e = contiguous_bf16_through_api(rt, batch, dim, seqlen, seq_idx)
        assert e["key"].endswith(".walkcut") != seq_idx, e


# ---- realigned twins (CC1D_BWD_REALIGN) ------------------------------------------------

BWD_TWINNED = [v for v in covering_and_shipped("bwd", "cf")
               if v.geometry()["align_bytes"] > v.family.x_bytes]  # more than one element a vector


@pytest.fixture(scope="module")
def twins_compiled(rt):
    """Every twin's plain and seq_idx builds, compiled in parallel up front."""
    target = rt.device_target("cuda", torch.cuda.current_device())
    sources = [realigned(v.as_runtime_dict())["source"] for v in BWD_TWINNED]
    precompile(rt, sources, target)
    precompile(rt, sources, target, ["-DCC1D_BWD_SEQ_TILES=1"])


@pytest.mark.parametrize("variant", BWD_TWINNED, ids=lambda v: v.key())
def test_realigned_twins_match_reference(rt, variant, twins_compiled):
    """The realigned twin on rows that start anywhere against its vectors, x's, dout's and
    dx's alike (lengths that are no whole number of vectors, the first row offset into its
    buffer): the positions before each row's first vector boundary computed alone, the
    segments from there (full, walked, cut by the end, shorter than a segment, fewer
    positions than a vector), every feature; dweight/dbias count each position once. The
    plain build and what a plan launches (the seq_idx build)."""
    f, g = variant.family, variant.geometry()
    ve = g["align_bytes"] // f.x_bytes
    seg_l = cf_segment_positions(variant)
    rng = random.Random(variant.key() + " realigned")
    lengths = (2 * g["tile_l"] + 3 * ve + 1, g["tile_l"] + seg_l - 1, seg_l + 1, max(1, seg_l - ve - 1),
               ve - 1, rng.randrange(seg_l, 4 * g["tile_l"]) | 1)
    for n, seqlen in enumerate(lengths):
        feats = dict(bias=rng.random() < 0.7, silu=rng.random() < 0.7, seq_idx=rng.random() < 0.4,
                     states=rng.random() < 0.4, final=rng.random() < 0.4)
        case = Case(layout="cf", x_dtype=f.x_dtype, w_dtype=f.w_dtype, width=f.width, batch=rng.randint(1, 3),
                    dim=rng.choice((g["tile_d"], 2 * g["tile_d"] + 1)), seqlen=seqlen, **feats)
        inp = make_inputs(case, seed=rng.randrange(1 << 30))
        dout, dfinal = make_grads(case, inp, n)
        want = reference_grads(case, inp, dout, dfinal)
        offset = rng.randrange(1, ve)
        x, dout = rows_from(inp["x"].contiguous(), offset), rows_from(dout.contiguous(), offset)
        twin = realigned(variant.as_runtime_dict())
        for as_plan in (False, True):
            dx = rows_from(torch.full_like(x, float("nan")), offset)
            got = launch_bwd_variant(rt, variant, case, dict(inp, x=x), dout, dfinal, runtime_dict=twin,
                                     as_plan=as_plan, dx=dx)
            check_grads(f"{twin['key']} {case.id()} offset {offset} {'plan' if as_plan else 'generic'}",
                        case, got, want)


def test_odd_lengths_run_a_realigned_twin_through_the_api(rt):
    """The dispatcher serves an odd channel-first backward with a twin (x, dout and the dx
    it allocates contiguous: rows alike) and the gradients match."""
    for seqlen, dim in ((2047, 256), (1001, 96), (4097, 5)):
        case = Case(x_dtype="bf16", w_dtype="bf16", dim=dim, seqlen=seqlen, batch=2, bias=True, silu=True)
        inp = make_inputs(case, seed=seqlen)
        x, w, b = inp["x"].contiguous(), inp["weight"], inp["bias"]
        dout, dfinal = make_grads(case, inp, seqlen)
        dout = dout.contiguous()
        e = rt.explain_bwd(*backward._bwd_call_args(x, w, b, None, None, dout, None, torch.empty_like(x), None,
                                                     torch.empty_like(w), torch.empty_like(b), None, True))
        assert e["key"].endswith(".realign") and e["alignment"] == 2, e
        got = grads_through_api(case, dict(inp, x=x), dout, dfinal)
        check_grads(f"api {case.id()}", case, got, reference_grads(case, inp, dout, dfinal))


def test_cut_lengths_run_the_twin_through_the_api(rt):
    """Aligned rows whose sequence cuts a held winner's segment: the dispatcher serves the
    twin (it moves the segment back onto the fast path) and the gradients match, with and
    without seq_idx (which keeps the plain build). The shapes are near shipped held winners
    ((8, 2048, 2048)'s 1024-position segments, (1, 2048, 512)'s 512)."""
    for batch, dim, seqlen, seq_idx in ((8, 2048, 2000, False), (8, 64, 2000, False), (1, 2048, 600, False),
                                        (2, 64, 2000, True)):
        e = contiguous_bf16_through_api(rt, batch, dim, seqlen, seq_idx)
        assert e["key"].endswith(".realign") != seq_idx and e["alignment"] >= 16, e


def _bwd(layout, x_dtype, w_dtype, width, **config):
    """A backward variant of this layout, dtypes and width with this config."""
    from cc1d.generator import Family, Variant
    return Variant.of(Family("bwd", layout, x_dtype, w_dtype, width), **config)


# The channel-last schedule's awkward cases (templates/bwd_channel_last.cu.j2): ranges of
# one step at most, so runs start within HALO of position 0 after shorter ones (step 2,
# width 8), and ranges of about 12 steps that cross batch rows (129 channel groups, 2
# splits), over every feature.
SCHEDULE_CASES = [
    (_bwd("cl", "bf16", "f32", 8, threads=128, vec_bytes=4, tile_d=64, step=2, max_regs=255, split_blocks=2112),
     (3, 67, 37)),
    (_bwd("cl", "bf16", "f32", 4, threads=128, vec_bytes=4, tile_d=32, step=16, max_regs=128, split_blocks=264),
     (3, 4100, 1001)),
    (_bwd("cl", "f32", "f32", 3, threads=64, vec_bytes=8, tile_d=32, step=4, max_regs=128, split_blocks=1320),
     (2, 70, 45)),
]


@pytest.mark.parametrize("variant, sizes", SCHEDULE_CASES, ids=lambda c: c.key() if hasattr(c, "key") else str(c))
def test_channel_last_ranges_start_within_halo_and_cross_batch_rows(rt, variant, sizes):
    assert variant.why_invalid() is None, variant.why_invalid()
    fam = variant.family
    b, d, l = sizes
    for n, (seq_idx, states, final) in enumerate(((False, True, True), (True, True, False), (False, False, False))):
        case = Case(layout="cl", x_dtype=fam.x_dtype, w_dtype=fam.w_dtype, width=fam.width, batch=b, dim=d,
                    seqlen=l, seq_idx=seq_idx, states=states, final=final,
                    align=variant.geometry()["align_bytes"] // fam.x_bytes)
        inp = make_inputs(case, seed=n)
        dout, dfinal = make_grads(case, inp, n)
        got = launch_bwd_variant(rt, variant, case, inp, dout, dfinal)
        check_grads(f"{variant.key()} {case.id()}", case, got, reference_grads(case, inp, dout, dfinal))


# One split: cc1d_kernel writes dweight/dbias itself and no cc1d_reduce runs (its
# workspace stays NaN); more splits: the reduce sums them. Both, per layout, with
# poisoned gradients and dims past a whole number of channel groups; and a module
# without the marker that says so (an older tuning DB's source) still gets its reduce.


SPLIT_CASES = [
    (_bwd("cf", "bf16", "bf16", 4, threads=64, vec_bytes=16, nvec=4, rows=1, max_regs=128, split_blocks=2048),
     (2, 2101, 1500), 1),
    (_bwd("cf", "bf16", "bf16", 4, threads=64, vec_bytes=16, nvec=4, rows=1, max_regs=128, split_blocks=2048),
     (3, 67, 1500), 3),
    (_bwd("cl", "bf16", "f32", 4, threads=128, vec_bytes=4, tile_d=32, step=16, max_regs=128, split_blocks=264),
     (2, 4470, 301), 1),
    (_bwd("cl", "bf16", "f32", 4, threads=128, vec_bytes=4, tile_d=32, step=16, max_regs=128, split_blocks=264),
     (2, 130, 301), 6),
]


def without_one_split_marker(variant) -> dict:
    """The variant's runtime fields with its source as a module that does not export
    cc1d_writes_one_split_sums: one that writes partials whatever the splits."""
    marked = ('extern "C" __device__ int cc1d_writes_one_split_sums = 1;\n'
              'constexpr bool kWritesOneSplitSums = true;')
    assert marked in variant.source
    source = variant.source.replace(marked, "constexpr bool kWritesOneSplitSums = false;")
    return dict(variant.as_runtime_dict(), source=source, hash=hashlib.sha256(source.encode()).hexdigest())


@pytest.mark.parametrize("marker", [True, False], ids=["marked", "unmarked"])
@pytest.mark.parametrize("variant, sizes, splits", SPLIT_CASES,
                         ids=lambda c: c.key() if hasattr(c, "key") else str(c))
def test_one_split_writes_weight_grads_without_the_reduce(rt, variant, sizes, splits, marker):
    assert variant.why_invalid() is None, variant.why_invalid()
    fam, g = variant.family, variant.geometry()
    b, d, l = sizes
    shape = Shape("bwd", fam.layout, fam.x_dtype, fam.w_dtype, fam.width, b, d, l)
    assert bwd_splits(shape, g["tile_l"], g["tile_d"], g["split_blocks"]) == splits
    case = Case(layout=fam.layout, x_dtype=fam.x_dtype, w_dtype=fam.w_dtype, width=fam.width, batch=b, dim=d,
                seqlen=l, silu=True, states=True, align=g["align_bytes"] // fam.x_bytes)
    inp = make_inputs(case, seed=splits)
    dout, dfinal = make_grads(case, inp, splits)
    got = launch_bwd_variant(rt, variant, case, inp, dout, dfinal,
                             None if marker else without_one_split_marker(variant))
    check_grads(f"{variant.key()} {case.id()}", case, got, reference_grads(case, inp, dout, dfinal))


# ---- the API over every feature, both layouts, awkward lengths ---------------------------

FEATURES = [dict(bias=b, silu=s, seq_idx=q, states=i, final=f)
            for b, s, q, i, f in itertools.product((False, True), repeat=5)]


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("feats", FEATURES, ids=lambda d: "".join(k[0] for k, v in d.items() if v) or "plain")
def test_api_every_feature(layout, feats):
    for n, (xd, wd, width) in enumerate([("bf16", "bf16", 4), ("f32", "f32", 3), ("f16", "f32", 2)]):
        case = Case(layout=layout, x_dtype=xd, w_dtype=wd, width=width, batch=2, dim=37, seqlen=1025, **feats)
        inp = make_inputs(case, seed=100 + n)
        dout, dfinal = make_grads(case, inp, n)
        check_grads(case.id(), case, grads_through_api(case, inp, dout, dfinal),
                    reference_grads(case, inp, dout, dfinal))


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("width", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("seqlen", [1, 3, 2047, 2049, 2050, 4097])
def test_api_lengths_past_chunks_with_silu(layout, width, seqlen):
    # The peer is wrong at 2049, 2050 and 4097 with dim 64 and SiLU (ANCHORS.md).
    case = Case(layout=layout, x_dtype="f32", w_dtype="f32", width=width, batch=2, dim=64, seqlen=seqlen,
                states=True, final=True)
    inp = make_inputs(case, seed=seqlen)
    dout, dfinal = make_grads(case, inp, seqlen)
    check_grads(case.id(), case, grads_through_api(case, inp, dout, dfinal),
                reference_grads(case, inp, dout, dfinal))


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_padding_tokens_get_no_gradient(layout):
    case = Case(layout=layout, x_dtype="f32", w_dtype="f32", width=4, batch=2, dim=16, seqlen=40, seq_idx=True)
    inp = make_inputs(case, seed=3)
    seq = torch.full((2, 40), -1, dtype=torch.int32, device="cuda")
    seq[:, 5:20], seq[:, 20:33] = 0, 1  # short sequences between padding
    inp["seq_idx"] = seq
    dout, _ = make_grads(case, inp, 3)
    got = grads_through_api(case, inp, dout, None)
    check_grads(case.id(), case, got, reference_grads(case, inp, dout, None))
    assert torch.all(got[0][:, :, :5] == 0) and torch.all(got[0][:, :, 33:] == 0)


def test_caller_dx_buffer_is_written_and_returned():
    case = Case(layout="cf", x_dtype="bf16", w_dtype="bf16", batch=2, dim=33, seqlen=301)
    inp = make_inputs(case, seed=5)
    dout, _ = make_grads(case, inp, 5)
    dx = torch.full_like(inp["x"], float("nan"))
    got = grads_through_api(case, inp, dout, None, dx=dx)
    assert got[0] is dx
    check_grads(case.id(), case, got, reference_grads(case, inp, dout, None))


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_bitwise_deterministic(layout):
    case = Case(layout=layout, x_dtype="bf16", w_dtype="f32", batch=4, dim=256, seqlen=3000, seq_idx=True,
                states=True, final=True)
    inp = make_inputs(case, seed=11)
    dout, dfinal = make_grads(case, inp, 11)
    first = grads_through_api(case, inp, dout, dfinal)
    for _ in range(3):
        again = grads_through_api(case, inp, dout, dfinal)
        for a, b in zip(first, again):
            bits = torch.int16 if a.element_size() == 2 else torch.int32
            assert torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


@pytest.mark.parametrize("layout", ["cf", "cl"])
@pytest.mark.parametrize("shape", [(1, 512, 700), (2, 4096, 2048)])
def test_back_to_back_backwards_wait_for_the_kernel_before(layout, shape):
    """On sm_90 the backward's kernel and its dweight/dbias reduction are launched before
    the kernel ahead of them ends (programmatic dependent launch) and wait for it on the
    device. A chain where each backward's dout is what the kernel just before wrote (the
    previous backward's dx, or a torch kernel's on it), queued without a synchronization,
    must equal the same steps run one at a time, dweight and dbias included."""
    batch, dim, seqlen = shape
    steps = 20
    case = Case(layout=layout, x_dtype="bf16", w_dtype="bf16", batch=batch, dim=dim, seqlen=seqlen)
    inp = make_inputs(case, seed=12)
    dout0, _ = make_grads(case, inp, 12)
    # Taps summing to at most 1 in magnitude, and every other step halved: dx stays finite.
    w = (inp["weight"].float() / inp["weight"].float().abs().sum(-1, keepdim=True)).to(inp["weight"].dtype)

    def run(sync):
        dout, outs = dout0.clone(), []
        torch.cuda.synchronize()
        for i in range(steps):
            dx, dw, db, _ = cc1d.causal_conv1d_bwd(inp["x"], w, inp["bias"], dout, activation="silu")
            if sync:
                torch.cuda.synchronize()
            dout = dx if i % 2 == 0 else dx * 0.5  # backward after backward, or after a torch kernel
            outs.append((dx, dw, db))
        torch.cuda.synchronize()
        return outs

    queued, stepped = run(sync=False), run(sync=True)
    assert all(torch.isfinite(t).all() for t in stepped[-1])
    for i, (a, e) in enumerate(zip(queued, stepped)):
        for name, got, want in zip(("dx", "dweight", "dbias"), a, e):
            assert torch.equal(got, want), (i, name)


# ---- autograd ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_autograd_matches_reference_and_returns_none_like_the_peer(layout):
    case = Case(layout=layout, x_dtype="f32", w_dtype="f32", batch=2, dim=24, seqlen=333, bias=False,
                states=True, final=True)
    inp = make_inputs(case, seed=9)
    x = inp["x"].detach().requires_grad_()
    w = inp["weight"].detach().requires_grad_()
    s = inp["initial_states"].detach().requires_grad_()
    out, fs = cc1d.causal_conv1d_fn(x, w, None, initial_states=s, return_final_states=True, activation="silu")
    dout, dfinal = make_grads(case, inp, 9)
    ((out * dout).sum() + (fs * dfinal).sum()).backward()
    want = reference_grads(case, inp, dout, dfinal)
    check_grads(case.id(), case, (x.grad, w.grad, None, s.grad), want)


def test_gradcheck_small():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 9, device="cuda", dtype=torch.float32, requires_grad=True)
    w = torch.randn(3, 3, device="cuda", dtype=torch.float32, requires_grad=True)
    b = torch.randn(3, device="cuda", dtype=torch.float32, requires_grad=True)
    s = torch.randn(1, 3, 2, device="cuda", dtype=torch.float32, requires_grad=True)
    fn = lambda x, w, b, s: cc1d.causal_conv1d_fn(x, w, b, initial_states=s, activation="silu")  # noqa: E731
    # fp32 kernels: finite differences in fp32 need a wide step and tolerance
    assert torch.autograd.gradcheck(fn, (x, w, b, s), eps=1e-2, atol=2e-2, rtol=2e-2)


def test_torch_compile_training_matches_eager():
    case = Case(layout="cf", x_dtype="f32", w_dtype="f32", batch=2, dim=16, seqlen=200)
    inp = make_inputs(case, seed=2)

    def step(x, w, b):
        return (cc1d.causal_conv1d_fn(x, w, b, activation="silu") ** 2).sum()

    grads = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        x = inp["x"].detach().clone().requires_grad_()
        w = inp["weight"].detach().clone().requires_grad_()
        b = inp["bias"].detach().clone().requires_grad_()
        fn(x, w, b).backward()
        grads.append((x.grad, w.grad, b.grad))
    for a, b in zip(*grads):
        assert rel_l2(a, b) < 1e-6
