"""Per-op problem adapters: how to make inputs, the float64 reference, the bytes
a kernel must move, and how to launch one variant through the runtime.

The search, validation and timing are op-generic; adding an op (bwd, update,
varlen) means adding one adapter to PROBLEMS. torch is imported lazily: only
the GPU path needs it.
"""
from __future__ import annotations

from typing import Any, Protocol

from .._planned import PlannedBuffer
from ..generator import DTYPES
from ..generator.space import BWD_CF, BWD_CL, CL_SPLIT_BLOCKS, SPLIT_BLOCKS
from .shapes import Shape

DTYPE_CODES = {"f32": 0, "f16": 1, "bf16": 2}


class Problem(Protocol):
    op: str

    def bytes_moved(self, shape: Shape) -> int:
        """The physical minimum of bytes read + written (the bandwidth yardstick)."""

    def make_inputs(self, shape: Shape, seed: int, device: str) -> dict[str, Any]:
        """Fresh random inputs in the shape's layout."""

    def make_outputs(self, shape: Shape, inputs: dict[str, Any]) -> dict[str, Any]:
        """NaN-filled output buffers: any element a kernel leaves unwritten fails validation."""

    def reference(self, shape: Shape, inputs: dict[str, Any]) -> dict[str, Any]:
        """float64 expected values, keyed like make_outputs."""

    def launch(self, rt: Any, kernel: dict, shape: Shape, inputs: dict[str, Any],
               outputs: dict[str, Any], stream: int) -> None:
        """Launch exactly this kernel (Variant.as_runtime_dict(); no dispatch) on the caller's stream.

        A problem whose plans compile the kernel with options (FwdProblem's fixed kernels)
        launches that build, and says which in plan_options(rt, shape, inputs, outputs)
        (None: the source as it is), so that the tuner can compile it ahead."""


def _torch_dtype(name: str):
    import torch
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[name]


def _randn(size: tuple[int, ...], seed: int, stream: int, dtype: Any, device: Any) -> Any:
    """Normal samples of a problem's large tensor (x, dout), drawn on `device` by its own
    generator (seed and stream: the tensor's; a stream apart from the CPU generator's that
    draws the small ones). Drawn on the CPU and copied, x at (16, 8192, 8192) took seconds,
    which every candidate's validation spent again (its fresh inputs): a 6-second tuning
    budget timed one candidate there (sessions 72-76)."""
    import torch
    gen = torch.Generator(device=device).manual_seed(seed * 16 + stream)
    return torch.randn(size, generator=gen, device=device, dtype=dtype)


class FwdProblem:
    op = "fwd"

    def bytes_moved(self, shape: Shape) -> int:
        xb, wb = DTYPES[shape.x_dtype][1], DTYPES[shape.w_dtype][1]
        n = shape.batch * shape.dim * shape.seqlen
        extra = shape.dim * (shape.width + shape.bias) * wb
        states = shape.batch * shape.dim * (shape.width - 1) * xb
        return 2 * n * xb + extra + states * (shape.initial_states + shape.final_states) \
            + 4 * shape.batch * shape.seqlen * shape.seq_idx

    def make_inputs(self, shape: Shape, seed: int, device: str = "cuda") -> dict[str, Any]:
        import torch
        gen = torch.Generator().manual_seed(seed)
        xd, wd = _torch_dtype(shape.x_dtype), _torch_dtype(shape.w_dtype)
        b, d, l, w = shape.batch, shape.dim, shape.seqlen, shape.width
        if shape.layout == "cf":
            x = _randn((b, d, l), seed, 1, xd, device)
        else:  # channel-last: (batch, seqlen, dim) memory viewed as (batch, dim, seqlen)
            x = _randn((b, l, d), seed, 1, xd, device).transpose(1, 2)
        inputs = dict(x=x, weight=(torch.randn(d, w, generator=gen) / w ** 0.5).to(wd).to(device),
                      bias=None, seq_idx=None, initial_states=None)
        if shape.bias:
            inputs["bias"] = torch.randn(d, generator=gen).to(wd).to(device)
        if shape.seq_idx:
            # Packed batches: a boundary every 512 tokens or so (at least about 4 per row,
            # for short rows). Their density matters: the channel-first forward takes its
            # plain taps where a warp's windows see none (fwd_cf_tiles.cuh.j2).
            rate = max(1 / 512, 4 / l)
            starts = (torch.rand(b, l, generator=gen) < rate).to(torch.int32)
            starts[:, 0] = 0
            inputs["seq_idx"] = torch.cumsum(starts, dim=1).to(torch.int32).to(device)
        if shape.initial_states:
            inputs["initial_states"] = torch.randn(b, d, w - 1, generator=gen).to(xd).to(device)
        return inputs

    def make_outputs(self, shape: Shape, inputs: dict[str, Any]) -> dict[str, Any]:
        import torch
        x = inputs["x"]
        nan = float("nan")
        if shape.layout == "cf":
            out = torch.full_like(x, nan)
        else:
            out = torch.full((shape.batch, shape.seqlen, shape.dim), nan, dtype=x.dtype,
                             device=x.device).transpose(1, 2)
        outputs = dict(out=out)
        if shape.final_states:
            outputs["final_states"] = torch.full((shape.batch, shape.dim, shape.width - 1), nan,
                                                 dtype=x.dtype, device=x.device)
        return outputs

    def reference(self, shape: Shape, inputs: dict[str, Any]) -> dict[str, Any]:
        from ..reference import causal_conv1d_ref
        d = lambda t: None if t is None else t.double()  # noqa: E731
        out, fs = causal_conv1d_ref(d(inputs["x"]), d(inputs["weight"]), d(inputs["bias"]),
                                    initial_states=d(inputs["initial_states"]), return_final_states=True,
                                    activation="silu" if shape.activation == "silu" else None,
                                    seq_idx=inputs["seq_idx"])
        return dict(out=out, final_states=fs) if shape.final_states else dict(out=out)

    def launch_args(self, shape: Shape, inputs: dict[str, Any], outputs: dict[str, Any]) -> tuple:
        """launch_fwd's arguments between the variant and the stream."""
        x, w, b = inputs["x"], inputs["weight"], inputs["bias"]
        s, i = inputs["seq_idx"], inputs["initial_states"]
        out, fs = outputs["out"], outputs.get("final_states")
        ptr = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
        st = lambda t, n: (0,) * n if t is None else tuple(t.stride())  # noqa: E731
        strides = (*x.stride(), *w.stride(), 0 if b is None else b.stride(0), *out.stride(),
                   *st(s, 2), *st(i, 3), *st(fs, 3))
        return ((x.data_ptr(), w.data_ptr(), ptr(b), ptr(s), ptr(i), out.data_ptr(), ptr(fs)),
                (shape.batch, shape.dim, shape.seqlen, shape.width), strides,
                DTYPE_CODES[shape.x_dtype], DTYPE_CODES[shape.w_dtype], shape.activation == "silu")

    def launch(self, rt: Any, kernel: dict, shape: Shape, inputs: dict[str, Any],
               outputs: dict[str, Any], stream: int) -> None:
        # as_plan: the kernel users' calls run (their plans' fixed kernel where plans fix)
        rt.launch_fwd(kernel, *self.launch_args(shape, inputs, outputs), stream, as_plan=True)

    def plan_options(self, rt: Any, shape: Shape, inputs: dict[str, Any],
                     outputs: dict[str, Any]) -> list[str] | None:
        """The compiler options of the fixed kernel that launch() runs for these buffers,
        or None where it runs the generic kernel (rt.fwd_plan_fixes)."""
        args = self.launch_args(shape, inputs, outputs)
        return rt.fwd_fixed_options(*args) if rt.fwd_plan_fixes(*args) else None

    def shape_plan_options(self, rt: Any, shape: Shape) -> list[str] | None:
        """plan_options for the buffers make_inputs and make_outputs would give the shape,
        without allocating them (their layouts alone: the options depend on sizes, strides
        and which inputs there are, not on addresses)."""
        d, l, w = shape.dim, shape.seqlen, shape.width
        seq_major = (d * l, 1, d) if shape.layout == "cl" else (d * l, l, 1)
        states = (d * (w - 1), w - 1, 1)
        inputs = dict(x=PlannedBuffer(seq_major, 0), weight=PlannedBuffer((w, 1), 1),
                      bias=PlannedBuffer((1,), 2) if shape.bias else None,
                      seq_idx=PlannedBuffer((l, 1), 3) if shape.seq_idx else None,
                      initial_states=PlannedBuffer(states, 4) if shape.initial_states else None)
        outputs = dict(out=PlannedBuffer(seq_major, 5))
        if shape.final_states:
            outputs["final_states"] = PlannedBuffer(states, 6)
        return self.plan_options(rt, shape, inputs, outputs)


# (widest channel tile, most split_blocks) of each layout's backward space.
_WIDEST_SPLITS = {"cf": (max(BWD_CF.param("rows").values), max(SPLIT_BLOCKS.values)),
                  "cl": (max(BWD_CL.param("tile_d").values), max(CL_SPLIT_BLOCKS.values))}


def bwd_splits(shape: Shape, tile_l: int, tile_d: int, split_blocks: int) -> int:
    """The runtime's split count for a backward kernel (runtime/src/backward.cpp):
    channel-first rounds split_blocks / groups up, channel-last down."""
    items = shape.batch * -(-shape.seqlen // tile_l)
    groups = min(-(-shape.dim // tile_d), 65535)
    per_group = split_blocks // groups if shape.layout == "cl" else -(-split_blocks // groups)
    return max(1, min(items, per_group))


class BwdProblem:
    """The backward: dx, dweight, dbias, dinitial_states from x, weight and dout
    (and dfinal_states when the shape returns final states)."""
    op = "bwd"

    def bytes_moved(self, shape: Shape) -> int:
        xb, wb = DTYPES[shape.x_dtype][1], DTYPES[shape.w_dtype][1]
        n = shape.batch * shape.dim * shape.seqlen
        weights = 2 * shape.dim * (shape.width + shape.bias) * wb  # read, and their gradients written
        states = shape.batch * shape.dim * (shape.width - 1) * xb
        return 3 * n * xb + weights + states * (2 * shape.initial_states + shape.final_states) \
            + 4 * shape.batch * shape.seqlen * shape.seq_idx

    def make_inputs(self, shape: Shape, seed: int, device: str = "cuda") -> dict[str, Any]:
        import torch
        inputs = FwdProblem().make_inputs(shape, seed, device)
        gen = torch.Generator().manual_seed(seed + 1)
        xd = _torch_dtype(shape.x_dtype)
        b, d, l = shape.batch, shape.dim, shape.seqlen
        if shape.layout == "cf":
            inputs["dout"] = _randn((b, d, l), seed, 2, xd, device)
        else:
            inputs["dout"] = _randn((b, l, d), seed, 2, xd, device).transpose(1, 2)
        inputs["dfinal_states"] = None
        if shape.final_states:
            inputs["dfinal_states"] = torch.randn(b, d, shape.width - 1, generator=gen).to(xd).to(device)
        return inputs

    def make_outputs(self, shape: Shape, inputs: dict[str, Any]) -> dict[str, Any]:
        import torch
        nan = float("nan")
        x, w = inputs["x"], inputs["weight"]
        dx = FwdProblem().make_outputs(shape, inputs)["out"]
        outputs = dict(dx=dx, dweight=torch.full_like(w, nan))
        if shape.bias:
            outputs["dbias"] = torch.full_like(inputs["bias"], nan)
        if shape.initial_states:
            outputs["dinitial_states"] = torch.full_like(inputs["initial_states"], nan)
        # Enough partials for any variant of the layout: the most splits come with the
        # widest channel tile (the most blocks a group) and the shortest tile_l.
        splits = bwd_splits(shape, 1, *_WIDEST_SPLITS[shape.layout])
        outputs["workspace"] = torch.full((splits * shape.dim * (shape.width + 1),), nan,
                                          dtype=torch.float32, device=x.device)
        return outputs

    def reference(self, shape: Shape, inputs: dict[str, Any]) -> dict[str, Any]:
        from ..reference import causal_conv1d_ref
        leaf = lambda t: None if t is None else t.detach().double().requires_grad_()  # noqa: E731
        x, w, b, s = (leaf(inputs[k]) for k in ("x", "weight", "bias", "initial_states"))
        out, fs = causal_conv1d_ref(x, w, b, initial_states=s, return_final_states=True,
                                    activation="silu" if shape.activation == "silu" else None,
                                    seq_idx=inputs["seq_idx"])
        loss = (out * inputs["dout"].double()).sum()
        if inputs["dfinal_states"] is not None:
            loss = loss + (fs * inputs["dfinal_states"].double()).sum()
        loss.backward()
        want = dict(dx=x.grad, dweight=w.grad)
        if shape.bias:
            want["dbias"] = b.grad
        if shape.initial_states:
            want["dinitial_states"] = s.grad
        return want

    def launch_args(self, shape: Shape, inputs: dict[str, Any], outputs: dict[str, Any]) -> tuple:
        """launch_bwd's (ptrs, sizes, strides, x_dtype, w_dtype, silu) for these buffers."""
        from ..backward import _bwd_call_args
        return _bwd_call_args(inputs["x"], inputs["weight"], inputs["bias"], inputs["seq_idx"],
                              inputs["initial_states"], inputs["dout"], inputs["dfinal_states"],
                              outputs["dx"], outputs.get("dinitial_states"), outputs["dweight"],
                              outputs.get("dbias"), outputs["workspace"], shape.activation == "silu")

    def launch(self, rt: Any, kernel: dict, shape: Shape, inputs: dict[str, Any],
               outputs: dict[str, Any], stream: int) -> None:
        args = self.launch_args(shape, inputs, outputs)
        nbytes = 4 * bwd_splits(shape, kernel["tile_l"], kernel["tile_d"], kernel["split_blocks"]) \
            * shape.dim * (shape.width + 1)
        # as_plan: the kernel users' calls run (a channel-last plan's fixed kernel; the
        # seq_idx build of a channel-first call with seq_idx)
        rt.launch_bwd(kernel, *args, nbytes, stream, as_plan=True)

    def plan_options(self, rt: Any, shape: Shape, inputs: dict[str, Any],
                     outputs: dict[str, Any]) -> list[str] | None:
        """The compiler options of the fixed kernel that launch() runs for these buffers
        (rt.bwd_plan_fixes: channel-last), or None where it runs a build without
        constants (the seq_idx build is compiled at its first launch, as before)."""
        args = self.launch_args(shape, inputs, outputs)
        return rt.bwd_fixed_options(*args) if rt.bwd_plan_fixes(*args) else None

    def shape_plan_options(self, rt: Any, shape: Shape) -> list[str] | None:
        """plan_options for the buffers make_inputs and make_outputs would give the shape,
        without allocating them (their layouts alone, as FwdProblem.shape_plan_options; x
        and weight also carry the shape and dtype _bwd_call_args reads from them)."""
        b, d, l, w = shape.batch, shape.dim, shape.seqlen, shape.width
        seq_major = (d * l, 1, d) if shape.layout == "cl" else (d * l, l, 1)
        states = (d * (w - 1), w - 1, 1)
        init = shape.initial_states
        inputs = dict(x=PlannedBuffer(seq_major, 0, (b, d, l), _torch_dtype(shape.x_dtype)),
                      weight=PlannedBuffer((w, 1), 1, (d, w), _torch_dtype(shape.w_dtype)),
                      bias=PlannedBuffer((1,), 2) if shape.bias else None,
                      seq_idx=PlannedBuffer((l, 1), 3) if shape.seq_idx else None,
                      initial_states=PlannedBuffer(states, 4) if init else None,
                      dout=PlannedBuffer(seq_major, 5, (b, d, l)),
                      dfinal_states=PlannedBuffer(states, 6) if shape.final_states else None)
        outputs = dict(dx=PlannedBuffer(seq_major, 7, (b, d, l)), dweight=PlannedBuffer((w, 1), 9),
                       workspace=PlannedBuffer((1,), 11))
        if init:
            outputs["dinitial_states"] = PlannedBuffer(states, 8)
        if shape.bias:
            outputs["dbias"] = PlannedBuffer((1,), 10)
        return self.plan_options(rt, shape, inputs, outputs)


def varlen_lengths(num_seqs: int, total: int) -> list[int]:
    """Mixed sequence lengths of a vfwd shape (batch = sequences, seqlen = total tokens):
    a fixed function of the shape, so every trial times the same packing. Lengths
    vary about 8x (one in eight sequences is empty when there are more than eight)."""
    import random
    rng = random.Random(num_seqs * 1_000_003 + total)
    weights = [0.0 if num_seqs > 8 and i % 8 == 5 else rng.uniform(0.25, 2.0) for i in range(num_seqs)]
    scale = total / sum(weights)
    lens = [int(w * scale) for w in weights]
    lens[0] += total - sum(lens)
    return lens


class VarlenProblem:
    """The varlen prefill (op vfwd): shape.batch sequences of mixed lengths packed into
    shape.seqlen tokens; a state pool (rows in shuffled order) when the shape has
    final_states, read for sequences flagged in has_initial_state when it has
    initial_states. The pool is an output: make_outputs gives a copy to update."""
    op = "vfwd"
    STATE_EXTRA = 1  # state_len = width - 1 + this (speculative decoding keeps a longer window)

    def _state_len(self, shape: Shape) -> int:
        return shape.width - 1 + self.STATE_EXTRA

    def bytes_moved(self, shape: Shape) -> int:
        xb, wb = DTYPES[shape.x_dtype][1], DTYPES[shape.w_dtype][1]
        states = shape.batch * shape.dim * self._state_len(shape) * xb
        return 2 * shape.dim * shape.seqlen * xb + shape.dim * (shape.width + shape.bias) * wb \
            + states * (shape.initial_states + shape.final_states) + 4 * (shape.batch + 1)

    def make_inputs(self, shape: Shape, seed: int, device: str = "cuda") -> dict[str, Any]:
        import torch
        gen = torch.Generator().manual_seed(seed)
        xd, wd = _torch_dtype(shape.x_dtype), _torch_dtype(shape.w_dtype)
        d, total, w, n = shape.dim, shape.seqlen, shape.width, shape.batch
        lens = varlen_lengths(n, total)
        cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(n)], dtype=torch.int32)
        if shape.layout == "cf":
            x = _randn((d, total), seed, 1, xd, device)
        else:  # (total_tokens, dim) memory viewed as (dim, total_tokens)
            x = _randn((total, d), seed, 1, xd, device).t()
        inputs = dict(x=x, weight=(torch.randn(d, w, generator=gen) / w ** 0.5).to(wd).to(device),
                      bias=torch.randn(d, generator=gen).to(wd).to(device) if shape.bias else None,
                      cu_seqlens=cu.to(device), pool=None, cache_indices=None, has_initial_state=None)
        if shape.final_states or shape.initial_states:
            pool = n + 4
            inputs["pool"] = torch.randn(pool, self._state_len(shape), d, generator=gen).to(xd).to(device) \
                .transpose(1, 2)  # vLLM's allocation: dim contiguous
            inputs["cache_indices"] = torch.randperm(pool, generator=gen)[:n].to(torch.int32).to(device)
        if shape.initial_states:
            inputs["has_initial_state"] = (torch.rand(n, generator=gen) < 0.7).to(device)
        return inputs

    def make_outputs(self, shape: Shape, inputs: dict[str, Any]) -> dict[str, Any]:
        import torch
        x = inputs["x"]
        nan = float("nan")
        out = torch.full_like(x, nan) if shape.layout == "cf" else \
            torch.full((x.shape[1], x.shape[0]), nan, dtype=x.dtype, device=x.device).t()
        outputs = dict(out=out)
        if inputs["pool"] is not None:
            outputs["conv_states"] = inputs["pool"].clone()
        return outputs

    def reference(self, shape: Shape, inputs: dict[str, Any]) -> dict[str, Any]:
        from ..reference import causal_conv1d_varlen_ref
        d = lambda t: None if t is None else t.double()  # noqa: E731
        out, states = causal_conv1d_varlen_ref(
            d(inputs["x"]), d(inputs["weight"]), d(inputs["bias"]), inputs["cu_seqlens"], d(inputs["pool"]),
            inputs["cache_indices"], inputs["has_initial_state"],
            activation="silu" if shape.activation == "silu" else None)
        return dict(out=out) if states is None else dict(out=out, conv_states=states)

    def launch(self, rt: Any, kernel: dict, shape: Shape, inputs: dict[str, Any],
               outputs: dict[str, Any], stream: int) -> None:
        from ..varlen import _call_args
        args = _call_args(inputs["x"], inputs["weight"], inputs["bias"], inputs["cu_seqlens"],
                          outputs.get("conv_states"), inputs["cache_indices"], inputs["has_initial_state"],
                          outputs["out"], shape.activation == "silu", -1, max(varlen_lengths(shape.batch, shape.seqlen)),
                          shape.width, stream)
        rt.launch_varlen(kernel, *args)


class UpdProblem:
    """The decode update: x (batch, dim) (or (batch, dim, seqlen)) against a state of
    state_len = width-1 (vLLM's caches), or width with the shape's width_state ("wstate",
    HF transformers'), laid out as the shape's layout says ("cl": dim contiguous, vLLM's
    pools; "cf": state_len contiguous, the peer's and HF's). The state is an output:
    make_outputs hands the kernel a copy of the input state to update. With the
    shape's state_indices ("pool"), the states are rows of a pool of 2 * batch + 1
    picked by shuffled, distinct conv_state_indices (as a serving engine's are). A decode
    step's kernel runs between a model's other kernels: timed after an L2 flush (measure.py)."""
    op = "upd"
    runs_between_kernels = True

    @staticmethod
    def state_len(shape: Shape) -> int:
        return shape.width if shape.width_state else shape.width - 1

    def bytes_moved(self, shape: Shape) -> int:
        """x and out; the state's width-1 entries read (the window, which is also all that a
        state of width entries keeps after the shift) and its state_len entries written; the
        weights, bias and indices."""
        xb, wb = DTYPES[shape.x_dtype][1], DTYPES[shape.w_dtype][1]
        tokens = shape.batch * shape.dim * shape.seqlen
        state = shape.batch * shape.dim * (shape.width - 1 + self.state_len(shape))
        return 2 * tokens * xb + state * xb + shape.dim * (shape.width + shape.bias) * wb \
            + 4 * shape.batch * shape.state_indices

    def make_inputs(self, shape: Shape, seed: int, device: str = "cuda") -> dict[str, Any]:
        import torch
        gen = torch.Generator().manual_seed(seed)
        xd, wd = _torch_dtype(shape.x_dtype), _torch_dtype(shape.w_dtype)
        b, d, l, w = shape.batch, shape.dim, shape.seqlen, shape.width
        m = self.state_len(shape)
        x = torch.randn(b, d, l, generator=gen).to(xd).to(device)
        if l == 1:
            x = x[:, :, 0].contiguous()
        pool = 2 * b + 1 if shape.state_indices else b
        if shape.layout == "cf":
            # state_len contiguous. At width 2 a dense (b, d, 1) state is also dim-contiguous,
            # which the runtime serves as "cl": give each channel a 2-slot row instead.
            rows = torch.randn(pool, d, max(m, 2), generator=gen).to(xd).to(device)
            state = rows[:, :, :m]
        else:
            state = torch.randn(pool, m, d, generator=gen).to(xd).to(device).transpose(1, 2)
        bias = torch.randn(d, generator=gen).to(wd).to(device) if shape.bias else None
        indices = torch.randperm(pool, generator=gen)[:b].to(torch.int32).to(device) if shape.state_indices else None
        return dict(x=x, conv_state=state, weight=(torch.randn(d, w, generator=gen) / w ** 0.5).to(wd).to(device),
                    bias=bias, conv_state_indices=indices)

    def make_outputs(self, shape: Shape, inputs: dict[str, Any]) -> dict[str, Any]:
        import torch
        state = inputs["conv_state"]  # a copy with the same strides (clone() would densify a sliced state)
        copy = torch.empty_strided(state.shape, state.stride(), dtype=state.dtype, device=state.device)
        return dict(out=torch.full_like(inputs["x"], float("nan")), conv_state=copy.copy_(state))

    def reference(self, shape: Shape, inputs: dict[str, Any]) -> dict[str, Any]:
        import torch
        from ..reference import causal_conv1d_update_ref
        state = inputs["conv_state"].clone()
        b = inputs["bias"]
        out = causal_conv1d_update_ref(inputs["x"], state, inputs["weight"].double(),
                                       None if b is None else b.double(),
                                       activation="silu" if shape.activation == "silu" else None,
                                       conv_state_indices=inputs.get("conv_state_indices"),
                                       out_dtype=torch.float64)
        return dict(out=out, conv_state=state.double())

    def launch_args(self, shape: Shape, inputs: dict[str, Any], outputs: dict[str, Any]) -> tuple:
        from ..update import _upd_call_args
        return _upd_call_args(inputs["x"], outputs["conv_state"], inputs["weight"], inputs["bias"], None,
                              inputs.get("conv_state_indices"), None, outputs["out"], -1,
                              shape.activation == "silu")

    def launch(self, rt: Any, kernel: dict, shape: Shape, inputs: dict[str, Any],
               outputs: dict[str, Any], stream: int) -> None:
        # as_plan: the kernel users' calls run (their plans' fixed kernel)
        rt.launch_upd(kernel, *self.launch_args(shape, inputs, outputs), stream, as_plan=True)

    def plan_options(self, rt: Any, shape: Shape, inputs: dict[str, Any],
                     outputs: dict[str, Any]) -> list[str] | None:
        """FwdProblem.plan_options for the update (rt.upd_plan_fixes, rt.upd_fixed_options)."""
        args = self.launch_args(shape, inputs, outputs)
        return rt.upd_fixed_options(*args) if rt.upd_plan_fixes(*args) else None

    def shape_plan_options(self, rt: Any, shape: Shape) -> list[str] | None:
        """plan_options for the buffers the tuner times the shape with: made on the CPU
        (a decode step's buffers are small), with the layouts make_inputs gives."""
        inputs = self.make_inputs(shape, seed=0, device="cpu")
        return self.plan_options(rt, shape, inputs, self.make_outputs(shape, inputs))


PROBLEMS: dict[str, Problem] = {"fwd": FwdProblem(), "bwd": BwdProblem(), "vfwd": VarlenProblem(),
                                 "upd": UpdProblem()}


def problem_for(op: str) -> Problem:
    try:
        return PROBLEMS[op]
    except KeyError:
        raise ValueError(f"op: no tuner problem for {op!r}; known: {sorted(PROBLEMS)}") from None
