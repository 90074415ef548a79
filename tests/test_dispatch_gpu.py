"""Warm-up and CUDA graphs on the GPU (marker gpu): after ``cc1d.warmup``,
``causal_conv1d_fn`` calls are captured in a ``torch.cuda.CUDAGraph`` with no
dispatch, compile or load work (dispatch_stats unchanged; a synchronising or
unsafe call would fail the capture), and replays on fresh inputs match the
float64 reference; warmup's explanations are ``cc1d.explain``'s."""
from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cc1d  # noqa: E402

from fwd_cases import TORCH_DTYPES, assert_close, random_seq_idx  # noqa: E402

pytestmark = pytest.mark.gpu

# No power-of-two tile divides any of these: every kernel tail path runs.
AWKWARD = (3, 133, 1001)
WIDTH = 4


class StaticCall:
    """Fresh (so fully aligned) static input buffers of one call, in a layout,
    and the call itself; replays read whatever the buffers hold."""

    def __init__(self, layout: str, x_dtype: str, w_dtype: str, all_features: bool, shape=AWKWARD):
        b, d, n = shape
        xd, wd = TORCH_DTYPES[x_dtype], TORCH_DTYPES[w_dtype]
        self.layout, self.x_dtype, self.all_features = layout, x_dtype, all_features
        self.x = (torch.empty(b, d, n, dtype=xd, device="cuda") if layout == "cf"
                  else torch.empty(b, n, d, dtype=xd, device="cuda").transpose(1, 2))
        self.weight = torch.empty(d, WIDTH, dtype=wd, device="cuda")
        self.bias = torch.empty(d, dtype=wd, device="cuda")
        self.seq_idx = torch.empty(b, n, dtype=torch.int32, device="cuda") if all_features else None
        self.states = torch.empty(b, d, WIDTH - 1, dtype=xd, device="cuda") if all_features else None

    def warmup_kwargs(self) -> dict:
        f = self.all_features
        return dict(dtype=self.x.dtype, weight_dtype=self.weight.dtype, width=WIDTH, layout=self.layout,
                    bias=True, activation="silu", seq_idx=f, initial_states=f, return_final_states=f)

    def __call__(self):
        res = cc1d.causal_conv1d_fn(self.x, self.weight, self.bias, seq_idx=self.seq_idx,
                                    initial_states=self.states, return_final_states=self.all_features,
                                    activation="silu")
        return res if self.all_features else (res, None)

    def refill(self, gen: torch.Generator) -> None:
        """Fresh random inputs, copied into the static buffers."""
        b, d, n = self.x.shape
        self.x.copy_(torch.randn(b, d, n, generator=gen).to(self.x.dtype))
        self.weight.copy_((torch.randn(d, WIDTH, generator=gen) / WIDTH ** 0.5).to(self.weight.dtype))
        self.bias.copy_(torch.randn(d, generator=gen).to(self.bias.dtype))
        if self.all_features:
            self.seq_idx.copy_(random_seq_idx(b, n, gen))
            self.states.copy_(torch.randn(b, d, WIDTH - 1, generator=gen).to(self.states.dtype))

    def reference(self):
        dbl = lambda t: None if t is None else t.double()  # noqa: E731
        return cc1d.causal_conv1d_ref(dbl(self.x), dbl(self.weight), dbl(self.bias), seq_idx=self.seq_idx,
                                      initial_states=dbl(self.states), return_final_states=True,
                                      activation="silu")


@pytest.mark.parametrize("all_features", [False, True], ids=["bias-silu", "all-features"])
@pytest.mark.parametrize("dtypes", [("bf16", "f32"), ("f32", "f32")], ids="w".join)
@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_warmed_up_calls_capture_and_replay_correctly(layout, dtypes, all_features):
    call = StaticCall(layout, *dtypes, all_features)
    explained = cc1d.warmup([tuple(call.x.shape)], **call.warmup_kwargs())
    assert len(explained) == 1 and explained[0]["key"].startswith(f"fwd.{layout}.")

    before = cc1d.dispatch_stats()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="global"):
        out, final_states = call()
    assert cc1d.dispatch_stats() == before, "the capture decided, compiled or loaded a kernel: warmup missed it"

    gen = torch.Generator().manual_seed(zlib.crc32(f"{layout}{dtypes}{all_features}".encode()))
    for replay in range(3):
        call.refill(gen)
        out.fill_(float("nan"))  # an element the replay does not write fails
        if final_states is not None:
            final_states.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_fs = call.reference()
        name = f"{layout} {dtypes} {'all' if all_features else 'bias-silu'} replay {replay}"
        assert_close(f"{name} out", out, ref_out, call.x_dtype)
        if final_states is not None:
            assert_close(f"{name} final_states", final_states, ref_fs, call.x_dtype)
    assert cc1d.dispatch_stats() == before


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_warmup_explanations_are_explains(layout):
    shapes = [(1, 64, 128), AWKWARD, (2, 4096, 2048), (1, 1, 1), (4, 5120, 1)]
    explained = cc1d.warmup(shapes, dtype=torch.bfloat16, weight_dtype=torch.float32, layout=layout)
    assert len(explained) == len(shapes)
    for shape, e in zip(shapes, explained):
        b, d, n = shape
        x = (torch.empty(b, d, n, dtype=torch.bfloat16, device="cuda") if layout == "cf"
             else torch.empty(b, n, d, dtype=torch.bfloat16, device="cuda").transpose(1, 2))
        w = torch.empty(d, WIDTH, device="cuda")
        assert cc1d.explain(x, w, torch.empty(d, device="cuda"), activation="silu") == e, shape


def test_warmed_up_eager_calls_do_no_dispatch_work():
    shapes = [(2, 256, 333), (1, 1024, 4096)]
    cc1d.warmup(shapes, dtype=torch.float16)
    before = cc1d.dispatch_stats()
    for b, d, n in shapes:
        x = torch.randn(b, d, n, dtype=torch.float16, device="cuda")
        w = torch.randn(d, WIDTH, dtype=torch.float16, device="cuda")
        cc1d.causal_conv1d_fn(x, w, torch.randn(d, dtype=torch.float16, device="cuda"), activation="silu")
    torch.cuda.synchronize()
    assert cc1d.dispatch_stats() == before


def test_warmup_on_an_explicit_device_index():
    index = torch.cuda.current_device()
    e = cc1d.warmup([(1, 64, 256)], device=index)[0]
    assert e["arch"] == cc1d.explain(torch.empty(1, 64, 256, dtype=torch.bfloat16, device="cuda"),
                                     torch.empty(64, WIDTH, dtype=torch.bfloat16, device="cuda"),
                                     torch.empty(64, dtype=torch.bfloat16, device="cuda"),
                                     activation="silu")["arch"]


@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_warmed_up_training_step_captures_and_replays_correctly(layout):
    """warmup(backward=True): forward + backward through autograd inside one CUDA graph."""
    call = StaticCall(layout, "f32", "f32", all_features=True)
    explained = cc1d.warmup([tuple(call.x.shape)], backward=True, **call.warmup_kwargs())
    assert explained[0]["fwd"]["key"].startswith(f"fwd.{layout}.")
    assert explained[0]["bwd"]["key"].startswith(f"bwd.{layout}.")
    call.x.requires_grad_()
    call.weight.requires_grad_()
    call.bias.requires_grad_()
    call.states.requires_grad_()
    dout = torch.empty_like(call.x)
    dfinal = torch.empty(call.x.shape[0], call.x.shape[1], WIDTH - 1, device="cuda")
    leaves = (call.x, call.weight, call.bias, call.states)

    def step():
        out, fs = call()
        return torch.autograd.grad((out, fs), leaves, (dout, dfinal))

    side = torch.cuda.Stream()  # autograd's first use sets up state a capture must not see
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    before = cc1d.dispatch_stats()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="global"):
        grads = step()
    assert cc1d.dispatch_stats() == before, "the capture decided, compiled or loaded a kernel: warmup missed it"

    gen = torch.Generator().manual_seed(zlib.crc32(layout.encode()))
    for replay in range(2):
        with torch.no_grad():
            call.refill(gen)
            dout.copy_(torch.randn(dout.shape, generator=gen))
            dfinal.copy_(torch.randn(dfinal.shape, generator=gen))
            for g in grads:
                g.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = _reference_grads(call, dout, dfinal)
        for name, got, ref in zip(("dx", "dweight", "dbias", "dinitial_states"), grads, want):
            assert_close(f"{layout} replay {replay} {name}", got, ref, "f32")


def _reference_grads(call, dout, dfinal):
    leaf = lambda t: t.detach().double().requires_grad_()  # noqa: E731
    x, w, b, s = leaf(call.x), leaf(call.weight), leaf(call.bias), leaf(call.states)
    out, fs = cc1d.causal_conv1d_ref(x, w, b, seq_idx=call.seq_idx, initial_states=s,
                                     return_final_states=True, activation="silu")
    return torch.autograd.grad((out, fs), (x, w, b, s), (dout.double(), dfinal.double()))
