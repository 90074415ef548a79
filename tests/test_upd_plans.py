"""The decode update's per-signature plans (cc1d.update), without a GPU.

An eager ``causal_conv1d_update`` whose tensors (type, shape, strides, dtype, device)
and pad_slot_id match an earlier valid call's skips the Python checks and the argument
building: its plan holds what they decided. As test_plans.py does for the forward, these
tests run the API on CPU tensors with the runtime replaced by a recorder (which still
runs the runtime's own checks of every call, through explain_upd) and check that

* a planned call sends what the per-call path sends (sizes, strides, pad_slot_id, dtypes,
  activation, pointers) and returns out allocated as that path allocates it, for every
  accepted row of test_bad_input_torch.py's update table;
* after valid calls, every CPU row that must fail still fails with the same error, and a
  call differing in one thing from a memoised signature is checked afresh;
* the key holds every field it must, and the memo is bounded.
"""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

import cc1d  # noqa: E402
from cc1d import ops, update  # noqa: E402
from cc1d._runtime import runtime  # noqa: E402

import test_bad_input_torch as bad  # noqa: E402  (the tables of rows)


class Recorder:
    """The runtime's update surface: checks each launch as the runtime does (explain_upd
    for sm_90: the same checks, no device) and records it as (ptrs, sizes, strides,
    pad_slot_id, x_dtype, w_dtype, silu), launching nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.plans = 0
        self.real = runtime()

    def upd(self, ptrs, sizes, strides, pad_slot_id, x_dtype, w_dtype, silu, stream) -> None:
        self.real.explain_upd(ptrs, sizes, strides, pad_slot_id, x_dtype, w_dtype, silu, 0, "sm_90")
        self.calls.append((tuple(ptrs), tuple(sizes), tuple(strides), pad_slot_id, x_dtype, w_dtype, silu))

    def UpdPlan(self, sizes, strides, pad_slot_id, x_dtype, w_dtype, silu):
        self.plans += 1
        rec = self

        class Plan:
            def launcher(self):
                def launch(*ptrs_and_stream):
                    assert len(ptrs_and_stream) == 9
                    rec.upd(ptrs_and_stream[:8], sizes, strides, pad_slot_id, x_dtype, w_dtype, silu, 0)
                return launch
        return Plan()


@pytest.fixture
def rec(monkeypatch):
    """The recorder in place of the runtime, CPU tensors taken as a device's, an empty memo."""
    r = Recorder()
    real_validate = update._validate

    def validate(*args, require_device=True):
        return real_validate(*args, require_device=False)
    monkeypatch.setattr(update, "runtime", lambda: r)
    monkeypatch.setattr(update, "_validate", validate)
    for module in (update, ops):  # ops: the plans' launch (_launch_planned)
        monkeypatch.setattr(module, "_current_device", lambda: None)  # a CPU tensor's device.index
    monkeypatch.setattr(ops, "_raw_stream", lambda index: 0)
    monkeypatch.setattr(update, "_stream_handle", lambda device: 0)
    update._UPD_PLANS.clear()
    yield r
    update._UPD_PLANS.clear()  # its plans launch on the recorder: no later test may find them


_ARGS = ("x", "conv_state", "weight", "bias", "cache_seqlens", "conv_state_indices", "num_accepted_tokens")


def _per_call(rec: Recorder, kw: dict):
    """What the per-call path (update._update_impl, no plan) sends and returns for kw."""
    silu = update._activation(kw.get("activation"))
    out = update._update_impl(kw["x"], kw["conv_state"], kw["weight"], kw.get("bias"), silu,
                              kw.get("cache_seqlens"), kw.get("conv_state_indices"), kw.get("num_accepted_tokens"),
                              kw.get("pad_slot_id", -1))
    return rec.calls.pop(), out


def _layout_of(t: torch.Tensor) -> tuple:
    return type(t), t.shape, t.stride(), t.dtype, t.device


def _check_call(got: tuple, want: tuple, out, want_out) -> None:
    assert got[1:] == want[1:], "sizes, strides, pad_slot_id, dtypes and activation as the per-call path sends them"
    assert got[0][:7] == want[0][:7], "x, weight, bias, conv_state, cache_seqlens, indices, accepted tokens"
    assert got[0][7] == out.data_ptr()
    assert _layout_of(out) == _layout_of(want_out), "out is allocated as the per-call path allocates it"


def _rows(accepted: bool):
    return [pytest.param(r, id=r.name) for r in bad.UPD_ROWS if r.cpu and (r.exc is bad.ACCEPTED) == accepted]


@pytest.mark.parametrize("row", _rows(accepted=True))
def test_a_planned_update_sends_what_the_per_call_path_sends(rec, row):
    kw = row.mutate(bad.upd_inputs("cpu"), "cpu")
    want, want_out = _per_call(rec, kw)
    for attempt in ("first call: plans", "second call: the memo's plan"):
        out = cc1d.causal_conv1d_update(**kw)
        _check_call(rec.calls.pop(), want, out, want_out)
        assert len(update._UPD_PLANS) == 1, attempt
    assert rec.plans == 2  # one per activation, made once


def _expect(row, kw):
    """The error's message, its addresses masked (an overlap names the buffers' spans)."""
    with pytest.raises(row.exc) as info:
        cc1d.causal_conv1d_update(**kw)
    msg = str(info.value)
    assert f"{row.arg}:" in msg or f"{row.arg} " in msg, f"message does not name {row.arg}: {msg}"
    assert row.words in msg, msg
    return re.sub(r"0x[0-9a-f]+", "0x...", msg)


def _passes_python_checks(kw: dict) -> bool:
    """Whether only the runtime refuses kw (an overlap of buffers): the signature is then a valid
    one to plan, and each call's pointers are what fails."""
    try:
        update._validate(*(kw.get(n) for n in _ARGS), kw.get("pad_slot_id", -1))
        update._activation(kw.get("activation"))
    except (TypeError, ValueError):
        return False
    return True


@pytest.mark.parametrize("row", _rows(accepted=True))
def test_the_compiled_graphs_op_launches_through_a_plan(rec, row):
    """torch.compile's op (cc1d::causal_conv1d_update, run here as the graph runs it) goes
    through the eager plans, so a compiled graph launches the plan's fixed kernel, the one the
    tuner ranked: one plan for the signature, what the per-call path sends."""
    kw = row.mutate(bad.upd_inputs("cpu"), "cpu")
    want, want_out = _per_call(rec, kw)
    args = (kw["x"], kw["conv_state"], kw["weight"], kw.get("bias"), update._activation(kw.get("activation")),
            kw.get("cache_seqlens"), kw.get("conv_state_indices"), kw.get("num_accepted_tokens"),
            kw.get("pad_slot_id", -1))
    for attempt in ("first run: plans", "second run: the memo's plan"):
        out = update._update_op(*args)
        _check_call(rec.calls.pop(), want, out, want_out)
        assert len(update._UPD_PLANS) == 1, attempt
    assert rec.plans == 2  # one per activation, made once


@pytest.mark.parametrize("row", _rows(accepted=False))
def test_a_bad_update_fails_alike_after_valid_calls(rec, row):
    before = _expect(row, row.mutate(bad.upd_inputs("cpu"), "cpu"))
    update._UPD_PLANS.clear()
    cc1d.causal_conv1d_update(**bad.upd_inputs("cpu"))
    cc1d.causal_conv1d_update(**bad.upd_inputs("cpu"))
    assert len(update._UPD_PLANS) == 1
    for _ in range(2):  # the second time through a plan where the signature passed the checks
        assert _expect(row, row.mutate(bad.upd_inputs("cpu"), "cpu")) == before
    runtime_only = _passes_python_checks(row.mutate(bad.upd_inputs("cpu"), "cpu"))
    assert len(update._UPD_PLANS) == (2 if runtime_only else 1), "a call failing the Python checks adds no plan"


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


def _changes():
    """(name, change of a valid call's keywords, exception or None for accepted)."""
    return [
        ("pad_slot_id-true-after-1", lambda k: dict(k, pad_slot_id=True), TypeError),
        ("pad_slot_id-other", lambda k: dict(k, pad_slot_id=7), None),
        ("pad_slot_id-float", lambda k: dict(k, pad_slot_id=1.0), TypeError),
        ("pad_slot_id-list", lambda k: dict(k, pad_slot_id=[1]), TypeError),
        ("x-dtype", lambda k: dict(k, x=k["x"].double()), TypeError),
        ("x-2d", lambda k: dict(k, x=k["x"][:, :, 0].contiguous()), None),
        ("x-list", lambda k: dict(k, x=k["x"].tolist()), TypeError),
        ("x-meta", lambda k: dict(k, x=k["x"].to("meta")), ValueError),
        ("conv_state-contiguous", lambda k: dict(k, conv_state=k["conv_state"].contiguous()), None),
        ("conv_state-dtype", lambda k: dict(k, conv_state=k["conv_state"].float()), TypeError),
        ("conv_state-meta", lambda k: dict(k, conv_state=k["conv_state"].to("meta")), ValueError),
        ("weight-bf16-bias-f32", lambda k: dict(k, weight=k["weight"].bfloat16()), TypeError),
        ("bias-absent", lambda k: {n: v for n, v in k.items() if n != "bias"}, None),
        ("bias-meta", lambda k: dict(k, bias=k["bias"].to("meta")), ValueError),
        ("indices-added", lambda k: dict(k, conv_state_indices=_i32([4, 0, 2])), None),
        ("indices-int64", lambda k: dict(k, conv_state_indices=_i32([4, 0, 2]).long()), TypeError),
        ("seqlens-with-accepted-tokens", lambda k: dict(k, cache_seqlens=_i32([4, 0, 2]),
                                                       num_accepted_tokens=_i32([1, 1, 1])), ValueError),
        ("activation-relu", lambda k: dict(k, activation="relu"), ValueError),
        ("activation-none", lambda k: dict(k, activation=None), None),
    ]


@pytest.mark.parametrize("name, change, exc", _changes(), ids=[c[0] for c in _changes()])
def test_a_changed_signature_is_checked_and_planned_afresh(rec, name, change, exc):
    """Valid calls memoise a signature (here with pad_slot_id=1); a call differing in one thing
    must not use its plan: it fails as it fails alone, or sends what the per-call path sends."""
    valid = dict(bad.upd_inputs("cpu"), pad_slot_id=1)
    kw = change(dict(valid))
    if exc is not None:
        with pytest.raises(exc) as info:
            cc1d.causal_conv1d_update(**kw)
        alone = str(info.value)
        cc1d.causal_conv1d_update(**valid)
        cc1d.causal_conv1d_update(**valid)
        with pytest.raises(exc) as info:
            cc1d.causal_conv1d_update(**kw)
        assert str(info.value) == alone
        assert len(update._UPD_PLANS) == 1
        return
    cc1d.causal_conv1d_update(**valid)
    cc1d.causal_conv1d_update(**valid)
    rec.calls.clear()
    want, want_out = _per_call(rec, kw)
    out = cc1d.causal_conv1d_update(**kw)
    _check_call(rec.calls.pop(), want, out, want_out)
    same_key = name == "activation-none"  # the activation is checked on every call, not keyed
    assert len(update._UPD_PLANS) == (1 if same_key else 2)


def test_every_field_of_the_signature_is_in_the_key():
    kw = dict(bad.upd_inputs("cpu"), cache_seqlens=_i32([0, 1, 2]), conv_state_indices=_i32([4, 0, 2]))
    kw.pop("activation")

    def key(k, pad=-1):
        return update._upd_key(*(k.get(n) for n in _ARGS), pad)
    base = key(kw)
    assert key(kw, True) != key(kw, 1) and key(kw, 1) != key(kw, 1.0), "pad_slot_id's type is keyed"
    assert key(kw, 5) != base
    for name in _ARGS:
        t = kw.get(name)
        if t is None:
            continue
        variants = [t.as_subclass(bad_sub()), t.to("meta"), t[:1],
                    t.double() if t.is_floating_point() else t.long()]
        if t.dim() >= 2:  # the other layout
            variants.append(t.contiguous() if not t.is_contiguous() else
                            t.transpose(-1, -2).contiguous().transpose(-1, -2))
        for variant in variants:
            assert key(dict(kw, **{name: variant})) != base, (name, variant.shape, variant.stride())
        if name not in ("x", "conv_state", "weight"):
            assert key(dict(kw, **{name: None})) != base, name
    # cache_seqlens alone and conv_state_indices alone are told apart
    one = dict(kw, conv_state_indices=None)
    other = dict(kw, cache_seqlens=None, conv_state_indices=kw["cache_seqlens"])
    assert key(one) != key(other)


def bad_sub():
    class Sub(torch.Tensor):
        pass
    return Sub


def test_the_memo_is_bounded(rec, monkeypatch):
    monkeypatch.setattr(ops, "_MAX_PLANS", 8)
    for n in range(1, 30):
        cc1d.causal_conv1d_update(torch.randn(1, n), torch.randn(1, n, 3), torch.randn(n, 4))
        assert len(update._UPD_PLANS) <= 8


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("row", [pytest.param(r, id=r.name) for r in bad.UPD_ROWS if r.exc is not bad.ACCEPTED])
def test_on_the_gpu_a_bad_update_fails_alike_after_valid_calls(row):
    """Every failing row of the update table, the device checks included, with the real runtime:
    as it fails alone, so it fails after valid calls planned the valid signature, and again."""
    update._UPD_PLANS.clear()
    before = _expect(row, row.mutate(bad.upd_inputs("cuda"), "cuda"))
    cc1d.causal_conv1d_update(**bad.upd_inputs("cuda"))
    cc1d.causal_conv1d_update(**bad.upd_inputs("cuda"))
    for _ in range(2):
        assert _expect(row, row.mutate(bad.upd_inputs("cuda"), "cuda")) == before
