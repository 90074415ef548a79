"""Realigned twins (fwd_cf_tiles.cuh.j2 CC1D_FWD_REALIGN, bwd_channel_first.cu.j2
CC1D_BWD_REALIGN, runtime dispatch.h realigned_twin): a channel-first forward or backward
whose rows start off the vector boundary (an odd seqlen's), with the rows it walks lying
alike (x's and out's; x's, dout's and dx's), runs a 16-byte winner through its twin instead
of a 2-byte kernel; an aligned backward whose sequence cuts a held segment runs the twin
where the source says so (CC1D_BWD_CUT_TWIN), which moves the cut segment back. The
dispatcher's choice (no GPU), and every default and covering twin compiling for sm_90
(NVRTC) and gfx942 (hipRTC, marker amd). Their results on the GPU: test_forward_gpu.py
and test_backward_gpu.py test_realigned_twins_match_reference."""
from __future__ import annotations

import hashlib

import pytest

from cc1d.generator import default_variant, families
from cc1d.generator.covering import all_covering
from cc1d.generator.variant import BWD_REALIGN_DEFINE, REALIGN_DEFINE, realigned

from compile_checks import PTXAS_VERBOSE, nvidia_resources
from test_compile_amd import compile_for_amd
from test_dispatch import CATALOG_16, CATALOG_2, V2, V16, call, explain, make_db, put  # noqa: F401

DEFINE = REALIGN_DEFINE


def twin_of(v) -> dict:
    """The runtime dict of v's realigned twin, as the generator's realigned() makes it."""
    return realigned(v.as_runtime_dict())


def test_a_twin_is_its_source_led_by_the_define():
    twin, plain = twin_of(V16[3]), V16[3].as_runtime_dict()
    assert DEFINE == "#define CC1D_FWD_REALIGN 1\n"
    assert twin["source"] == DEFINE + plain["source"] and twin["key"] == plain["key"] + ".realign"
    assert twin["hash"] == hashlib.sha256(twin["source"].encode()).hexdigest()
    assert {k: twin[k] for k in plain if k not in ("key", "source", "hash")} == \
        {k: plain[k] for k in plain if k not in ("key", "source", "hash")}


def test_rows_off_vectors_is_about_channel_first_rows():
    v16 = V16[3]  # bf16, 16-byte vectors: rows of 8k positions start on them
    assert not v16.rows_off_vectors(4096) and v16.rows_off_vectors(4095) and v16.rows_off_vectors(4092)
    assert not V2[5].rows_off_vectors(4095)  # 2-byte vectors: every bf16 row starts on one
    for op in ("fwd", "bwd"):
        cl = default_variant(next(f for f in families(op) if f.layout == "cl"), "sm_90")
        assert not cl.rows_off_vectors(4095)
    bwd = default_variant(BWD_BF16, "sm_90")
    assert bwd.rows_off_vectors(4095) and not bwd.rows_off_vectors(4096)


def test_a_backward_twin_is_led_by_the_backward_define():
    v = default_variant(BWD_BF16, "sm_90").as_runtime_dict()
    twin = realigned(v)
    assert BWD_REALIGN_DEFINE == "#define CC1D_BWD_REALIGN 1\n"
    assert twin["source"] == BWD_REALIGN_DEFINE + v["source"] and twin["key"] == v["key"] + ".realign"
    with pytest.raises(ValueError, match="has no realigned build: only channel-first forward and backward"):
        realigned(default_variant(next(f for f in families("bwd") if f.layout == "cl"), "sm_90").as_runtime_dict())


def test_twin_source_is_the_runtimes_twin_of_a_stored_source():
    """A channel-first forward's or backward's source that names its op's macro gets the
    define ahead (dispatch.cpp twinnable); other ops, layouts and older sources get none.
    cc1d-tune db validate --compile and test_shipped_db compile those twins."""
    from cc1d.generator.variant import twin_source
    from cc1d.tuner.db import runtime_builds
    fwd = default_variant(next(f for f in families("fwd") if f.layout == "cf"), "sm_90")
    bwd = default_variant(CF_BWD[0], "sm_90")
    cl = default_variant(next(f for f in families("bwd") if f.layout == "cl"), "sm_90")
    assert twin_source(fwd.key(), fwd.source) == DEFINE + fwd.source
    assert twin_source(bwd.key(), bwd.source) == BWD_REALIGN_DEFINE + bwd.source
    assert twin_source(cl.key(), cl.source) is None
    older = bwd.source.replace("CC1D_BWD_REALIGN", "CC1D_OTHER")  # rendered before the build existed
    assert twin_source(bwd.key(), older) is None

    class _Rt:
        @staticmethod
        def bwd_seq_build_options():
            return ["-DCC1D_BWD_SEQ_TILES=1"]

    seq = ["-DCC1D_BWD_SEQ_TILES=1"]
    assert runtime_builds(_Rt, fwd.key(), fwd.source) == [("plain", fwd.source, []),
                                                           ("realigned", DEFINE + fwd.source, [])]
    assert runtime_builds(_Rt, bwd.key(), bwd.source) == [
        ("plain", bwd.source, []), ("seq_idx", bwd.source, seq),
        ("realigned", BWD_REALIGN_DEFINE + bwd.source, []), ("realigned seq_idx", BWD_REALIGN_DEFINE + bwd.source, seq)]
    assert runtime_builds(_Rt, cl.key(), cl.source) == [("plain", cl.source, []), ("seq_idx", cl.source, seq)]
    assert runtime_builds(_Rt, bwd.key(), older) == [("plain", older, []), ("seq_idx", older, seq)]


def test_the_tuner_times_an_odd_lengths_candidate_as_its_twin():
    """GpuEvaluator launches (and compiles) the twin where the shape's rows start off the
    candidate's vectors, as the dispatcher will serve the stored winner there."""
    from cc1d.tuner.evaluate import GpuEvaluator
    from cc1d.tuner.shapes import Shape
    ev = GpuEvaluator.__new__(GpuEvaluator)  # no GPU: only the kernel choice
    ev._kernels, ev.target = {}, "sm_90"
    for seqlen, twin in ((4095, True), (4096, False)):
        ev.shape, ev._kernels = Shape("fwd", "cf", "bf16", "f32", 4, 2, 64, seqlen), {}
        want = twin_of(V16[3]) if twin else V16[3].as_runtime_dict()
        assert ev._kernel(V16[3]) == want
    bwd = default_variant(BWD_BF16, "sm_90")
    for seqlen, twin in ((4095, True), (4096, False)):
        ev.shape, ev._kernels = Shape("bwd", "cf", "bf16", "f32", 4, 2, 64, seqlen), {}
        want = twin_of(bwd) if twin else bwd.as_runtime_dict()
        assert ev._kernel(bwd) == want
        assert ev._kernel(bwd)["source"].startswith(BWD_REALIGN_DEFINE) == twin


@pytest.fixture
def drt(rt):
    """The runtime with no tuning DB but those a test sets, and a fresh memo."""
    rt.set_tuning_dbs([])
    rt.clear_dispatch_cache()
    yield rt
    rt.set_tuning_dbs([])
    rt.clear_dispatch_cache()


# ---- the dispatcher's choice ---------------------------------------------------

def test_odd_length_runs_the_nearest_16_byte_winner_through_its_twin(drt, tmp_path):
    # bf16 rows of 4095 positions: every row but the first starts off a 16-byte boundary
    path = make_db(tmp_path / "t.db", [(V16[3], 2, 64, 4096), (V2[5], 16, 4096, 8192)])
    drt.set_tuning_dbs([path])
    e = explain(drt, 2, 64, 4095)
    assert (e["reason"], e["alignment"]) == ("nearest", 2)
    assert e["variant"] == twin_of(V16[3]), e["key"]
    assert "realigned build: x's and out's rows start off its 16-byte vectors" in e["detail"]
    assert drt.select_fwd(*call(2, 64, 4095), 0, "sm_999") == twin_of(V16[3])
    # a length of whole vectors needs no twin
    assert explain(drt, 2, 64, 4104)["variant"] == V16[3].as_runtime_dict()


def test_exact_winner_serves_through_its_twin(drt, tmp_path):
    path = make_db(tmp_path / "t.db", [(V16[3], 2, 64, 4095), (V16[4], 2, 64, 4000)])
    drt.set_tuning_dbs([path])
    e = explain(drt, 2, 64, 4095)
    assert (e["reason"], e["key"]) == ("exact", V16[3].key() + ".realign")


def test_rows_that_lie_unlike_get_no_twin(drt, tmp_path):
    path = make_db(tmp_path / "t.db", [(V16[3], 2, 64, 4096), (V2[5], 16, 4096, 8192)])
    drt.set_tuning_dbs([path])
    # x 2 bytes past out against 16 bytes: a twin's vectors would not meet out's rows
    e = explain(drt, 2, 64, 4095, x_ptr=258)
    assert (e["reason"], e["key"]) == ("nearest", V2[5].key())
    assert "realigned" not in e["detail"]


def test_a_source_without_the_realigned_build_gets_no_twin(drt, tmp_path):
    """A DB source rendered before the build existed would ignore the define and load
    misaligned vectors: never twinned."""
    from cc1d.tuner.db import TuningDB

    class Stale:  # V16[3] with the build's name gone from its source
        source = V16[3].source.replace("CC1D_FWD_REALIGN", "CC1D_FWD_OTHER")
        params = V16[3].params

        def key(self):
            return V16[3].key()

        def hash(self):
            return hashlib.sha256(self.source.encode()).hexdigest()

        def geometry(self):
            return V16[3].geometry()

    path = tmp_path / "t.db"
    with TuningDB(path) as db:
        put(db, Stale(), 2, 64, 4096)
        put(db, Stale(), 2, 64, 4095)
        put(db, V2[5], 16, 4096, 8192)
    drt.set_tuning_dbs([str(path)])
    e = explain(drt, 2, 64, 4095)
    assert e["key"] == V2[5].key()
    assert "its stored source predates that build: cc1d-tune db rerender" in e["detail"], e["detail"]
    assert explain(drt, 2, 64, 4096)["key"] == V16[3].key()  # aligned rows still run it


def test_default_is_the_catalogs_first_choice_through_its_twin(drt):
    e = explain(drt, 2, 64, 4095)
    assert (e["reason"], e["variant"]) == ("default", twin_of(CATALOG_16))
    e = explain(drt, 2, 64, 4095, x_ptr=258)
    assert (e["reason"], e["key"]) == ("default", CATALOG_2.key())


def test_launch_checks_a_twins_row_alignment(drt):
    """launch_fwd with a twin checks that x's and out's rows lie alike (before it looks for
    a device): the message names what the twin needs and what the call gives."""
    ptrs, sizes, strides, xd, wd, silu = call(2, 64, 4095, x_ptr=258)
    with pytest.raises(ValueError, match="needs x's and out's rows to lie alike against 16-byte vectors .*"
                                         "the call's agree to 2 bytes"):
        drt.launch_fwd(twin_of(V16[3]), ptrs, sizes, strides, xd, wd, silu, 0)


# ---- the backward ---------------------------------------------------------------

BWD_BF16 = next(f for f in families("bwd") if f.key() == "bwd.cf.bf16wf32.w4")


def test_odd_backward_runs_the_catalogs_first_choice_through_its_twin(drt):
    """x, dout and dx contiguous (rows alike) at an odd length: the catalog's 16-byte first
    choice through its twin; dx's rows 2 bytes off x's: the 2-byte kernel."""
    from test_bwd_runtime import ARCH as BWD_ARCH, DX, PTRS, args, with_ptr
    e = drt.explain_bwd(*args(sizes=(2, 64, 4095, 4)), arch=BWD_ARCH)
    first = default_variant(BWD_BF16, "sm_90")
    assert (e["reason"], e["alignment"]) == ("default", 2)
    assert e["variant"] == realigned(first.as_runtime_dict()), e["key"]
    assert "realigned build: x's, dout's and dx's rows start off its 16-byte vectors" in e["detail"]
    e = drt.explain_bwd(*args(sizes=(2, 64, 4095, 4), ptrs=with_ptr(7, DX + 2, PTRS)), arch=BWD_ARCH)
    assert e["variant"]["align_bytes"] == 2 and not e["key"].endswith(".realign"), e["key"]
    e = drt.explain_bwd(*args(sizes=(2, 64, 4096, 4)), arch=BWD_ARCH)  # whole vectors: no twin
    assert e["variant"] == first.as_runtime_dict()


def test_an_odd_backward_serves_a_tuned_winner_through_its_twin(drt, tmp_path):
    from test_bwd_runtime import ARCH as BWD_ARCH, args, tuned_bwd_db
    v = default_variant(BWD_BF16, "sm_90")
    drt.set_tuning_dbs([tuned_bwd_db(tmp_path / "t.db", [(v, (2, 64, 4095))])])
    e = drt.explain_bwd(*args(sizes=(2, 64, 4095, 4)), arch=BWD_ARCH)
    assert (e["reason"], e["key"]) == ("exact", v.key() + ".realign")


def test_launch_checks_a_backward_twins_row_alignment(drt):
    from test_bwd_runtime import DOUT, PTRS, args, with_ptr
    twin = realigned(default_variant(BWD_BF16, "sm_90").as_runtime_dict())
    a = args(sizes=(2, 64, 4095, 4), ptrs=with_ptr(5, DOUT + 4, PTRS))
    with pytest.raises(ValueError, match="needs x's, dout's and dx's rows to lie alike against 16-byte vectors .*"
                                         "the call's agree to 4 bytes"):
        drt.launch_bwd(twin, *a, 1 << 30, 0)


# ---- a backward's cut segment (CC1D_BWD_CUT_TWIN) ---------------------------------

def _bwd_variant(**config):
    from cc1d.generator import Variant
    return Variant.of(BWD_BF16, **{"vec_bytes": 16, "rows": 1, "split_blocks": 2048, **config})


HELD_128 = _bwd_variant(threads=64, nvec=4, max_regs=128)            # 1024-position segments
HELD_96 = _bwd_variant(threads=128, nvec=2, rows=4, max_regs=96)     # 512
WALKED = _bwd_variant(threads=64, nvec=16, max_regs=128)             # 4096, walked


def test_the_source_says_which_backward_twins_take_cut_segments():
    """Held segments whose own cap is the twin's (128) or looser: its twin moves the cut
    segment with at least as many blocks resident. Below 128 registers, walked segments or
    one-element vectors (unmeasured): the plain build."""
    from cc1d.generator.render import bwd_twin_takes_cuts
    for v, takes in ((HELD_128, True), (HELD_96, False), (WALKED, False),
                     (_bwd_variant(threads=128, nvec=2, max_regs=255), True),
                     (_bwd_variant(threads=64, vec_bytes=2, nvec=4, max_regs=128), False)):
        assert bwd_twin_takes_cuts(v.family, v.params) == takes, v.key()
        assert f"#define CC1D_BWD_CUT_TWIN {int(takes)}\n" in v.source, v.key()


def test_an_aligned_backward_whose_sequence_cuts_a_segment_runs_the_twin(drt, tmp_path):
    """The (2, 64, 4096) winner's 1024-position segments: seqlen 4000 cuts the last one,
    so the call runs the twin; whole segments, a sequence of one segment or less, seq_idx
    or dfinal_states keep the plain build."""
    from test_bwd_runtime import ARCH as BWD_ARCH, DFS, SEQ, args, tuned_bwd_db, with_ptr
    drt.set_tuning_dbs([tuned_bwd_db(tmp_path / "t.db", [(HELD_128, (2, 64, 4096))])])
    for seqlen in (4000, 3000, 1032):
        e = drt.explain_bwd(*args(sizes=(2, 64, seqlen, 4)), arch=BWD_ARCH)
        assert e["variant"] == realigned(HELD_128.as_runtime_dict()), (seqlen, e["key"])
        assert e["alignment"] % 16 == 0  # aligned rows: no twin for alignment
        assert ("realigned build: it moves the segment this call's sequence cuts (1024 positions) back onto its "
                "fast path, which its plain build runs on the edge path") in e["detail"], e["detail"]
    for seqlen in (4096, 3072, 1024, 1000, 8):
        e = drt.explain_bwd(*args(sizes=(2, 64, seqlen, 4)), arch=BWD_ARCH)
        assert e["variant"] == HELD_128.as_runtime_dict(), (seqlen, e["key"])
    seq = args(sizes=(2, 64, 4000, 4), ptrs=with_ptr(3, SEQ), seq=(4000, 1))
    dfs = args(sizes=(2, 64, 4000, 4), ptrs=with_ptr(6, DFS), dfs=(64 * 3, 3, 1))
    for a in (seq, dfs):
        assert not drt.explain_bwd(*a, arch=BWD_ARCH)["key"].endswith(".realign")


def test_lower_caps_and_walked_segments_take_no_twin_at_cut_lengths(drt, tmp_path):
    """A held segment under a 96-register cap keeps its plain build; a walked one runs its
    walk-cut build (test_walk_cut.py), not the twin."""
    from test_bwd_runtime import ARCH as BWD_ARCH, args, tuned_bwd_db
    from cc1d.generator.variant import walk_cut
    for v, want in ((HELD_96, HELD_96.as_runtime_dict()), (WALKED, walk_cut(WALKED.as_runtime_dict()))):
        drt.set_tuning_dbs([tuned_bwd_db(tmp_path / f"{v.key()}.db", [(v, (2, 64, 16384))])])
        e = drt.explain_bwd(*args(sizes=(2, 64, 16000, 4)), arch=BWD_ARCH)
        assert e["variant"] == want, e["key"]


def test_the_catalog_default_runs_its_twin_at_cut_lengths_on_nvidia_only(drt):
    from test_bwd_runtime import args
    first = default_variant(BWD_BF16, "sm_90")
    assert "#define CC1D_BWD_CUT_TWIN 1\n" in first.source
    e = drt.explain_bwd(*args(sizes=(2, 64, 4000, 4)), arch="sm_999")  # no DB: the catalog
    assert (e["reason"], e["variant"]) == ("default", realigned(first.as_runtime_dict())), e["key"]
    e = drt.explain_bwd(*args(sizes=(2, 64, 4000, 4)), arch="gfx942")
    assert e["reason"] == "default" and not e["key"].endswith(".realign"), e["key"]


def test_the_generator_knows_which_calls_take_the_twin_for_a_cut_segment(drt, tmp_path):
    """Variant.twin_takes_cut, and served_as_twin (what the tuner times: odd lengths too),
    agree with the runtime's choice."""
    from test_bwd_runtime import ARCH as BWD_ARCH, args, tuned_bwd_db
    for v in (HELD_128, HELD_96, WALKED, default_variant(BWD_BF16, "sm_90")):
        drt.set_tuning_dbs([tuned_bwd_db(tmp_path / f"{v.key()}.db", [(v, (2, 64, 4096))])])
        for seqlen in (8, 504, 512, 1000, 1024, 1032, 2040, 3072, 4000, 4096, 5000, 16000):
            e = drt.explain_bwd(*args(sizes=(2, 64, seqlen, 4)), arch=BWD_ARCH)
            assert e["key"].endswith(".realign") == v.twin_takes_cut(seqlen, BWD_ARCH), (v.key(), seqlen, e["key"])
        for seqlen in (8, 1001, 3072, 4000, 4001):
            e = drt.explain_bwd(*args(sizes=(2, 64, seqlen, 4)), arch=BWD_ARCH)
            assert e["key"].endswith(".realign") == v.served_as_twin(seqlen, BWD_ARCH), (v.key(), seqlen, e["key"])
        assert v.served_as_twin(1001, BWD_ARCH) and v.served_as_twin(1001, "gfx942")  # rows off the vectors
    assert not HELD_128.twin_takes_cut(4000, "gfx942")
    assert not HELD_128.twin_takes_cut(4000, "sm_90", seq_idx=True)
    assert not HELD_128.twin_takes_cut(4000, "sm_90", final_states=True)


def test_the_tuner_times_a_cut_backward_candidate_as_its_twin():
    from cc1d.tuner.evaluate import GpuEvaluator
    from cc1d.tuner.shapes import Shape
    ev = GpuEvaluator.__new__(GpuEvaluator)  # no GPU: only the kernel choice
    for target, seqlen, extra, twin in (("sm_90", 4000, {}, True), ("sm_90", 4096, {}, False),
                                        ("sm_90", 4000, {"seq_idx": True}, False), ("gfx942", 4000, {}, False)):
        ev.shape, ev.target, ev._kernels = Shape("bwd", "cf", "bf16", "f32", 4, 2, 64, seqlen, **extra), target, {}
        want = twin_of(HELD_128) if twin else HELD_128.as_runtime_dict()
        assert ev._kernel(HELD_128) == want, (target, seqlen, extra)


# ---- compiling -----------------------------------------------------------------

CF_FWD = [f for f in families("fwd") if f.layout == "cf"]


def _twins(variants):
    return [v for v in variants if v.geometry()["align_bytes"] > v.family.x_bytes]


class _Twin:
    """What compile_for_amd takes for a variant's realigned twin: its source and key."""

    def __init__(self, v, define):
        self.v, self.source = v, define + v.source

    def key(self):
        return self.v.key() + ".realign"


def test_default_and_covering_twins_compile_for_sm90(nvrtc):
    """The untuned kernels' twins without local memory; the covering set's (tuning
    candidates, which may spill plain too) compile."""
    defaults = _twins([default_variant(f, "sm_90") for f in CF_FWD])
    covering = _twins([v for v in all_covering("sm_90") if v.family.op == "fwd" and v.family.layout == "cf"])
    assert defaults and covering
    spills = []
    for v in defaults + covering:
        _, log = nvrtc.compile(DEFINE + v.source, "sm_90", PTXAS_VERBOSE)
        res = nvidia_resources(log)
        if v in defaults and (res["spill_stores"] or res["spill_loads"] or res["stack"]):
            spills.append(f"{v.key()}: {res}")
    assert not spills, "local-memory use:\n" + "\n".join(spills)


@pytest.mark.amd
def test_default_twins_compile_for_gfx942(trixie):
    defaults = _twins([default_variant(f, "gfx942") for f in CF_FWD])
    compile_for_amd(trixie, "gfx942", [_Twin(v, DEFINE) for v in defaults])


ALL_INPUTS = dict(seq_idx=True, initial_states=True, final_states=True)


def _fixed_twins(target, options_for):
    """A plan's fixed kernel of each default width-4 channel-first forward twin, for `target`:
    the fixed options as #define lines ahead of the twin's source (any compiler)."""
    from compile_checks import with_defines
    out = []
    for f in CF_FWD:
        v = default_variant(f, target)
        if f.width == 4 and v.geometry()["align_bytes"] > f.x_bytes:
            for name, features in (("plain", {}), ("every-input", ALL_INPUTS)):
                twin = with_defines(v, options_for(f, features), f"realign+fixed-{name}")
                out.append(type(twin)(key=twin.key, source=DEFINE + twin.source))
    return out


def test_fixed_twins_compile_for_sm90_without_local_memory(nvrtc):
    """Plans launch a twin's fixed kernel (with seq_idx: its whole tiles with sequence ids)."""
    from test_fwd_fixed_compile import fixed_call
    chosen = _fixed_twins("sm_90", lambda f, features: nvrtc.fwd_fixed_options(*fixed_call(f, **features)))
    assert chosen
    problems = []
    for t in chosen:
        res = nvidia_resources(nvrtc.compile(t.source, "sm_90", PTXAS_VERBOSE)[1])
        if res["spill_stores"] or res["spill_loads"] or res["stack"]:
            problems.append(f"{t.key()}: {res}")
    assert not problems, "local-memory use:\n" + "\n".join(problems)


@pytest.mark.amd
def test_fixed_twins_compile_for_gfx942(trixie, rt):
    from test_fwd_fixed_compile import fixed_call
    compile_for_amd(trixie, "gfx942", _fixed_twins("gfx942", lambda f, features: rt.fwd_fixed_options(
        *fixed_call(f, **features))))


CF_BWD = [f for f in families("bwd") if f.layout == "cf"]


def test_backward_default_twins_compile_for_sm90(nvrtc):
    """The untuned backward kernels' twins, plain and seq_idx builds, with no more local
    memory than the same build of the variant itself (none, but for a few seq_idx builds);
    the covering set's (tuning candidates, which may spill plain too) compile."""
    defaults = _twins([default_variant(f, "sm_90") for f in CF_BWD])
    covering = _twins([v for v in all_covering("sm_90") if v.family.op == "bwd" and v.family.layout == "cf"])
    assert defaults and covering
    spills = []
    for v in defaults:
        for options in ([], ["-DCC1D_BWD_SEQ_TILES=1"]):
            res = nvidia_resources(nvrtc.compile(BWD_REALIGN_DEFINE + v.source, "sm_90", PTXAS_VERBOSE + options)[1])
            own = nvidia_resources(nvrtc.compile(v.source, "sm_90", PTXAS_VERBOSE + options)[1])
            if any(res[k] > own[k] for k in ("spill_stores", "spill_loads", "stack")):
                spills.append(f"{v.key()} {options}: twin {res}, its own build {own}")
    assert not spills, "local-memory use:\n" + "\n".join(spills)
    for v in covering:
        nvrtc.compile(BWD_REALIGN_DEFINE + v.source, "sm_90")


@pytest.mark.amd
def test_backward_default_twins_compile_for_gfx942(trixie):
    """HIP's 64-lane wavefronts hold two rows of a 32-thread row's variant: the twin's
    shuffling loops are made alike across them (bcf_warp_min)."""
    defaults = _twins([default_variant(f, "gfx942") for f in CF_BWD])
    compile_for_amd(trixie, "gfx942", [_Twin(v, BWD_REALIGN_DEFINE) for v in defaults])
