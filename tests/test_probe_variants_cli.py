"""benchmarks/probe_variants.py checks its arguments before it touches a GPU (--peer for ops
the peer is not timed for, --rounds, candidates it cannot render or read), naming what it
refused, and renders KEY@DIR candidates from that folder's templates."""
from __future__ import annotations

import hashlib
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "probe_variants.py"


def test_peer_is_refused_for_an_update_shape():
    res = subprocess.run([sys.executable, str(SCRIPT), "--shape", "upd,cl,bf16/bf16,4,5,1000,1", "--peer",
                          "upd.cl.bf16wbf16.w4.t128.v8.r2.oafter.g255"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--peer: causal-conv1d is timed for fwd and bwd shapes, got op 'upd'" in res.stderr


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--shape", "bwd,cf,bf16/bf16,4,2,64,300", *args],
                          capture_output=True, text=True, timeout=120)


KEY = "bwd.cf.bf16wbf16.w4.t64.v16.n4.r1.g128.s2048"


def _probe():
    """benchmarks/probe_variants.py, imported with its folder on sys.path (its sibling imports)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import probe_variants
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return probe_variants


def _assert_build_of(key: str, suffix: str, define: str) -> None:
    """KEY+suffix is KEY's build the runtime makes: its source led by `define`, its hash of
    that, the rest KEY's."""
    _, plain = _probe().kernel_dict(key)
    name, build = _probe().kernel_dict(key + suffix)
    assert name == build["key"] == key + suffix
    assert build["source"] == define + plain["source"]
    assert build["hash"] == hashlib.sha256(build["source"].encode()).hexdigest()
    assert {k: v for k, v in build.items() if k not in ("key", "source", "hash")} == \
        {k: v for k, v in plain.items() if k not in ("key", "source", "hash")}


def test_rounds_below_one_are_refused():
    res = _run("--rounds", "0", KEY)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--rounds: expected a whole number >= 1, got 0" in res.stderr


def test_a_candidate_from_a_missing_folder_or_file_is_refused_by_name(tmp_path):
    missing = tmp_path / "nowhere"
    res = _run(f"{KEY}@{missing}")
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"candidate '{KEY}@{missing}': FileNotFoundError" in res.stderr


def _template_copy(tmp_path: Path) -> Path:
    """The installed generator's templates, copied (a candidate's folder to edit)."""
    render = importlib.import_module("cc1d.generator.render")
    copy = tmp_path / "templates"
    shutil.copytree(render.TEMPLATE_DIR, copy)
    return copy


def test_a_template_error_in_the_candidates_folder_is_refused_by_name(tmp_path):
    copy = _template_copy(tmp_path)
    (copy / "bwd_channel_first.cu.j2").write_text("{% if %}\n")
    res = _run(f"{KEY}@{copy}")
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"candidate '{KEY}@{copy}': TemplateSyntaxError" in res.stderr


def test_key_at_a_folder_renders_from_that_folder_and_leaves_the_generators_own(tmp_path):
    copy = _template_copy(tmp_path)
    path = copy / "bwd_channel_first.cu.j2"
    path.write_text("// marker from the candidate's folder\n" + path.read_text())
    probe_variants = _probe()
    name, kernel = probe_variants.kernel_dict(f"{KEY}@{copy}")
    assert name == f"{KEY}@{copy}"
    assert "// marker from the candidate's folder" in kernel["source"]
    assert kernel["hash"] == hashlib.sha256(kernel["source"].encode()).hexdigest()
    _, plain = probe_variants.kernel_dict(KEY)
    assert "marker from the candidate's folder" not in plain["source"]
    assert plain["source"] != kernel["source"]


def test_a_realign_key_is_the_variants_twin_as_the_runtime_makes_it(tmp_path):
    """KEY.realign (and KEY.realign@DIR) is the forward variant's realigned twin: its source
    led by the define the runtime prepends (dispatch.h kRealignDefine), its hash of that."""
    probe_variants = _probe()
    fwd = "fwd.cf.bf16wbf16.w4.t64.v16.n4.r1.hshfl.g64"
    _assert_build_of(fwd, ".realign", "#define CC1D_FWD_REALIGN 1\n")
    copy = _template_copy(tmp_path)
    path = copy / "fwd_cf_tiles.cuh.j2"
    path.write_text("// marker\n" + path.read_text())
    name, twin_at = probe_variants.kernel_dict(f"{fwd}.realign@{copy}")
    assert name == f"{fwd}.realign@{copy}"
    assert twin_at["source"].startswith("#define CC1D_FWD_REALIGN 1\n") and "// marker" in twin_at["source"]


def test_a_walkcut_key_is_the_variants_walk_cut_build_as_the_runtime_makes_it():
    """KEY.walkcut is a walked backward variant's walk-cut build (dispatch.h kBwdWalkCutDefine);
    a held variant has none, and the candidate is refused by name."""
    _assert_build_of("bwd.cf.f16wf16.w4.t128.v16.n16.r4.g96.s2048", ".walkcut", "#define CC1D_BWD_WALK_CUT 1\n")
    res = _run(f"{KEY}.walkcut")
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"candidate '{KEY}.walkcut': ValueError" in res.stderr and "has no walk-cut build" in res.stderr


def test_seq_idx_is_refused_for_an_update_shape():
    res = subprocess.run([sys.executable, str(SCRIPT), "--shape", "upd,cl,bf16/bf16,4,5,1000,1", "--seq-idx",
                          "upd.cl.bf16wbf16.w4.t128.v8.r2.oafter.g255"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "--seq-idx: seq_idx is a feature of fwd and bwd shapes, got op 'upd'" in res.stderr


def test_seq_idx_shapes_compile_the_backward_candidates_seq_idx_build(monkeypatch):
    """--seq-idx: the shape carries seq_idx, and a backward candidate's registers are those of
    its seq_idx build, compiled with the option the runtime adds (runtime/src/backward.cpp)."""
    probe_variants = _probe()
    bwd = probe_variants.parse_shape("bwd,cf,bf16/bf16,4,2,64,300", True, seq_idx=True)
    assert bwd.seq_idx and bwd.key().endswith(".seqidx")
    assert not probe_variants.parse_shape("bwd,cf,bf16/bf16,4,2,64,300", True).seq_idx
    option = "-DCC1D_BWD_SEQ_TILES=1"
    runtime_source = (SCRIPT.parents[1] / "runtime" / "src" / "backward.cpp").read_text()
    assert f'options{{"{option}"}}' in runtime_source
    assert probe_variants.compile_options(bwd) == [option] == list(probe_variants._cc1d.bwd_seq_build_options())
    for other in ("bwd,cf,bf16/bf16,4,2,64,300", "bwd,cl,bf16/bf16,4,2,64,300"):
        assert probe_variants.compile_options(probe_variants.parse_shape(other, True)) == []
    # The forward has no seq_idx build: its seq_idx calls run the plain one.
    assert probe_variants.compile_options(probe_variants.parse_shape("fwd,cf,bf16/bf16,4,2,64,300", True,
                                                                     seq_idx=True)) == []
    seq_options = probe_variants.compile_options(bwd)  # before the runtime is faked below
    seen = []

    class FakeRuntime:
        @staticmethod
        def compile(source, arch, options):
            seen.append((arch, list(options)))
            return b"", "ptxas info    : Used 40 registers"

    monkeypatch.setattr(probe_variants, "_cc1d", FakeRuntime)
    used = probe_variants.resources("// src", None, KEY, seq_options)
    assert seen == [("sm_90", ["--ptxas-options=-v", option])] and used == "Used 40 registers"


def test_a_call_the_peer_rejects_is_a_row_saying_so(monkeypatch, capsys):
    """The peer's rejection (channel-first seq_idx) prints as its row; the candidates still run."""
    probe_variants = _probe()
    monkeypatch.setattr(probe_variants, "peer_calls", lambda shape, sets: [lambda: None])

    def rejects(fns):
        raise RuntimeError("seq_idx only supported for channel last layout\nmore detail")

    monkeypatch.setattr(probe_variants, "graph_time_us", rejects)
    shape = probe_variants.parse_shape("bwd,cf,bf16/bf16,4,2,64,300", True, seq_idx=True)
    probe_variants.print_peer_row(shape, [], 1, 1.0)
    assert capsys.readouterr().out == \
        "| causal-conv1d (failed: seq_idx only supported for channel last layout) | — | — | — | — |\n"
