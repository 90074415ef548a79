"""The decode update's spaces (op "upd", causal_conv1d_update).

The layout of an update family is conv_state's: "cf" when dim is not its
contiguous axis (the peer's (pool, dim, state_len) with state_len contiguous,
or any other strides), "cl" when dim is contiguous (vLLM's pools). A block owns
`threads * VE` channels (VE = vec_bytes / element size, adjacent per thread) of
`rows` batch rows; each thread keeps its channels' weights in registers for all
its rows. The common decode step (one token, state_len = width-1, no circular
buffer or speculative window) issues every row's loads before any use; the rest
walks the tokens with the width-1 window in registers, row by row. Decode moves
a few bytes per channel, so the tunables trade parallelism (blocks at batch 1)
against per-block overhead and bytes in flight (batch 256).
"""
from __future__ import annotations

from .space import MAX_REGS, Arch, Config, Family, Param, Space, _regs_distinct, _vec_elems, _vec_fits


def _upd_geometry(family: Family, config: Config) -> dict:
    threads = int(config["threads"])
    # tile_l: batch rows per block; tile_d: channels per block.
    return dict(threads=threads, tile_l=int(config["rows"]), tile_d=threads * _vec_elems(family, config),
                smem_bytes=0, align_bytes=int(config["vec_bytes"]), split_blocks=0)


def _upd_registers_fit(family: Family, config: Config, arch: Arch) -> str | None:
    ve = _vec_elems(family, config)
    # Weights and bias for the block's life, and x plus the window of every row in flight.
    regs = (family.width + 1) * ve + int(config["rows"]) * family.width * ve
    budget = min(128, int(config["max_regs"]) - 24)
    if regs > budget:
        return f"weights, windows and tokens need {regs} registers (> {budget})"
    return None


_THREADS = Param("threads", "t", (64, 128, 256), "threads per block (VE adjacent channels each)")
_VEC = Param("vec_bytes", "v", (2, 4, 8, 16), "bytes of adjacent channels per thread (x, out, and the state "
                                              "where its layout allows vectors)")
_ROWS = Param("rows", "r", (1, 2, 4, 8), "batch rows per block: weights loaded once, every row's loads in flight "
                                          "together")
# Measured on the H100 (same run): "after" 3.7 -> 3.3 us at batch 16 and 5.7 -> 5.1 us at
# batch 64; at batch 256 under a 96-register cap it spills, 11.6 -> 14.4 us.
_WEIGHTS = Param("weights", "o", ("first", "after"), "the decode step's weights: once before the rows, or per "
                                                     "row group after its rows' loads are issued")

# Defaults: "after" spills from width 8 (rows 2, no cap), so wider windows load the weights first.
_PREFERRED = (dict(threads=64, vec_bytes=8, rows=2, weights="after", max_regs=255, widths=(2, 3, 4, 5, 6, 7)),
              dict(threads=64, vec_bytes=8, rows=2, weights="first", max_regs=255),
              dict(threads=64, vec_bytes=8, rows=1, weights="first", max_regs=255))

# Both layouts share the tunables; the state moves differently: "cl" one vector per
# window entry, "cf" packed (pool, dim, width-1) one run of VE * (width-1) elements.
# 64 threads of 8-byte vectors: dim 5120 in bf16 gives 20 channel blocks per row
# group, some parallelism at batch 1; two rows a block halve the blocks at batch 256.
UPD_CF = Space(
    op="upd", layout="cf", template="upd.cu.j2",
    params=(_THREADS, _VEC, _ROWS, _WEIGHTS, MAX_REGS),
    constraints=(_vec_fits, _upd_registers_fit, _regs_distinct),
    preferred=_PREFERRED,
    geometry=_upd_geometry,
)

UPD_CL = Space(
    op="upd", layout="cl", template="upd.cu.j2",
    params=(_THREADS, _VEC, _ROWS, _WEIGHTS, MAX_REGS),
    constraints=(_vec_fits, _upd_registers_fit, _regs_distinct),
    preferred=_PREFERRED,
    geometry=_upd_geometry,
)
