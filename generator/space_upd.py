"""The decode update's spaces (op "upd", causal_conv1d_update).

The layout of an update family is conv_state's: "cf" when dim is not its
contiguous axis (the peer's (pool, dim, state_len) with state_len contiguous,
or any other strides), "cl" when dim is contiguous (vLLM's pools). A block owns
`threads * channels-per-thread` channels of `rows` batch rows; each thread keeps
its channels' weights in registers for all its rows and walks the tokens with
the width-1 window in registers. Decode moves a few bytes per channel, so the
tunables trade parallelism (blocks at batch 1) against per-block overhead
(weights, index loads at batch 256).
"""
from __future__ import annotations

from .space import MAX_REGS, Arch, Config, Family, Param, Space, _regs_distinct, _vec_elems, _vec_fits


def _upd_geometry(family: Family, config: Config) -> dict:
    threads = int(config["threads"])
    ve = max(1, _vec_elems(family, config)) if "vec_bytes" in config else 1
    # tile_l: batch rows per block; tile_d: channels per block.
    return dict(threads=threads, tile_l=int(config["rows"]), tile_d=threads * ve, smem_bytes=0,
                align_bytes=int(config["vec_bytes"]) if "vec_bytes" in config else family.x_bytes, split_blocks=0)


def _upd_registers_fit(family: Family, config: Config, arch: Arch) -> str | None:
    ve = max(1, _vec_elems(family, config))
    regs = (2 * family.width + 1) * ve  # weights, bias and the window per channel
    budget = min(128, int(config["max_regs"]) - 24)
    if regs > budget:
        return f"weights and window need {regs} registers (> {budget})"
    return None


_THREADS = Param("threads", "t", (64, 128, 256), "threads per block (one channel vector each)")
_ROWS = Param("rows", "r", (1, 2, 4), "batch rows per block (weights loaded once for all)")

UPD_CF = Space(
    op="upd", layout="cf", template="upd.cu.j2",
    params=(_THREADS, _ROWS, MAX_REGS),
    constraints=(_regs_distinct,),
    preferred=(dict(threads=128, rows=1, max_regs=255),),
    geometry=_upd_geometry,
)

UPD_CL = Space(
    op="upd", layout="cl", template="upd.cu.j2",
    params=(_THREADS, Param("vec_bytes", "v", (2, 4, 8, 16), "bytes per vector access along dim"),
            _ROWS, MAX_REGS),
    constraints=(_vec_fits, _upd_registers_fit, _regs_distinct),
    # 8-byte vectors and 64 threads: dim 5120 in bf16 gives 20 blocks per batch row,
    # enough parallelism at batch 1 without tiny blocks at batch 256.
    preferred=(dict(threads=64, vec_bytes=8, rows=1, max_regs=255),),
    geometry=_upd_geometry,
)
