"""The eager fast path's per-signature plans (cc1d.ops, cc1d.backward), without a GPU.

A call whose tensors have the signature (type, shape, strides, dtype, device) of an
earlier valid call skips the checks and the argument building: its plan holds what
they decided. These tests run the PyTorch API on CPU tensors with the runtime
replaced by a recorder and the device requirement off (torch needed, no GPU), and
check that

* a planned call sends the runtime what the per-call path sends (sizes, strides,
  dtypes, activation, pointers) and allocates its outputs as that path does, for
  layouts, dtypes and optional arguments, forward, backward and through autograd;
* after a valid call, a call that must fail still fails with the same error: every
  CPU row of test_bad_input_torch.py, and a change of dtype, strides, device, type,
  activation or optional argument against a memoised signature;
* the memos are bounded.
"""
from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

import cc1d  # noqa: E402
from cc1d import backward, ops  # noqa: E402

import test_bad_input_torch as bad  # noqa: E402  (the tables of rows)

B, D, L, W = 2, 16, 37, 4


class Recorder:
    """The runtime's call surface: records each launch as (op, ptrs, sizes, strides,
    x_dtype, w_dtype, silu) with sizes and strides as tuples, launching nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.plans = 0

    def fwd(self, ptrs, sizes, strides, x_dtype, w_dtype, silu, stream) -> None:
        self.calls.append(("fwd", tuple(ptrs), tuple(sizes), tuple(strides), x_dtype, w_dtype, silu))

    def bwd_workspace_bytes(self, *args, **kwargs) -> int:
        return 4096

    def bwd(self, ptrs, sizes, strides, x_dtype, w_dtype, silu, workspace_bytes, stream) -> None:
        self.calls.append(("bwd", tuple(ptrs)[:11], tuple(sizes), tuple(strides), x_dtype, w_dtype, silu))

    def FwdPlan(self, sizes, strides, x_dtype, w_dtype, silu):
        self.plans += 1
        rec, fixed = self, (tuple(sizes), tuple(strides), x_dtype, w_dtype, silu)

        class Plan:
            def launcher(self):
                def launch(*ptrs_and_stream):
                    assert len(ptrs_and_stream) == 8
                    rec.calls.append(("fwd", ptrs_and_stream[:7], *fixed))
                return launch
        return Plan()

    def BwdPlan(self, sizes, strides, x_dtype, w_dtype, silu):
        self.plans += 1
        rec, fixed = self, (tuple(sizes), tuple(strides), x_dtype, w_dtype, silu)

        class Plan:
            def workspace_bytes(self, *ptrs):
                assert len(ptrs) == 12
                return 4096

            def __call__(self, *args):
                assert len(args) == 14 and args[11] != 0 and args[12] == 4096
                rec.calls.append(("bwd", args[:11], *fixed))
        return Plan()


@pytest.fixture
def rec(monkeypatch):
    """The recorder in place of the runtime, CPU tensors taken as a device's, empty memos."""
    r = Recorder()
    real_validate = ops._validate

    def validate(x, weight, bias, seq_idx, initial_states, final_states_out, activation, require_device=True,
                 fn=ops._FN):
        return real_validate(x, weight, bias, seq_idx, initial_states, final_states_out, activation,
                             require_device=False, fn=fn)
    monkeypatch.setattr(ops, "runtime", lambda: r)
    monkeypatch.setattr(backward, "runtime", lambda: r)
    monkeypatch.setattr(ops, "_validate", validate)
    monkeypatch.setattr(ops, "_current_device", lambda: None)  # a CPU tensor's device.index
    monkeypatch.setattr(ops, "_raw_stream", lambda index: 0)
    monkeypatch.setattr(ops, "_stream_handle", lambda device: 0)
    memos = (ops._FWD_PLANS, backward._PLANS, backward._CHECKED_PLANS)
    for memo in memos:
        memo.clear()
    yield r
    for memo in memos:  # their plans launch on the recorder: no later test may find them
        memo.clear()


# ---- the calls, and what the per-call path sends for them -----------------------------

def _place(t: torch.Tensor, layout: str) -> torch.Tensor:
    """t's values in a tensor laid out as `layout`: cf, cl, their padded and odd-offset
    forms, or with no unit inner stride."""
    b, d, n = t.shape
    if layout == "cf":
        return t.contiguous()
    if layout == "cl":
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "cf-padded":
        out = torch.empty(b, d, n + 3, dtype=t.dtype)[:, :, :n]
    elif layout == "cl-padded":
        out = torch.empty(b, n, d + 3, dtype=t.dtype)[:, :, :d].transpose(1, 2)
    elif layout == "cf-odd-offset":
        out = torch.empty(b * d * n + 1, dtype=t.dtype)[1:].view(b, d, n)
    elif layout == "no-unit-stride":
        out = torch.empty(b, d, 2 * n, dtype=t.dtype)[:, :, ::2]
    else:
        raise ValueError(layout)
    out.copy_(t)
    return out


LAYOUTS = ["cf", "cl", "cf-padded", "cl-padded", "cf-odd-offset", "no-unit-stride"]
DTYPES = [(torch.bfloat16, torch.float32), (torch.float16, torch.float16), (torch.float32, torch.float32)]
FEATURES = [dict(), dict(bias=True), dict(bias=True, silu=True), dict(seq_idx=True, states=True),
            dict(bias=True, final=True), dict(final=True, final_out=True, states=True, silu=True)]
SHAPES = [(B, D, L), (1, 1, 1), (B, 1, L), (B, D, 1)]


def make_call(shape=(B, D, L), layout="cf", dtypes=DTYPES[0], bias=False, silu=False, seq_idx=False,
              states=False, final=False, final_out=False, grad=False, seed=0) -> dict:
    g = torch.Generator().manual_seed(seed)
    b, d, n = shape
    xd, wd = dtypes
    kw = dict(x=_place(torch.randn(b, d, n, generator=g).to(xd), layout),
              weight=torch.randn(d, W, generator=g).to(wd), activation="silu" if silu else None)
    if bias:
        kw["bias"] = torch.randn(d, generator=g).to(wd)
    if seq_idx:
        kw["seq_idx"] = torch.zeros(b, n, dtype=torch.int32)
    if states:
        kw["initial_states"] = torch.randn(b, W - 1, d, generator=g).to(xd).transpose(1, 2)  # not contiguous
    if final:
        kw["return_final_states"] = True
        if final_out:
            kw["final_states_out"] = torch.empty(b, d, W - 1, dtype=xd)
    if grad:
        for name in ("x", "weight", "bias", "initial_states"):
            if name in kw:
                kw[name] = kw[name].detach().requires_grad_()
    return kw


def _per_call_fwd(rec: Recorder, kw: dict):
    """What the per-call path (ops._forward_impl, no plan) sends and returns for kw."""
    silu = kw.get("activation") is not None
    fs = None
    if kw.get("return_final_states"):
        fs = kw.get("final_states_out")
        if fs is None:
            fs = ops._final_states_buffer(kw["x"], kw["weight"], True)
    with torch.no_grad():
        out = ops._forward_impl(kw["x"], kw["weight"], kw.get("bias"), kw.get("seq_idx"), kw.get("initial_states"),
                                fs, silu)
    return rec.calls.pop(), out, fs


def _layout_of(t: torch.Tensor) -> tuple:
    return type(t), t.shape, t.stride(), t.dtype, t.device


def _needs_contiguous(x: torch.Tensor) -> bool:
    _, sd, sl = ops._inner_strides(x)
    return sd != 1 and sl != 1


def _check_fwd_call(got: tuple, want: tuple, kw: dict, out, want_out) -> None:
    assert got[0] == want[0] == "fwd"
    assert got[2:] == want[2:], "sizes, strides, dtypes and activation as the per-call path sends them"
    ptrs, want_ptrs = got[1], want[1]
    assert (ptrs[0] == kw["x"].data_ptr()) != _needs_contiguous(kw["x"]), "x, or its contiguous copy"
    assert ptrs[1:5] == want_ptrs[1:5], "weight, bias, seq_idx, initial_states"
    assert ptrs[5] == out.data_ptr()
    if kw.get("final_states_out") is not None and kw.get("return_final_states"):
        assert ptrs[6] == kw["final_states_out"].data_ptr()
    assert (ptrs[6] == 0) == (want_ptrs[6] == 0)
    assert _layout_of(out) == _layout_of(want_out), "out is allocated as the per-call path allocates it"


FWD_MATRIX = [pytest.param(s, lay, dt, f, id=f"{'x'.join(map(str, s))}-{lay}-{i}-{j}")
              for s, lay, (i, dt), (j, f) in itertools.product(SHAPES, LAYOUTS, enumerate(DTYPES),
                                                               enumerate(FEATURES))]


@pytest.mark.parametrize("shape, layout, dtypes, features", FWD_MATRIX)
def test_a_planned_forward_sends_what_the_per_call_path_sends(rec, shape, layout, dtypes, features):
    kw = make_call(shape, layout, dtypes, **features)
    want, want_out, want_fs = _per_call_fwd(rec, kw)
    for attempt in ("first call: plans", "second call: the memo's plan"):
        result = cc1d.causal_conv1d_fn(**kw)
        out, fs = result if kw.get("return_final_states") else (result, None)
        _check_fwd_call(rec.calls.pop(), want, kw, out, want_out)
        if want_fs is not None:
            assert _layout_of(fs) == _layout_of(want_fs), attempt
        assert len(ops._FWD_PLANS) == 1, attempt
    assert rec.plans == 2  # one per activation, made once


COMPILED_MATRIX = [pytest.param(lay, f, id=f"{lay}-{j}") for lay in ("cf", "cl", "no-unit-stride")
                   for j, f in enumerate(FEATURES) if not f.get("final_out")]


@pytest.mark.parametrize("layout, features", COMPILED_MATRIX)
def test_the_compiled_graphs_op_launches_through_a_plan(rec, layout, features):
    """torch.compile's op (cc1d::causal_conv1d_fwd, run here as the graph runs it) goes through
    causal_conv1d_fn's plans, so a compiled graph launches the kernel eager calls launch (the
    plan's fixed one where plans fix): one plan for the signature, what the per-call path sends."""
    kw = make_call((B, D, L), layout, DTYPES[0], **features)
    want, want_out, want_fs = _per_call_fwd(rec, kw)
    args = (kw["x"], kw["weight"], kw.get("bias"), kw.get("seq_idx"), kw.get("initial_states"),
            bool(kw.get("return_final_states")), kw.get("activation") is not None)
    for attempt in ("first run: plans", "second run: the memo's plan"):
        out, fs = ops._fwd_op(*args)
        _check_fwd_call(rec.calls.pop(), want, kw, out, want_out)
        if want_fs is not None:
            assert _layout_of(fs) == _layout_of(want_fs), attempt
        assert len(ops._FWD_PLANS) == 1, attempt
    assert rec.plans == 2  # one per activation, made once


def test_the_compiled_graphs_op_still_checks_a_new_signature(rec):
    """The op checks a signature it has no plan for, as causal_conv1d_fn does."""
    kw = make_call()
    with pytest.raises(ValueError, match="weight"):
        ops._fwd_op(kw["x"], kw["weight"][:, :1], None, None, None, False, False)
    assert not rec.calls and not ops._FWD_PLANS


def test_the_peer_compatible_autograd_function_launches_through_a_plan(rec):
    """compat's CausalConv1dFn (the peer's argument list) has no plan of its own: its forward
    goes through causal_conv1d_fn's plans too."""
    from cc1d import compat
    kw = make_call(layout="cl", bias=True, silu=True)
    want, want_out, _ = _per_call_fwd(rec, kw)
    for attempt in range(2):
        out = compat.autograd_fn().apply(kw["x"], kw["weight"], kw["bias"], None, None, False, None, "silu")
        _check_fwd_call(rec.calls.pop(), want, kw, out, want_out)
    assert len(ops._FWD_PLANS) == 1 and rec.plans == 2


def _per_call_bwd_args(x, weight, bias, seq_idx, initial_states, dout, dfinal, dx, silu, want_dinitial=True,
                       want_dbias=True) -> tuple:
    """The runtime arguments and gradient buffers of the per-call backward (before plans):
    x made contiguous without a unit inner stride, dout (and a caller's dx) used where
    laid out like x, else fresh buffers laid out like x; other gradients from torch.empty."""
    if _needs_contiguous(x):
        x = x.contiguous()
    if backward._layout(dout) != backward._layout(x):
        dout = ops._empty_like_layout(x, x.shape)
    if dx is None or backward._layout(dx) != backward._layout(x):
        dx = ops._empty_like_layout(x, x.shape)
    b, d, _ = x.shape
    width = weight.shape[1]
    dweight = torch.empty(d, width, dtype=weight.dtype)
    dbias = torch.empty(d, dtype=weight.dtype) if bias is not None and want_dbias else None
    dis = torch.empty(b, d, width - 1, dtype=x.dtype) if initial_states is not None and want_dinitial else None
    args = backward._bwd_call_args(x, weight, bias, seq_idx, initial_states, dout, dfinal, dx, dis, dweight, dbias,
                                   None, silu)
    return ("bwd", args[0][:11], *args[1:]), (dx, dweight, dbias, dis)


def _check_bwd_call(got: tuple, want: tuple, grads, want_grads, dx_copied: bool = False) -> None:
    """got: the recorded launch; grads: (dx, dweight, dbias, dinitial_states) returned. A caller's
    dx laid out unlike x is written through a fresh buffer (want_grads[0]'s layout), then copied."""
    assert got[0] == "bwd"
    assert got[2:] == want[2:], "sizes, strides, dtypes and activation as the per-call path sends them"
    ptrs = got[1]
    assert ptrs[1:5] == want[1][1:5], "weight, bias, seq_idx, initial_states"
    written = (ptrs[7], ptrs[8], ptrs[9], ptrs[10])  # dx, dinitial_states, dweight, dbias
    returned = tuple(0 if g is None else g.data_ptr() for g in (grads[0], grads[3], grads[1], grads[2]))
    assert written[1:] == returned[1:]
    assert (written[0] == returned[0]) != dx_copied
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        assert (g is None) == (w is None)
        if g is not None and not (i == 0 and dx_copied):
            assert _layout_of(g) == _layout_of(w), "gradients are allocated as the per-call path allocates them"


BWD_MATRIX = [pytest.param(s, lay, dl, f, id=f"{'x'.join(map(str, s))}-{lay}-dout-{dl}-{j}")
              for s, lay, dl, (j, f) in itertools.product(SHAPES, LAYOUTS, ("cf", "cl", "no-unit-stride"),
                                                          enumerate(FEATURES[:4]))]


@pytest.mark.parametrize("shape, layout, dout_layout, features", BWD_MATRIX)
def test_a_planned_backward_sends_what_the_per_call_path_sends(rec, shape, layout, dout_layout, features):
    kw = make_call(shape, layout, DTYPES[0], **features)
    x, weight, bias, seq_idx, states = (kw.get(n) for n in ("x", "weight", "bias", "seq_idx", "initial_states"))
    dout = _place(torch.randn(shape).to(x.dtype), dout_layout)
    silu = kw["activation"] is not None
    for dx_layout in (None, "cf", "cl"):
        dx = None if dx_layout is None else _place(torch.empty(shape, dtype=x.dtype), dx_layout)
        want, want_grads = _per_call_bwd_args(x, weight, bias, seq_idx, states, dout, None, dx, silu)
        dx_copied = dx is not None and want_grads[0] is not dx
        for _ in range(2):
            grads = cc1d.causal_conv1d_bwd(x, weight, bias, dout, seq_idx, states, dx=dx,
                                           activation=kw["activation"], return_dinitial_states=states is not None)
            if dx is not None:
                assert grads[0] is dx, "a caller's dx is written in place and returned"
            _check_bwd_call(rec.calls.pop(), want, grads, want_grads, dx_copied)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("features", FEATURES, ids=range(len(FEATURES)))
def test_autograd_forward_and_backward_send_what_the_per_call_path_sends(rec, layout, features):
    for _ in range(2):
        # a final_states_out is an output of the graph after the call: the next call takes a fresh one
        kw = make_call((B, D, L), layout, DTYPES[0], grad=True, **features)
        names = [n for n in ("x", "weight", "bias", "initial_states") if n in kw]
        want_fwd, want_out, _ = _per_call_fwd(rec, kw)
        result = cc1d.causal_conv1d_fn(**kw)
        outs = result if kw.get("return_final_states") else (result,)
        _check_fwd_call(rec.calls.pop(), want_fwd, kw, outs[0], want_out)
        assert type(outs[0].grad_fn).__name__ == "CausalConv1dFnBackward"
        douts = [torch.randn_like(o) for o in outs]
        grads = torch.autograd.grad(outs, [kw[n] for n in names], douts)
        want, want_grads = _per_call_bwd_args(*(None if kw.get(n) is None else kw[n].detach()
                                                for n in ("x", "weight", "bias", "seq_idx", "initial_states")),
                                              douts[0], douts[1] if len(douts) > 1 else None, None,
                                              kw["activation"] is not None)
        by_name = dict(zip(names, grads))
        _check_bwd_call(rec.calls.pop(), want, [by_name.get(n) for n in ("x", "weight", "bias", "initial_states")],
                        want_grads)


# ---- a memoised signature never lets a bad call through ---------------------------------

def _bad_rows(rows):
    return [pytest.param(r, id=r.name) for r in rows if r.cpu and r.exc is not bad.ACCEPTED]


def _expect(row, fn, kw):
    with pytest.raises(row.exc) as info:
        fn(**kw)
    msg = str(info.value)
    assert f"{row.arg}:" in msg or f"{row.arg} " in msg, f"message does not name {row.arg}: {msg}"
    assert row.words in msg, msg
    return msg


@pytest.mark.parametrize("row", _bad_rows(bad.FWD_ROWS))
def test_a_bad_forward_call_fails_alike_after_valid_calls(rec, row):
    valid = bad.fwd_inputs("cpu")
    before = _expect(row, cc1d.causal_conv1d_fn, row.mutate(bad.fwd_inputs("cpu"), "cpu"))
    cc1d.causal_conv1d_fn(**valid)
    cc1d.causal_conv1d_fn(**valid)
    assert len(ops._FWD_PLANS) == 1
    assert _expect(row, cc1d.causal_conv1d_fn, row.mutate(bad.fwd_inputs("cpu"), "cpu")) == before
    assert len(ops._FWD_PLANS) == 1, "a failing call adds no plan"


@pytest.mark.parametrize("row", _bad_rows(bad.BWD_ROWS))
def test_a_bad_backward_call_fails_alike_after_valid_calls(rec, row):
    before = _expect(row, cc1d.causal_conv1d_bwd, row.mutate(bad.bwd_inputs("cpu"), "cpu"))
    cc1d.causal_conv1d_bwd(**bad.bwd_inputs("cpu"))
    cc1d.causal_conv1d_bwd(**bad.bwd_inputs("cpu"))
    assert len(backward._CHECKED_PLANS) == 1
    assert _expect(row, cc1d.causal_conv1d_bwd, row.mutate(bad.bwd_inputs("cpu"), "cpu")) == before
    assert len(backward._CHECKED_PLANS) == 1, "a failing call adds no plan"


class Sub(torch.Tensor):
    """A tensor subclass: empty_like would give it its type, torch.empty does not."""


def _changes():
    """(name, change of a valid call's keywords, exception or None for accepted)."""
    meta = lambda t: t.to("meta")  # noqa: E731
    return [
        ("x-dtype", lambda k: dict(k, x=k["x"].double()), TypeError),
        ("x-f16", lambda k: dict(k, x=k["x"].half()), None),
        ("x-channel-last", lambda k: dict(k, x=_place(k["x"], "cl")), None),
        ("x-no-unit-stride", lambda k: dict(k, x=_place(k["x"], "no-unit-stride")), None),
        ("x-subclass", lambda k: dict(k, x=k["x"].as_subclass(Sub)), None),
        ("x-list", lambda k: dict(k, x=k["x"].tolist()), TypeError),
        ("x-meta", lambda k: dict(k, x=meta(k["x"])), ValueError),
        ("weight-meta", lambda k: dict(k, weight=meta(k["weight"])), ValueError),
        ("weight-dtype", lambda k: dict(k, weight=k["weight"].half(), bias=k["bias"].half()), TypeError),
        ("weight-transposed", lambda k: dict(k, weight=k["weight"].t().contiguous().t()), None),
        ("weight-parameter", lambda k: dict(k, weight=torch.nn.Parameter(k["weight"], requires_grad=False)), None),
        ("bias-absent", lambda k: {n: v for n, v in k.items() if n != "bias"}, None),
        ("bias-dtype", lambda k: dict(k, bias=k["bias"].half()), TypeError),
        ("bias-meta", lambda k: dict(k, bias=meta(k["bias"])), ValueError),
        ("bias-strided", lambda k: dict(k, bias=torch.stack([k["bias"], k["bias"]], 1)[:, 0]), None),
        ("seq_idx-int32", lambda k: dict(k, seq_idx=torch.zeros(B, L, dtype=torch.int32)), None),
        ("seq_idx-int64", lambda k: dict(k, seq_idx=torch.zeros(B, L, dtype=torch.int64)), TypeError),
        ("initial_states-dtype", lambda k: dict(k, initial_states=torch.zeros(B, D, W - 1)), TypeError),
        ("final_states_out-shape", lambda k: dict(k, return_final_states=True,
                                                   final_states_out=torch.empty(B, D, W, dtype=k["x"].dtype)),
         ValueError),
        ("return_final_states", lambda k: dict(k, return_final_states=True), None),
        ("activation-relu", lambda k: dict(k, activation="relu"), ValueError),
        ("activation-list", lambda k: dict(k, activation=["silu"]), ValueError),
        ("activation-none", lambda k: dict(k, activation=None), None),
    ]


@pytest.mark.parametrize("name, change, exc", _changes(), ids=[c[0] for c in _changes()])
def test_a_changed_signature_is_checked_and_planned_afresh(rec, name, change, exc):
    """Valid calls memoise a signature; a call differing in one thing must not use its plan:
    it fails as it fails alone, or is accepted and sends what the per-call path sends."""
    valid = make_call(layout="cf", bias=True, silu=True)
    cc1d.causal_conv1d_fn(**valid)
    cc1d.causal_conv1d_fn(**valid)
    rec.calls.clear()
    kw = change(dict(valid))
    if exc is not None:
        ops._FWD_PLANS.clear()
        with pytest.raises(exc) as info:
            cc1d.causal_conv1d_fn(**kw)
        alone = str(info.value)
        cc1d.causal_conv1d_fn(**valid)
        with pytest.raises(exc) as info:
            cc1d.causal_conv1d_fn(**kw)
        assert str(info.value) == alone
        assert len(ops._FWD_PLANS) == 1
        return
    want, want_out, _ = _per_call_fwd(rec, kw)
    result = cc1d.causal_conv1d_fn(**kw)
    out = result[0] if kw.get("return_final_states") else result
    _check_fwd_call(rec.calls.pop(), want, kw, out, want_out)
    assert type(out) is torch.Tensor
    same_key = name == "activation-none"  # the activation is checked on every call, not keyed
    assert len(ops._FWD_PLANS) == (1 if same_key else 2)


def test_a_dx_at_x_or_dout_fails_after_valid_calls_with_another_dx(rec):
    """dx's address is no part of the key: it is compared with x's and dout's on every call."""
    t = bad.bwd_inputs("cpu")
    dx = torch.empty_like(t["x"])
    cc1d.causal_conv1d_bwd(**t, dx=dx)
    cc1d.causal_conv1d_bwd(**t, dx=dx)
    for name in ("x", "dout"):
        with pytest.raises(ValueError, match=f"dx: expected a buffer apart from {name}, got the same memory as {name}"):
            cc1d.causal_conv1d_bwd(**t, dx=t[name])
    with pytest.raises(ValueError, match="return_dinitial_states"):
        cc1d.causal_conv1d_bwd(**t, dx=dx, return_dinitial_states=True)


def test_every_field_of_a_tensor_signature_is_in_the_key():
    kw = make_call(bias=True, seq_idx=True, states=True, final=True, final_out=True)
    names = ("x", "weight", "bias", "seq_idx", "initial_states", "final_states_out")

    def key(k):
        return ops._fwd_key(*(k.get(n) for n in names), True)
    base = key(kw)
    for name in names:
        t = kw[name]
        for variant in (t.as_subclass(Sub), t.to("meta"), t.double() if t.is_floating_point() else t.long(),
                        t[:1], _place(t, "cf-padded") if t.dim() == 3 else t.t().contiguous().t() if t.dim() == 2
                        else torch.stack([t, t], -1)[..., 0]):
            assert key(dict(kw, **{name: variant})) != base, (name, variant.shape, variant.stride())
        if name not in ("x", "weight"):
            assert key(dict(kw, **{name: None})) != base, name
    assert ops._fwd_key(*(kw.get(n) for n in names), False) != base


def test_the_memos_are_bounded(rec, monkeypatch):
    monkeypatch.setattr(ops, "_MAX_PLANS", 8)
    for n in range(1, 30):
        cc1d.causal_conv1d_fn(torch.randn(1, 4, n), torch.randn(4, 3))
        cc1d.causal_conv1d_bwd(torch.randn(1, 4, n), torch.randn(4, 3), None, torch.randn(1, 4, n))
        assert len(ops._FWD_PLANS) <= 8 and len(backward._CHECKED_PLANS) <= 8


def test_the_package_attribute_is_the_function_itself():
    """cc1d.causal_conv1d_fn is looked up once, then read like any module attribute."""
    assert cc1d.causal_conv1d_fn is ops.causal_conv1d_fn
    assert vars(cc1d)["causal_conv1d_fn"] is ops.causal_conv1d_fn
