"""The causal_conv1d drop-in (cc1d.alias): module names, the peer's public names and
signatures (a table recorded from Dao-AILab causal-conv1d 1.6), find_spec and
importlib.metadata (what transformers' availability checks use), the environment
switch and the runner. CPU only; the torch parts skip without torch. The GPU
comparisons of the shims are in test_alias_gpu.py."""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import itertools
import os
import subprocess
import sys
import textwrap

import pytest

import cc1d
from cc1d import alias
from conftest import pythonpath_with

_E = inspect.Parameter.empty

# The peer's public API (causal-conv1d 1.6): module -> name -> parameters (name, default).
# A required parameter has no default (_E).
PEER_API = {
    "causal_conv1d": {
        "causal_conv1d_fn": [("x", _E), ("weight", _E), ("bias", None), ("seq_idx", None),
                             ("initial_states", None), ("return_final_states", False),
                             ("final_states_out", None), ("activation", None)],
        "causal_conv1d_update": [("x", _E), ("conv_state", _E), ("weight", _E), ("bias", None),
                                 ("activation", None), ("cache_seqlens", None), ("conv_state_indices", None)],
    },
    "causal_conv1d.causal_conv1d_interface": {
        "causal_conv1d_fn": [("x", _E), ("weight", _E), ("bias", None), ("seq_idx", None),
                             ("initial_states", None), ("return_final_states", False),
                             ("final_states_out", None), ("activation", None)],
        "causal_conv1d_ref": [("x", _E), ("weight", _E), ("bias", None), ("initial_states", None),
                              ("return_final_states", False), ("final_states_out", None), ("activation", None)],
        "causal_conv1d_update": [("x", _E), ("conv_state", _E), ("weight", _E), ("bias", None),
                                 ("activation", None), ("cache_seqlens", None), ("conv_state_indices", None)],
        "causal_conv1d_update_ref": [("x", _E), ("conv_state", _E), ("weight", _E), ("bias", None),
                                     ("activation", None), ("cache_seqlens", None)],
    },
    "causal_conv1d.causal_conv1d_varlen": {
        "causal_conv1d_varlen_states": [("x", _E), ("cu_seqlens", _E), ("state_len", _E)],
        "causal_conv1d_varlen_states_ref": [("x", _E), ("cu_seqlens", _E), ("state_len", _E)],
    },
    "causal_conv1d.cpp_functions": {
        "causal_conv1d_fwd_function": [("x", _E), ("weight", _E), ("bias", _E), ("seq_idx", _E),
                                       ("initial_states", _E), ("final_states_out", _E), ("silu_activation", _E)],
        "causal_conv1d_bwd_function": [("x", _E), ("weight", _E), ("bias", _E), ("dout", _E), ("seq_idx", _E),
                                       ("initial_states", _E), ("dfinal_states", _E), ("dx", _E),
                                       ("return_dinitial_states", _E), ("silu_activation", _E)],
        "causal_conv1d_update_function": [("x", _E), ("conv_state", _E), ("weight", _E), ("bias", _E),
                                          ("silu_activation", _E), ("cache_seqlens", _E),
                                          ("conv_state_indices", _E)],
    },
}
PEER_AUTOGRAD_FORWARD = [("ctx", _E), ("x", _E), ("weight", _E), ("bias", None), ("seq_idx", None),
                         ("initial_states", None), ("return_final_states", False), ("final_states_out", None),
                         ("activation", None)]


def params(fn) -> list:
    out = []
    for p in inspect.signature(fn).parameters.values():
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, f"{fn.__name__}: {p.name} is {p.kind}"
        out.append((p.name, p.default))
    return out


@pytest.fixture
def installed():
    alias.uninstall_causal_conv1d_alias()
    mod = cc1d.install_causal_conv1d_alias()
    yield mod
    alias.uninstall_causal_conv1d_alias()


def test_modules_resolve_to_cc1d(installed):
    import causal_conv1d
    import causal_conv1d.causal_conv1d_interface as iface
    import causal_conv1d.causal_conv1d_varlen as varlen
    import causal_conv1d.cpp_functions as cpp
    assert installed is causal_conv1d and causal_conv1d.__cc1d__
    for mod in (causal_conv1d, iface, varlen, cpp):
        assert mod.__spec__.name == mod.__name__ and mod.__spec__.origin == "cc1d.alias"
    assert causal_conv1d.causal_conv1d_fn is iface.causal_conv1d_fn is cc1d.compat.causal_conv1d_fn
    assert cpp.causal_conv1d_bwd_function is cc1d.compat.causal_conv1d_bwd_function
    assert varlen.causal_conv1d_varlen_states is cc1d.compat.causal_conv1d_varlen_states
    # import forms used by transformers (<5), mamba_ssm, flash-linear-attention, Megatron
    ns: dict = {}
    exec("from causal_conv1d import causal_conv1d_fn, causal_conv1d_update\n"
         "from causal_conv1d.cpp_functions import causal_conv1d_fwd_function, causal_conv1d_bwd_function, "
         "causal_conv1d_update_function\n"
         "from causal_conv1d.causal_conv1d_varlen import causal_conv1d_varlen_states\n"
         "from causal_conv1d.causal_conv1d_interface import causal_conv1d_fn as f2", ns)
    assert callable(ns["causal_conv1d_update_function"]) and ns["f2"] is ns["causal_conv1d_fn"]
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("causal_conv1d.not_a_module")


@pytest.mark.parametrize("module", sorted(PEER_API))
def test_names_and_signatures_match_the_peer(installed, module):
    mod = importlib.import_module(module)
    for name, expected in PEER_API[module].items():
        assert params(getattr(mod, name)) == expected, f"{module}.{name}"
    public = {n for n in vars(mod) if not n.startswith("_") and callable(getattr(mod, n))}
    lazy = set(alias.LAZY.get(module, ()))
    assert public | lazy == set(PEER_API[module]) | lazy, f"{module}: names beyond the peer's"


def test_autograd_function_matches_the_peer(installed):
    torch = pytest.importorskip("torch")
    from causal_conv1d.causal_conv1d_interface import CausalConv1dFn
    assert issubclass(CausalConv1dFn, torch.autograd.Function)
    assert params(CausalConv1dFn.forward) == PEER_AUTOGRAD_FORWARD


def test_version_find_spec_and_metadata(installed):
    import causal_conv1d
    assert causal_conv1d.__version__.startswith("1.6.0+cc1d.")
    major, minor = (int(p) for p in causal_conv1d.__version__.split(".")[:2])
    assert (major, minor) >= (1, 4)
    spec = importlib.util.find_spec("causal_conv1d")
    assert spec is not None and spec.origin == "cc1d.alias"
    assert importlib.util.find_spec("causal_conv1d.cpp_functions") is not None
    for dist_name in ("causal_conv1d", "causal-conv1d"):
        assert importlib.metadata.version(dist_name) == causal_conv1d.__version__
    # transformers maps import names to distributions with this at import time
    assert "causal_conv1d" in importlib.metadata.packages_distributions().get("causal_conv1d", [])
    # other names pass through untouched
    assert importlib.util.find_spec("json") is not None and importlib.util.find_spec("causal_conv1dx") is None


def test_uninstall_and_idempotent_install():
    alias.uninstall_causal_conv1d_alias()
    a = cc1d.install_causal_conv1d_alias()
    b = cc1d.install_causal_conv1d_alias()
    assert a is b and sum(isinstance(f, alias.CausalConv1dFinder) for f in sys.meta_path) == 1
    cc1d.uninstall_causal_conv1d_alias()
    assert not alias.is_installed() and "causal_conv1d" not in sys.modules
    try:
        real = importlib.util.find_spec("causal_conv1d")
    except ValueError:
        real = None
    assert real is None or real.origin != "cc1d.alias"


def test_unknown_activation_raises_like_the_peer(installed):
    import causal_conv1d
    from causal_conv1d.causal_conv1d_interface import causal_conv1d_ref, causal_conv1d_update_ref
    for fn, args in ((causal_conv1d.causal_conv1d_fn, (None, None)),
                     (causal_conv1d.causal_conv1d_update, (None, None, None)),
                     (causal_conv1d_ref, (None, None)), (causal_conv1d_update_ref, (None, None, None))):
        with pytest.raises(NotImplementedError, match="activation: expected None, 'silu' or 'swish', got 'relu'"):
            fn(*args, activation="relu")


def test_missing_cc1d_function_is_named():
    # A cc1d without one of the functions the alias forwards to says which one is missing.
    with pytest.raises(RuntimeError, match=r"cc1d.no_such_function is not in this cc1d build"):
        cc1d.compat._cc1d_function("no_such_function")


def _run(code_or_args, env_extra=None, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != alias.ENV_SWITCH}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-P", *code_or_args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


PROBE = ("import importlib.util; print(importlib.util.find_spec('causal_conv1d') is not None); "
         "import causal_conv1d; print(causal_conv1d.__cc1d__)")


def test_environment_switch_installs_at_import_cc1d():
    on = _run(["-c", "import cc1d; " + PROBE], {alias.ENV_SWITCH: "1"})
    assert on.returncode == 0, on.stderr
    assert on.stdout.split() == ["True", "True"]
    off = _run(["-c", "import cc1d, cc1d.alias; print(cc1d.alias.is_installed())"], {alias.ENV_SWITCH: "0"})
    assert off.returncode == 0 and off.stdout.split() == ["False"], off.stderr


def test_runner_runs_a_script_and_a_module(tmp_path):
    script = tmp_path / "model_code.py"
    script.write_text(textwrap.dedent("""
        import sys
        from causal_conv1d.cpp_functions import causal_conv1d_fwd_function
        import causal_conv1d
        print(causal_conv1d.__cc1d__, sys.argv[1:])
    """))
    r = _run(["-m", "cc1d.alias", str(script), "a", "b"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True ['a', 'b']"
    r = _run(["-m", "cc1d.alias", "-m", "model_code", "c"], cwd=tmp_path,
             env_extra={"PYTHONPATH": pythonpath_with(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True ['c']"


# ---- the plain-PyTorch references (CPU, float64) ------------------------------------

def _full_conv(x, weight, bias, silu):
    from cc1d.reference import causal_conv1d_ref
    return causal_conv1d_ref(x, weight, bias, activation="silu" if silu else None)


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("state_len", [3, 7])
def test_update_ref_steps_equal_the_full_convolution(installed, silu, state_len):
    torch = pytest.importorskip("torch")
    from causal_conv1d.causal_conv1d_interface import causal_conv1d_update_ref
    g = torch.Generator().manual_seed(state_len)
    batch, dim, seqlen, width = 3, 5, 11, 4
    x = torch.randn(batch, dim, seqlen, generator=g, dtype=torch.float64)
    weight = torch.randn(dim, width, generator=g, dtype=torch.float64)
    bias = torch.randn(dim, generator=g, dtype=torch.float64)
    want = _full_conv(x, weight, bias, silu)
    state = torch.zeros(batch, dim, state_len, dtype=torch.float64)
    got = torch.stack([causal_conv1d_update_ref(x[:, :, t], state, weight, bias, "silu" if silu else None)
                       for t in range(seqlen)], dim=-1)
    assert torch.equal(got.isnan(), torch.zeros_like(got, dtype=torch.bool))
    assert ((got - want).norm() / want.norm()).item() < 1e-12
    # the state holds the last state_len inputs
    assert torch.equal(state[..., -min(state_len, seqlen):], x[..., -min(state_len, seqlen):])
    # circular buffer: same outputs, written at cache_seqlens % state_len
    cstate = torch.zeros(batch, dim, state_len, dtype=torch.float64)
    outs = []
    for t in range(seqlen):
        seqlens = torch.full((batch,), t, dtype=torch.int32)
        outs.append(causal_conv1d_update_ref(x[:, :, t:t + 1], cstate, weight, bias, "silu" if silu else None,
                                             cache_seqlens=seqlens))
    got = torch.cat(outs, dim=-1)
    assert ((got - want).norm() / want.norm()).item() < 1e-12
    assert torch.equal(cstate[..., (seqlen - 1) % state_len], x[..., seqlen - 1])


def test_varlen_states_ref(installed):
    torch = pytest.importorskip("torch")
    from causal_conv1d.causal_conv1d_varlen import causal_conv1d_varlen_states_ref
    lens = [5, 1, 0, 9]
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    x = torch.randn(int(cu[-1]), 6, dtype=torch.float64)
    got = causal_conv1d_varlen_states_ref(x, cu, 3)
    assert got.shape == (4, 6, 3) and got.stride(1) == 1
    for i, n in enumerate(lens):
        end = int(cu[i + 1])
        for j in range(3):  # state slot j holds token end-3+j of this sequence, else 0
            t = end - 3 + j
            want = x[t] if t >= int(cu[i]) else torch.zeros(6, dtype=torch.float64)
            assert torch.equal(got[i, :, j], want)
