"""Walk-cut builds (bwd_channel_first.cu.j2 CC1D_BWD_WALK_CUT, runtime dispatch.h
walk_cut_build): an aligned channel-first backward whose sequence's end cuts a walked
segment runs the variant's walk-cut build, whose walk takes that segment whole, where the
plain build sends its top vector to the edge path. The build is the variant's source led by
a define, so the plain, seq_idx and realigned builds compile as they did before it. The
dispatcher's choice and its mirrors in the generator and the tuner (no GPU), and the builds
compiling for sm_90 (NVRTC) and gfx942 (hipRTC, marker amd). Their results on the GPU:
test_backward_gpu.py test_walk_cut_builds_match_reference."""
from __future__ import annotations

import hashlib

import pytest

from cc1d.generator import Variant, default_variant, families
from cc1d.generator.covering import all_covering
from cc1d.generator.variant import WALK_CUT_DEFINE, realigned, served, walk_cut, walk_cut_source

from compile_checks import PTXAS_VERBOSE, nvidia_resources
from test_compile_amd import compile_for_amd
from test_realign import BWD_BF16, HELD_128, HELD_96, WALKED, drt  # noqa: F401

# t128.r4: 32 threads a row; bf16 with 16-byte vectors, 8 vectors a thread: 2048-position segments
WALKED_R4 = Variant.of(BWD_BF16, threads=128, vec_bytes=16, nvec=8, rows=4, max_regs=255, split_blocks=512)
SEQLENS = (8, 504, 512, 1000, 1024, 1032, 2040, 2048, 3000, 3072, 4000, 4096, 5000, 8192, 16000)


def test_a_walk_cut_build_is_its_source_led_by_the_define():
    plain = WALKED.as_runtime_dict()
    build = walk_cut(plain)
    assert WALK_CUT_DEFINE == "#define CC1D_BWD_WALK_CUT 1\n"
    assert build["source"] == WALK_CUT_DEFINE + plain["source"] and build["key"] == plain["key"] + ".walkcut"
    assert build["hash"] == hashlib.sha256(build["source"].encode()).hexdigest()
    assert {k: build[k] for k in plain if k not in ("key", "source", "hash")} == \
        {k: plain[k] for k in plain if k not in ("key", "source", "hash")}
    assert served(plain, "walkcut") == build and served(plain, "realign") == realigned(plain)
    assert served(plain, "plain") == plain


def test_only_walked_channel_first_backward_sources_have_the_build():
    for v in (HELD_128, HELD_96, default_variant(next(f for f in families("bwd") if f.layout == "cl"), "sm_90"),
              default_variant(next(f for f in families("fwd") if f.layout == "cf"), "sm_90")):
        assert "CC1D_BWD_WALK_CUT" not in v.source, v.key()
        assert walk_cut_source(v.key(), v.source) is None, v.key()
        with pytest.raises(ValueError, match="has no walk-cut build: only walked channel-first backward"):
            walk_cut(v.as_runtime_dict())
    for v in (WALKED, WALKED_R4):
        assert "#ifndef CC1D_BWD_WALK_CUT\n" in v.source and "#define CC1D_BWD_WALKED 1\n" in v.source
    # a source rendered before the build (no macro): none, as the runtime decides
    older = WALKED.source.replace("CC1D_BWD_WALK_CUT", "CC1D_BWD_OTHER")
    assert walk_cut_source(WALKED.key(), older) is None


def test_an_aligned_backward_whose_sequence_cuts_a_walked_segment_runs_the_build(drt, tmp_path):
    """WALKED's 4096-position segments: 4000, 3000, 1000 and 8 cut one (a sequence shorter
    than a segment too), so the call runs the walk-cut build; whole segments, seq_idx,
    dfinal_states and AMD targets keep the plain build; rows off the vectors (an odd
    length) the realigned twin."""
    from test_bwd_runtime import ARCH as BWD_ARCH, DFS, SEQ, args, tuned_bwd_db, with_ptr
    drt.set_tuning_dbs([tuned_bwd_db(tmp_path / "t.db", [(WALKED, (2, 64, 4096))])])
    for seqlen in (4000, 3000, 1000, 8, 16000):
        e = drt.explain_bwd(*args(sizes=(2, 64, seqlen, 4)), arch=BWD_ARCH)
        assert e["variant"] == walk_cut(WALKED.as_runtime_dict()), (seqlen, e["key"])
        assert ("walk-cut build: its walk takes the segment this call's sequence cuts (4096 positions) whole, "
                "where its plain build sends the top vector to the edge path") in e["detail"], e["detail"]
    for seqlen in (4096, 8192):
        e = drt.explain_bwd(*args(sizes=(2, 64, seqlen, 4)), arch=BWD_ARCH)
        assert e["variant"] == WALKED.as_runtime_dict(), (seqlen, e["key"])
        assert "walk-cut" not in e["detail"]
    seq = args(sizes=(2, 64, 4000, 4), ptrs=with_ptr(3, SEQ), seq=(4000, 1))
    dfs = args(sizes=(2, 64, 4000, 4), ptrs=with_ptr(6, DFS), dfs=(64 * 3, 3, 1))
    for a in (seq, dfs):
        assert drt.explain_bwd(*a, arch=BWD_ARCH)["variant"] == WALKED.as_runtime_dict()
    e = drt.explain_bwd(*args(sizes=(2, 64, 4001, 4)), arch=BWD_ARCH)
    assert e["variant"] == realigned(WALKED.as_runtime_dict()), e["key"]


def test_held_segments_never_run_the_build(drt, tmp_path):
    from test_bwd_runtime import ARCH as BWD_ARCH, args, tuned_bwd_db
    for v in (HELD_128, HELD_96):
        drt.set_tuning_dbs([tuned_bwd_db(tmp_path / f"{v.key()}.db", [(v, (2, 64, 16384))])])
        for seqlen in (16000, 1000):
            assert not drt.explain_bwd(*args(sizes=(2, 64, seqlen, 4)), arch=BWD_ARCH)["key"].endswith(".walkcut")


def test_a_stored_source_from_before_the_build_keeps_its_plain_build(drt, tmp_path):
    """A DB's walked winner rendered before the build (no CC1D_BWD_WALK_CUT in its source)
    runs as it was tuned: the runtime reads the build's macro from the source."""
    from test_bwd_runtime import ARCH as BWD_ARCH, args
    from cc1d.tuner.db import TuningDB
    older = WALKED.source.replace("CC1D_BWD_WALK_CUT", "CC1D_BWD_OTHER")
    path = tmp_path / "old.db"
    with TuningDB(path) as db:
        db.put_winner(older, arch=BWD_ARCH, family_key=WALKED.family.key(), shape_key="b2.d64.l4096.bias.silu",
                      op="bwd", batch=2, dim=64, seqlen=4096, features="bias,silu", variant_key=WALKED.key(),
                      config=WALKED.params, **WALKED.geometry(), time_us=1.0, environment={"device": "test"})
        db.finalize()
    drt.set_tuning_dbs([str(path)])
    e = drt.explain_bwd(*args(sizes=(2, 64, 4000, 4)), arch=BWD_ARCH)
    assert e["key"] == WALKED.key() and e["variant"]["source"] == older


def test_the_generator_knows_which_calls_take_the_build(drt, tmp_path):
    """Variant.walk_cut_takes and served_build (what the tuner times) agree with the
    runtime's choice."""
    from test_bwd_runtime import ARCH as BWD_ARCH, args, tuned_bwd_db
    for v in (WALKED, WALKED_R4, HELD_128, HELD_96):
        drt.set_tuning_dbs([tuned_bwd_db(tmp_path / f"{v.key()}.db", [(v, (2, 64, 4096))])])
        for seqlen in SEQLENS + (1001, 4001):
            key = drt.explain_bwd(*args(sizes=(2, 64, seqlen, 4)), arch=BWD_ARCH)["key"]
            build = v.served_build(seqlen, BWD_ARCH)
            assert key == v.key() + ("" if build == "plain" else "." + build), (v.key(), seqlen)
            aligned = not v.rows_off_vectors(seqlen)  # walk_cut_takes speaks of aligned calls
            assert key.endswith(".walkcut") == (aligned and v.walk_cut_takes(seqlen, BWD_ARCH)), (v.key(), seqlen)
    assert WALKED_R4.walk_cut_takes(3000, "sm_90") and not WALKED_R4.walk_cut_takes(4096, "sm_90")
    assert not WALKED_R4.walk_cut_takes(3000, "gfx942")
    assert not WALKED_R4.walk_cut_takes(3000, "sm_90", seq_idx=True)
    assert not WALKED_R4.walk_cut_takes(3000, "sm_90", final_states=True)
    assert WALKED_R4.served_build(3001, "sm_90") == "realign"  # rows off the vectors come first


def test_the_tuner_times_a_cut_walked_candidate_as_its_walk_cut_build():
    from cc1d.tuner.evaluate import GpuEvaluator
    from cc1d.tuner.shapes import Shape
    ev = GpuEvaluator.__new__(GpuEvaluator)  # no GPU: only the kernel choice
    plain = WALKED_R4.as_runtime_dict()
    for target, seqlen, extra, want in (("sm_90", 3000, {}, walk_cut(plain)), ("sm_90", 4096, {}, plain),
                                        ("sm_90", 3000, {"seq_idx": True}, plain), ("gfx942", 3000, {}, plain),
                                        ("sm_90", 3001, {}, realigned(plain))):
        ev.shape, ev.target, ev._kernels = Shape("bwd", "cf", "bf16", "f32", 4, 2, 64, seqlen, **extra), target, {}
        assert ev._kernel(WALKED_R4) == want, (target, seqlen, extra)


def test_db_validate_compiles_the_walk_cut_build(rt):
    from cc1d.tuner.db import runtime_builds
    names = [name for name, _, _ in runtime_builds(rt, WALKED.key(), WALKED.source)]
    assert names == ["plain", "seq_idx", "realigned", "realigned seq_idx", "walk-cut"]
    cut = next(src for name, src, _ in runtime_builds(rt, WALKED.key(), WALKED.source) if name == "walk-cut")
    assert cut == WALK_CUT_DEFINE + WALKED.source
    assert "walk-cut" not in [name for name, _, _ in runtime_builds(rt, HELD_128.key(), HELD_128.source)]


# ---- compiling -----------------------------------------------------------------

CF_BWD = [f for f in families("bwd") if f.layout == "cf"]


def _walked(variants):
    return [v for v in variants if int(v.params["nvec"]) > 4]


def test_walk_cut_builds_compile_for_sm90(nvrtc):
    """The covering set's walked variants (the tuner's candidates) and one walked variant of
    each family compile in the walk-cut build; at most 16 bytes more local memory than their
    plain build (session 74, ptxas: fp16 `g96` 8 -> 24 bytes of stack)."""
    covering = _walked([v for v in all_covering("sm_90") if v.family.op == "bwd" and v.family.layout == "cf"])
    one_each = [Variant.of(f, threads=128, vec_bytes=16, nvec=16, rows=4, max_regs=128, split_blocks=512)
                for f in CF_BWD if f.width <= 4]
    assert covering and one_each
    more = []
    for v in covering + [v for v in one_each if v.why_invalid("sm_90") is None]:
        cut = nvidia_resources(nvrtc.compile(WALK_CUT_DEFINE + v.source, "sm_90", PTXAS_VERBOSE)[1])
        own = nvidia_resources(nvrtc.compile(v.source, "sm_90", PTXAS_VERBOSE)[1])
        if cut["stack"] > own["stack"] + 16:
            more.append(f"{v.key()}: walk-cut {cut}, plain {own}")
    assert not more, "local memory:\n" + "\n".join(more)


def test_the_realigned_build_refuses_the_walk_cut_define(nvrtc):
    """The two builds never meet (the runtime makes each from the plain source): a source
    with both defines is an error, not a kernel that walks misaligned rows."""
    with pytest.raises(RuntimeError, match="walk-cut build serves rows on the vector boundary only"):
        nvrtc.compile(WALK_CUT_DEFINE + "#define CC1D_BWD_REALIGN 1\n" + WALKED.source, "sm_90")


class _Build:
    """What compile_for_amd takes for a variant's walk-cut build: its source and key."""

    def __init__(self, v):
        self.v, self.source = v, WALK_CUT_DEFINE + v.source

    def key(self):
        return self.v.key() + ".walkcut"


@pytest.mark.amd
def test_walk_cut_builds_compile_for_gfx942(trixie):
    """The build compiles for AMD's 64-lane wavefronts (the runtime does not serve it there:
    not measured on AMD GPUs)."""
    walked = _walked([v for v in all_covering("gfx942") if v.family.op == "bwd" and v.family.layout == "cf"])
    assert walked
    compile_for_amd(trixie, "gfx942", [_Build(v) for v in walked[:12]], no_scratch=())
