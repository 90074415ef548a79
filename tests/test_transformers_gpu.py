"""A real client: Hugging Face transformers' Mamba with cc1d installed as causal_conv1d
(marker: gpu; skips without transformers or a GPU; builds a small random model from a
config, no downloads).

transformers 5.x loads causal_conv1d through ``lazy_load_kernel("causal-conv1d")``:
without the ``kernels`` package that checks ``is_causal_conv1d_available()``
(importlib.util.find_spec) and imports ``causal_conv1d``, i.e. cc1d's alias. Its
fast path (``MambaMixer.cuda_kernels_forward``, which calls causal_conv1d_fn for
prefill and causal_conv1d_update for decode) is taken only when mamba_ssm's
kernels are present too. mamba_ssm is not installed on the test machine, so this
test provides mamba_ssm's selective_scan_fn / selective_state_update as plain
PyTorch recurrences (defined here) through transformers' own kernel mapping; the
conv is cc1d's. The model runs in eval mode with gradients on, so the fast path
takes its unfused branch (the fused training branch, mamba_inner_fn, is mamba_ssm's
own kernel and has no stand-in here). The comparison is against transformers' slow
path (nn.Conv1d and its own sequential scan) on the same weights.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import sys
import types

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
transformers = pytest.importorskip("transformers")

import torch.nn.functional as F  # noqa: E402

import cc1d  # noqa: E402

from fwd_cases import rel_l2  # noqa: E402

pytestmark = pytest.mark.gpu

modeling_mamba = importlib.import_module("transformers.models.mamba.modeling_mamba")
# Two ways transformers 5.x binds causal_conv1d: lazy_load_kernel at call time (early 5.x),
# or, from about 5.15, use_kernel_func_from_hub_with_fallback at import time, which imports
# the package while modeling_mamba is imported (so the module is re-imported after the alias
# is installed; see the "decorator" tests at the end).
LAZY = hasattr(modeling_mamba, "lazy_load_kernel")
DECORATED = hasattr(modeling_mamba, "use_kernel_func_from_hub_with_fallback")
if not (LAZY or DECORATED):
    pytest.skip(f"transformers {transformers.__version__}: modeling_mamba binds causal_conv1d in a way this "
                "test does not know", allow_module_level=True)


def _counting(real, name: str, calls: dict):
    """real, counting its calls in calls[name], with real's signature: transformers (>= ~5.15)
    reads the implementation's signature to decide which arguments to pass."""
    @functools.wraps(real)
    def counted(*args, **kwargs):
        calls[name] += 1
        return real(*args, **kwargs)
    return counted


# ---- mamba_ssm stand-ins (plain PyTorch, float32 state) --------------------------------

def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      return_last_state=False):
    """u, delta, z (batch, dim, seqlen); A (dim, n); B, C (batch, n, seqlen); D, delta_bias (dim)."""
    dt = delta.float()
    if delta_bias is not None:
        dt = dt + delta_bias.float()[None, :, None]
    if delta_softplus:
        dt = F.softplus(dt)
    batch, dim, seqlen = u.shape
    h = torch.zeros(batch, dim, A.shape[1], device=u.device, dtype=torch.float32)
    ys = []
    for t in range(seqlen):
        h = torch.exp(dt[:, :, t, None] * A) * h + dt[:, :, t, None] * B[:, None, :, t].float() * u[:, :, t, None].float()
        ys.append((h * C[:, None, :, t].float()).sum(-1))
    y = torch.stack(ys, dim=-1)
    if D is not None:
        y = y + u.float() * D.float()[:, None]
    if z is not None:
        y = y * F.silu(z.float())
    y = y.to(u.dtype)
    return (y, h) if return_last_state else y


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """One decode step: state (batch, dim, n) updated in place; x, dt, z (batch, dim); B, C (batch, n)."""
    dt = dt.float() + (0 if dt_bias is None else dt_bias.float())
    if dt_softplus:
        dt = F.softplus(dt)
    new = torch.exp(dt[..., None] * A) * state.float() + dt[..., None] * B[:, None, :].float() * x[..., None].float()
    state.copy_(new)
    y = (new * C[:, None, :].float()).sum(-1)
    if D is not None:
        y = y + D.float() * x.float()
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype)


def mamba_inner_fn(*args, **kwargs):
    raise AssertionError("the fused training kernel (mamba_inner_fn) has no stand-in: run the model in eval mode")


def _kernel_mapping() -> dict:
    """transformers' cache of loaded kernels (lazy_load_kernel's default mapping)."""
    param = inspect.signature(modeling_mamba.lazy_load_kernel).parameters.get("mapping")
    if param is not None and isinstance(param.default, dict):
        return param.default
    hub = importlib.import_module("transformers.integrations.hub_kernels")
    mapping = getattr(hub, "_KERNEL_MODULE_MAPPING", None)
    if not isinstance(mapping, dict):
        pytest.skip(f"transformers {transformers.__version__}: no kernel mapping to place the mamba_ssm stand-ins in")
    return mapping


@pytest.fixture
def cc1d_as_causal_conv1d(monkeypatch):
    """Alias installed, mamba_ssm stand-ins in transformers' kernel mapping, calls counted."""
    if not LAZY:
        pytest.skip(f"transformers {transformers.__version__} binds kernels at import (decorator tests)")
    from transformers.utils import import_utils
    mapping = _kernel_mapping()
    saved = dict(mapping)
    cc1d.uninstall_causal_conv1d_alias()
    module = cc1d.install_causal_conv1d_alias()
    calls = {"causal_conv1d_fn": 0, "causal_conv1d_update": 0}
    for name in calls:
        real = getattr(module, name)

        counted = _counting(real, name, calls)
        monkeypatch.setattr(module, name, counted)
    fake_ssm = types.ModuleType("mamba_ssm")
    fake_ssm.selective_scan_fn = selective_scan_fn
    fake_ssm.selective_state_update = selective_state_update
    fake_ssm.mamba_inner_fn = mamba_inner_fn
    mapping.pop("causal-conv1d", None)
    mapping["mamba-ssm"] = fake_ssm
    cache_clear = getattr(import_utils.is_causal_conv1d_available, "cache_clear", None)
    if cache_clear:
        cache_clear()  # it is lru_cached: computed again now that find_spec finds the alias
    if getattr(import_utils, "is_kernels_available", lambda: False)():
        # with the `kernels` package transformers asks the Hub instead of importing causal_conv1d
        # (no network here): hand it the import's result directly
        mapping["causal-conv1d"] = module
    loaded = modeling_mamba.lazy_load_kernel("causal-conv1d")
    assert loaded is sys.modules["causal_conv1d"] and getattr(loaded, "__cc1d__", False), \
        f"transformers loaded {loaded!r} for causal-conv1d, not cc1d's alias"
    yield calls
    mapping.clear()
    mapping.update(saved)
    if cache_clear:
        cache_clear()
    cc1d.uninstall_causal_conv1d_alias()


def _model():
    config = transformers.MambaConfig(vocab_size=101, hidden_size=48, state_size=8, num_hidden_layers=2,
                                      conv_kernel=4, expand=2, use_conv_bias=True, use_bias=False,
                                      eos_token_id=None, pad_token_id=0, bos_token_id=None)
    torch.manual_seed(0)
    model = transformers.MambaForCausalLM(config).to("cuda", torch.float32).eval()
    with torch.no_grad():  # non-zero conv bias, so the bias path is compared too
        for layer in model.backbone.layers:
            layer.mixer.conv1d.bias.normal_(0, 0.1)
    return model


def _forward_backward(model, input_ids):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, labels=input_ids, use_cache=False)
    out.loss.backward()
    return out.logits.detach(), {k: p.grad.detach().clone() for k, p in model.named_parameters()
                                 if p.grad is not None}


def test_mamba_forward_backward_through_cc1d_matches_the_slow_path(cc1d_as_causal_conv1d, monkeypatch):
    calls = cc1d_as_causal_conv1d
    model = _model()
    assert modeling_mamba.causal_conv1d_fn is sys.modules["causal_conv1d"].causal_conv1d_fn
    input_ids = torch.randint(1, 101, (3, 45), device="cuda")
    logits, grads = _forward_backward(model, input_ids)
    assert calls["causal_conv1d_fn"] == 2, calls  # one per layer: the fast path ran on cc1d
    with monkeypatch.context() as m:
        m.setattr(modeling_mamba, "causal_conv1d_fn", None)  # fast path off: transformers' slow_forward
        want_logits, want_grads = _forward_backward(model, input_ids)
    assert calls["causal_conv1d_fn"] == 2, calls
    assert not torch.isnan(logits).any()
    assert rel_l2(logits, want_logits) < 1e-4
    assert set(grads) == set(want_grads) and any("conv1d" in k for k in grads)
    for k in want_grads:
        assert not torch.isnan(grads[k]).any(), k
        assert rel_l2(grads[k], want_grads[k]) < 1e-3, k


def test_mamba_generate_decodes_through_causal_conv1d_update(cc1d_as_causal_conv1d, monkeypatch):
    if not hasattr(cc1d, "causal_conv1d_update"):
        pytest.skip("cc1d.causal_conv1d_update is not in this build (the decode issue adds it)")
    calls = cc1d_as_causal_conv1d
    model = _model()
    input_ids = torch.randint(1, 101, (2, 13), device="cuda")
    kwargs = dict(max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True)
    fast = model.generate(input_ids, **kwargs)
    # prefill through causal_conv1d_fn, then one causal_conv1d_update per layer and new token
    assert calls["causal_conv1d_fn"] >= 2 and calls["causal_conv1d_update"] >= 2 * 5, calls
    with monkeypatch.context() as m:
        m.setattr(modeling_mamba, "causal_conv1d_fn", None)
        slow = model.generate(input_ids, **kwargs)
    assert torch.equal(fast.sequences, slow.sequences)
    for got, want in zip(fast.scores, slow.scores):
        assert not torch.isnan(got).any()
        assert rel_l2(got, want) < 1e-4


# ---- transformers >= ~5.15: kernels bound by decorators when modeling_mamba is imported ------

def _reimported_modeling_mamba(model: str = "mamba"):
    for name in [n for n in sys.modules if n.startswith("transformers.models.mamba")]:
        del sys.modules[name]
    return importlib.import_module(f"transformers.models.{model}.modeling_{model}")


@pytest.fixture
def decorated_pair(monkeypatch):
    yield from _decorated_pair(monkeypatch, "mamba")


@pytest.fixture
def decorated_pair_mamba2(monkeypatch):
    yield from _decorated_pair(monkeypatch, "mamba2")


def _decorated_pair(monkeypatch, model: str):
    """(cc1d's modeling_<model>, transformers' own, call counts): the module imported once with
    cc1d installed as causal_conv1d (counting its calls) and once without any causal_conv1d,
    so its decorators fall back to transformers' PyTorch functions."""
    if not DECORATED:
        pytest.skip(f"transformers {transformers.__version__} has no use_kernel_func_from_hub_with_fallback")
    saved = {n: m for n, m in sys.modules.items() if n.startswith("transformers.models.mamba")}
    cc1d.uninstall_causal_conv1d_alias()
    module = cc1d.install_causal_conv1d_alias()
    calls = {"causal_conv1d_fn": 0, "causal_conv1d_update": 0}
    interface = importlib.import_module("causal_conv1d.causal_conv1d_interface")
    for name in calls:
        real = getattr(module, name)

        counted = _counting(real, name, calls)
        # both places a decorator may resolve it from (the package, or its interface module)
        monkeypatch.setattr(module, name, counted)
        monkeypatch.setattr(interface, name, counted)
    try:
        with_cc1d = _reimported_modeling_mamba(model)
        if not hasattr(with_cc1d, "use_kernel_func_from_hub_with_fallback"):
            pytest.skip(f"transformers {transformers.__version__}: modeling_{model} binds no kernels by decorator")
        cc1d.uninstall_causal_conv1d_alias()
        for n in [n for n in sys.modules if n == "causal_conv1d" or n.startswith("causal_conv1d.")]:
            del sys.modules[n]
        own = _reimported_modeling_mamba(model)
        yield with_cc1d, own, calls
    finally:
        cc1d.uninstall_causal_conv1d_alias()
        for name in [n for n in sys.modules if n.startswith("transformers.models.mamba")]:
            del sys.modules[name]
        sys.modules.update(saved)


def _config():
    return transformers.MambaConfig(vocab_size=101, hidden_size=48, state_size=8, num_hidden_layers=2,
                                    conv_kernel=4, expand=2, use_conv_bias=True, use_bias=False,
                                    eos_token_id=None, pad_token_id=0, bos_token_id=None)


def _twin_models(with_cc1d, own):
    """The same random weights in a model of each module."""
    torch.manual_seed(0)
    a = with_cc1d.MambaForCausalLM(_config()).to("cuda", torch.float32).eval()
    with torch.no_grad():
        for layer in a.backbone.layers:
            layer.mixer.conv1d.bias.normal_(0, 0.1)
    b = own.MambaForCausalLM(_config()).to("cuda", torch.float32).eval()
    b.load_state_dict(a.state_dict())
    return a, b


def test_decorated_mamba_forward_backward_through_cc1d(decorated_pair):
    with_cc1d, own, calls = decorated_pair
    a, b = _twin_models(with_cc1d, own)
    input_ids = torch.randint(1, 101, (3, 45), device="cuda")
    logits, grads = _forward_backward(a, input_ids)
    assert calls["causal_conv1d_fn"] >= 2, (
        f"transformers {transformers.__version__} did not call causal_conv1d_fn ({calls}): its MambaMixer "
        f"takes the kernel path only with other kernels present")
    n = dict(calls)
    want_logits, want_grads = _forward_backward(b, input_ids)
    assert calls == n, "the model of transformers' own module called cc1d"
    assert not torch.isnan(logits).any()
    assert rel_l2(logits, want_logits) < 1e-4
    assert set(grads) == set(want_grads) and any("conv1d" in k for k in grads)
    for k in want_grads:
        assert not torch.isnan(grads[k]).any(), k
        assert rel_l2(grads[k], want_grads[k]) < 1e-3, k


def test_decorated_mamba_generate_through_causal_conv1d_update(decorated_pair):
    with_cc1d, own, calls = decorated_pair
    a, b = _twin_models(with_cc1d, own)
    input_ids = torch.randint(1, 101, (2, 13), device="cuda")
    kwargs = dict(max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True)
    fast = a.generate(input_ids, **kwargs)
    assert calls["causal_conv1d_fn"] >= 2 and calls["causal_conv1d_update"] >= 2 * 5, calls
    slow = b.generate(input_ids, **kwargs)
    assert torch.equal(fast.sequences, slow.sequences)
    for got, want in zip(fast.scores, slow.scores):
        assert not torch.isnan(got).any()
        assert rel_l2(got, want) < 1e-4


def test_decorated_conv_calls_match_a_float64_reference(decorated_pair, monkeypatch):
    """Each path's causal_conv1d_fn, as transformers calls it inside the model, against
    cc1d.causal_conv1d_ref in float64: says which side a model-level difference comes from."""
    with_cc1d, own, calls = decorated_pair
    a, b = _twin_models(with_cc1d, own)
    seen = {}
    for tag, module in (("cc1d", with_cc1d), ("transformers", own)):
        real = module.causal_conv1d_fn

        def recording(x, weight, bias=None, *args, _real=real, _tag=tag, **kwargs):
            out = _real(x, weight, bias, *args, **kwargs)
            seen.setdefault(_tag, (x.detach().clone(), weight.detach().clone(),
                                   None if bias is None else bias.detach().clone(), args, dict(kwargs),
                                   out.detach().clone(), tuple(x.stride())))
            return out
        monkeypatch.setattr(module, "causal_conv1d_fn", recording)
    input_ids = torch.randint(1, 101, (3, 45), device="cuda")
    with torch.no_grad():
        a(input_ids=input_ids, use_cache=False)
        b(input_ids=input_ids, use_cache=False)
    assert set(seen) == {"cc1d", "transformers"}, seen.keys()
    errors = {}
    for tag, (x, w, bias, args, kwargs, out, strides) in seen.items():
        act = kwargs.get("activation")
        want = cc1d.causal_conv1d_ref(x.double(), w.double(), None if bias is None else bias.double(),
                                      activation=act)
        errors[tag] = (rel_l2(out, want), strides, args, {k: v for k, v in kwargs.items() if k != "activation"}, act)
    assert errors["cc1d"][0] < 1e-5, f"cc1d's conv inside transformers' Mamba: {errors}"
    assert errors["transformers"][0] < 1e-5, f"transformers' own conv: {errors}"


# ---- Mamba-2 (its mixer calls causal_conv1d_fn / causal_conv1d_update the same way) ----------

def _mamba2_twins(with_cc1d, own):
    config = dict(vocab_size=101, hidden_size=64, state_size=16, num_hidden_layers=2, conv_kernel=4, expand=2,
                  num_heads=8, head_dim=16, n_groups=1, chunk_size=16, use_conv_bias=True, use_bias=False,
                  eos_token_id=None, pad_token_id=0, bos_token_id=None)
    torch.manual_seed(0)
    a = with_cc1d.Mamba2ForCausalLM(transformers.Mamba2Config(**config)).to("cuda", torch.float32).eval()
    with torch.no_grad():
        for layer in a.backbone.layers:
            layer.mixer.conv1d.bias.normal_(0, 0.1)
    b = own.Mamba2ForCausalLM(transformers.Mamba2Config(**config)).to("cuda", torch.float32).eval()
    b.load_state_dict(a.state_dict())
    return a, b


def test_decorated_mamba2_forward_backward_and_generate_through_cc1d(decorated_pair_mamba2):
    with_cc1d, own, calls = decorated_pair_mamba2
    a, b = _mamba2_twins(with_cc1d, own)
    input_ids = torch.randint(1, 101, (3, 45), device="cuda")
    logits, grads = _forward_backward(a, input_ids)
    assert calls["causal_conv1d_fn"] >= 2, (
        f"transformers {transformers.__version__}'s Mamba2 did not call causal_conv1d_fn ({calls})")
    want_logits, want_grads = _forward_backward(b, input_ids)
    assert not torch.isnan(logits).any()
    assert rel_l2(logits, want_logits) < 1e-4
    assert set(grads) == set(want_grads) and any("conv1d" in k for k in grads)
    for k in want_grads:
        assert not torch.isnan(grads[k]).any(), k
        assert rel_l2(grads[k], want_grads[k]) < 1e-3, k
    prompt = torch.randint(1, 101, (2, 13), device="cuda")
    kwargs = dict(max_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True)
    before = calls["causal_conv1d_update"]
    fast = a.generate(prompt, **kwargs)
    assert calls["causal_conv1d_update"] - before >= 2 * 5, calls
    slow = b.generate(prompt, **kwargs)
    assert torch.equal(fast.sequences, slow.sequences)
    for got, want in zip(fast.scores, slow.scores):
        assert rel_l2(got, want) < 1e-4
