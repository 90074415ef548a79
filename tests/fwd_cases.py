"""Forward test cases on the GPU: random inputs in either layout, optional
features, poisoned outputs, and the float64 reference to compare against."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from cc1d.reference import causal_conv1d_ref

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
DTYPE_CODES = {"f32": 0, "f16": 1, "bf16": 2}
# relative L2 error allowed per x dtype (the output is rounded to it)
TOLERANCE = {"f32": 2e-5, "f16": 3e-3, "bf16": 2e-2}


@dataclass(frozen=True)
class Case:
    layout: str = "cf"
    x_dtype: str = "bf16"
    w_dtype: str = "f32"
    width: int = 4
    batch: int = 2
    dim: int = 64
    seqlen: int = 127
    bias: bool = True
    silu: bool = True
    seq_idx: bool = False
    states: bool = False
    final: bool = False
    sliced: bool = False  # x is a strided slice at an odd element offset
    align: int = 1        # pad the contiguous dim's stride to a multiple of this many elements

    def id(self) -> str:
        feats = "".join(c for c, on in zip("bsqif~", (self.bias, self.silu, self.seq_idx,
                                                    self.states, self.final, self.sliced)) if on)
        return (f"{self.layout}-{self.x_dtype}w{self.w_dtype}-w{self.width}-"
                f"{self.batch}x{self.dim}x{self.seqlen}-{feats or 'plain'}")


def random_seq_idx(batch: int, seqlen: int, gen: torch.Generator) -> torch.Tensor:
    """Increasing sequence ids per row with random boundaries and ~10% padding (-1)."""
    starts = (torch.rand(batch, seqlen, generator=gen) < 0.05).to(torch.int32)
    starts[:, 0] = 0
    ids = torch.cumsum(starts, dim=1).to(torch.int32)
    pad = torch.rand(batch, seqlen, generator=gen) < 0.1
    return torch.where(pad, torch.full_like(ids, -1), ids)


def boundary_rich_seq_idx(batch: int, seqlen: int, gen: torch.Generator) -> torch.Tensor:
    """Increasing ids: sparse boundaries (about one per 1000 tokens, so whole warps see
    none and take the plain taps), a stretch of 300 where every other position or so
    starts a sequence and a tenth are padding (boundaries inside every vector and halo),
    and a run of 50 padding tokens (-1)."""
    p = torch.full((batch, seqlen), 0.001)
    lo = int(torch.randint(0, max(1, seqlen - 300), (1,), generator=gen))
    p[:, lo:lo + 300] = 0.5
    starts = (torch.rand(batch, seqlen, generator=gen) < p).to(torch.int32)
    starts[:, 0] = 0
    ids = torch.cumsum(starts, dim=1).to(torch.int32)
    pad = torch.zeros(batch, seqlen, dtype=torch.bool)
    pad[:, lo:lo + 300] = torch.rand(batch, min(300, seqlen - lo), generator=gen) < 0.1
    run = int(torch.randint(0, max(1, seqlen - 50), (1,), generator=gen))
    pad[:, run:run + 50] = True
    return torch.where(pad, torch.full_like(ids, -1), ids)


def seq_idx_on_device(ids: torch.Tensor, how: str) -> torch.Tensor:
    """ids (batch, seqlen) on the GPU: contiguous (vector loads), every other element of a
    wider buffer (seq_l_stride 2), or one element into a buffer (4-byte aligned only)."""
    b, l = ids.shape
    if how == "contiguous":
        return ids.cuda()
    if how == "strided":
        buf = torch.full((b, 2 * l), 7, dtype=torch.int32, device="cuda")
        buf[:, ::2] = ids.cuda()
        return buf[:, ::2]
    buf = torch.full((b, l + 1), 7, dtype=torch.int32, device="cuda")
    buf[:, 1:] = ids.cuda()
    return buf[:, 1:]


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _layout(t_bdl: torch.Tensor, layout: str, sliced: bool, align: int,
            gen: torch.Generator, device) -> torch.Tensor:
    """Place a (batch, dim, seqlen) tensor on the device as the layout asks: the
    contiguous dim padded to `align` elements, or sliced at an odd offset.
    (The buffer is built on the device: .to() would make a slice contiguous.)"""
    b, d, l = t_bdl.shape
    pad = 3 if sliced else 0
    off = 1 if sliced else 0
    if layout == "cf":
        big = torch.randn(b, d + pad, _round_up(l + pad, align), generator=gen).to(t_bdl.dtype)
        big = big.to(device)
        view = big[:, off:off + d, off:off + l]
        view.copy_(t_bdl.to(device))
        return view
    big = torch.randn(b, l + pad, _round_up(d + pad, align), generator=gen).to(t_bdl.dtype)
    big = big.to(device)
    view = big[:, off:off + l, off:off + d].transpose(1, 2)
    view.copy_(t_bdl.to(device))
    return view


def make_inputs(case: Case, seed: int, device="cuda") -> dict:
    gen = torch.Generator().manual_seed(seed)
    xd, wd = TORCH_DTYPES[case.x_dtype], TORCH_DTYPES[case.w_dtype]
    x = torch.randn(case.batch, case.dim, case.seqlen, generator=gen).to(xd)
    x = _layout(x, case.layout, case.sliced, case.align, gen, device)
    weight = (torch.randn(case.dim, case.width, generator=gen) / case.width ** 0.5).to(wd).to(device)
    bias = torch.randn(case.dim, generator=gen).to(wd).to(device) if case.bias else None
    seq_idx = random_seq_idx(case.batch, case.seqlen, gen).to(device) if case.seq_idx else None
    states = None
    if case.states:
        states = torch.randn(case.batch, case.dim, case.width - 1, generator=gen).to(xd).to(device)
    return dict(x=x, weight=weight, bias=bias, seq_idx=seq_idx, initial_states=states)


def poisoned(shape, dtype, layout: str = "cf", align: int = 1) -> torch.Tensor:
    """An output buffer full of NaN (any element a kernel fails to write fails the
    test), laid out as `layout` with the contiguous dim padded to `align` elements."""
    b, d, l = shape
    if layout == "cl":
        t = torch.full((b, l, _round_up(d, align)), float("nan"), dtype=dtype, device="cuda")
        return t[:, :, :d].transpose(1, 2)
    t = torch.full((b, d, _round_up(l, align)), float("nan"), dtype=dtype, device="cuda")
    return t[:, :, :l]


def reference(case: Case, inp: dict):
    """float64 reference output and final states."""
    d = lambda t: None if t is None else t.double()  # noqa: E731
    out, fs = causal_conv1d_ref(d(inp["x"]), d(inp["weight"]), d(inp["bias"]),
                                initial_states=d(inp["initial_states"]), return_final_states=True,
                                activation="silu" if case.silu else None, seq_idx=inp["seq_idx"])
    return out, fs


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    err = torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want).clamp_min(1e-30)
    return float(err)


def assert_close(name: str, got: torch.Tensor, want: torch.Tensor, x_dtype: str) -> None:
    assert got.shape == want.shape, (name, got.shape, want.shape)
    n_nan = int(torch.isnan(got).sum())
    assert n_nan == 0, f"{name}: {n_nan} NaN elements (unwritten or invalid)"
    err = rel_l2(got, want)
    assert err == err and err <= TOLERANCE[x_dtype], f"{name}: relative L2 error {err:.3e}"


def launch_variant(rt, variant, case: Case, inp: dict, runtime_dict: dict | None = None, as_plan: bool = False,
                   out: torch.Tensor | None = None):
    """Run exactly one generated variant (or `runtime_dict`, its runtime fields with
    another source) on poisoned outputs (`out`, else a fresh one laid out as the case
    says): its generic kernel, or with `as_plan` the one a plan for the call launches
    (launch_fwd); returns (out, final_states)."""
    x, w = inp["x"], inp["weight"]
    out = poisoned(x.shape, x.dtype, case.layout, case.align) if out is None else out
    fs = poisoned((case.batch, case.dim, case.width - 1), x.dtype) if case.final else None
    b, s, i = inp["bias"], inp["seq_idx"], inp["initial_states"]
    ptr = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
    st = lambda t, n: (0,) * n if t is None else tuple(t.stride())  # noqa: E731
    strides = (*x.stride(), *w.stride(), 0 if b is None else b.stride(0), *out.stride(),
               *st(s, 2), *st(i, 3), *st(fs, 3))
    rt.launch_fwd(runtime_dict or variant.as_runtime_dict(),
                  (x.data_ptr(), w.data_ptr(), ptr(b), ptr(s), ptr(i), out.data_ptr(), ptr(fs)),
                  (case.batch, case.dim, case.seqlen, case.width), strides,
                  DTYPE_CODES[case.x_dtype], DTYPE_CODES[case.w_dtype], case.silu,
                  torch.cuda.current_stream().cuda_stream, as_plan=as_plan)
    torch.cuda.synchronize()
    return out, fs


def rows_from(t: torch.Tensor, offset: int) -> torch.Tensor:
    """t's values (contiguous (batch, dim, seqlen)) in a fresh NaN-filled buffer on the
    device, `offset` elements in: rows that start off the vector boundary (realigned twins)."""
    buf = torch.full((t.numel() + offset + 8,), float("nan"), dtype=t.dtype, device="cuda")
    view = buf[offset:offset + t.numel()].view(t.shape)
    view.copy_(t)
    return view
