"""The variant space as data: families, tunable parameters, constraints.

A *family* fixes what a kernel computes (op, layout, dtypes, width); a
*config* picks the tunables (threads, vector width, tiles, ...) of the
family's space. Constraints are plain functions of (family, config, arch)
returning ``None`` when valid or a short reason, so the space can be pruned
before anything compiles.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Callable, Mapping

# Bump when a template change alters the kernel ABI or semantics: tuning DB
# entries from another epoch are ignored by the runtime.
EPOCH = 2

OPS = ("fwd", "bwd", "vfwd", "upd")  # vfwd: varlen prefill with a state pool; upd: the decode update
LAYOUTS = ("cf", "cl")  # channel-first: seqlen contiguous; channel-last: dim contiguous
WIDTHS = tuple(range(2, 9))
# dtype name -> (kernel storage type, bytes)
DTYPES: Mapping[str, tuple[str, int]] = {
    "f32": ("float", 4),
    "f16": ("cc1d_f16", 2),
    "bf16": ("cc1d_bf16", 2),
}
# weight dtype is x's dtype or fp32
DTYPE_PAIRS = (("f32", "f32"), ("f16", "f16"), ("f16", "f32"), ("bf16", "bf16"), ("bf16", "f32"))


@dataclass(frozen=True)
class Arch:
    target: str        # sm_90, gfx942, ...
    vendor: str        # cuda | hip
    warp_size: int
    max_threads: int = 1024
    smem_bytes: int = 48 * 1024


ARCHS: Mapping[str, Arch] = {
    "sm_80": Arch("sm_80", "cuda", 32),
    "sm_86": Arch("sm_86", "cuda", 32),
    "sm_89": Arch("sm_89", "cuda", 32),
    "sm_90": Arch("sm_90", "cuda", 32),
    "gfx90a": Arch("gfx90a", "hip", 64),
    "gfx942": Arch("gfx942", "hip", 64),
    "gfx1100": Arch("gfx1100", "hip", 32),
}


def arch_info(target: str) -> Arch:
    """The Arch for a target name; unknown sm_/gfx targets get their vendor's defaults."""
    if target in ARCHS:
        return ARCHS[target]
    if target.startswith("sm_") and target[3:].rstrip("a").isdigit():
        return Arch(target, "cuda", 32)
    if target.startswith("gfx"):
        return Arch(target, "hip", 32 if target.startswith(("gfx10", "gfx11", "gfx12")) else 64)
    raise ValueError(f"arch: expected an NVIDIA target like 'sm_90' or an AMD target like "
                     f"'gfx942', got {target!r}")


@dataclass(frozen=True)
class Family:
    """What a kernel computes; every variant of a family gives the same results."""
    op: str
    layout: str
    x_dtype: str
    w_dtype: str
    width: int

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"op: expected one of {OPS}, got {self.op!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {self.layout!r}")
        if (self.x_dtype, self.w_dtype) not in DTYPE_PAIRS:
            raise ValueError(f"dtypes: expected (x, weight) in {DTYPE_PAIRS}, "
                             f"got ({self.x_dtype!r}, {self.w_dtype!r})")
        if self.width not in WIDTHS:
            raise ValueError(f"width: expected {WIDTHS[0]}..{WIDTHS[-1]}, got {self.width!r}")

    def key(self) -> str:
        return f"{self.op}.{self.layout}.{self.x_dtype}w{self.w_dtype}.w{self.width}"

    @property
    def x_bytes(self) -> int:
        return DTYPES[self.x_dtype][1]


def families(op: str | None = None, layout: str | None = None) -> list[Family]:
    """Every family, in a stable order."""
    return [Family(o, lay, x, w, width)
            for o in OPS if op in (None, o)
            for lay in LAYOUTS if layout in (None, lay)
            for x, w in DTYPE_PAIRS
            for width in WIDTHS]


@dataclass(frozen=True)
class Param:
    name: str
    abbrev: str        # prefix in variant keys: t128, v16, ...
    values: tuple
    doc: str


Config = Mapping[str, object]
Constraint = Callable[[Family, Config, Arch], "str | None"]


@dataclass(frozen=True)
class Space:
    """The tunables of one (op, layout), their constraints and launch geometry."""
    op: str
    layout: str
    template: str
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...]
    preferred: tuple[Mapping[str, object], ...]  # default configs, best first; "widths" / "x_dtypes": only for those
    geometry: Callable[[Family, Config], dict]    # -> threads, tile_l, tile_d, smem_bytes, align_bytes, split_blocks

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def why_invalid(self, family: Family, config: Config, arch: Arch) -> str | None:
        names = {p.name for p in self.params}
        if set(config) != names:
            return f"config keys {sorted(config)} differ from the space's {sorted(names)}"
        for p in self.params:
            if config[p.name] not in p.values:
                return f"{p.name}={config[p.name]!r} not in {p.values}"
        if self.geometry(family, config)["threads"] % arch.warp_size:
            return f"threads not a multiple of the warp size {arch.warp_size}"
        for check in self.constraints:
            reason = check(family, config, arch)
            if reason:
                return reason
        return None


def _vec_elems(family: Family, config: Config) -> int:
    return int(config["vec_bytes"]) // family.x_bytes


def _vec_fits(family: Family, config: Config, arch: Arch) -> str | None:
    if int(config["vec_bytes"]) < family.x_bytes:
        return f"vec_bytes {config['vec_bytes']} below the element size {family.x_bytes}"
    return None


REGISTER_FILE = 65536  # 32-bit registers per SM (NVIDIA); per-arch bounds: occupancy_bounds()

MAX_REGS = Param("max_regs", "g", (255, 128, 96, 64),
                 "register cap per thread: sets the occupancy the compiler must allow")


def occupancy_bounds(threads: int, max_regs: int) -> dict:
    """What a register cap becomes in the kernel: CUDA's minimum blocks per SM
    (__launch_bounds__) and AMD's minimum waves per SIMD. AMD gets twice the
    registers: hipRTC's 64-bit indexing needs more, and with fewer (measured as
    spills on gfx942, never timed) the cap would cost scratch memory."""
    if max_regs >= 255:  # no cap: the compiler's own choice
        return dict(min_blocks=1, waves_per_eu=1)
    return dict(min_blocks=max(1, REGISTER_FILE // (threads * max_regs)),
                waves_per_eu=max(1, 256 // max_regs))


def _regs_distinct(family: Family, config: Config, arch: Arch) -> str | None:
    threads, cap = int(config["threads"]), int(config["max_regs"])
    looser = [v for v in MAX_REGS.values if v > cap]
    if looser and occupancy_bounds(threads, cap)["min_blocks"] == \
            occupancy_bounds(threads, min(looser))["min_blocks"]:
        return f"max_regs {cap} bounds {threads} threads no tighter than max_regs {min(looser)}"
    return None


# ---- forward, channel-first -------------------------------------------------

def _cf_rows_fit(family: Family, config: Config, arch: Arch) -> str | None:
    if int(config["threads"]) // int(config["rows"]) < 32:
        return "fewer than 32 threads per channel row"
    return None


def _cf_geometry(family: Family, config: Config) -> dict:
    threads, rows = int(config["threads"]), int(config["rows"])
    ve = max(1, _vec_elems(family, config))
    return dict(threads=threads, tile_l=threads // rows * ve * int(config["nvec"]), tile_d=rows,
                smem_bytes=0, align_bytes=int(config["vec_bytes"]), split_blocks=0)


FWD_CF = Space(
    op="fwd", layout="cf", template="fwd_channel_first.cu.j2",
    params=(
        Param("threads", "t", (64, 128, 256), "threads per block"),
        Param("vec_bytes", "v", (2, 4, 8, 16), "bytes per vector load/store"),
        Param("nvec", "n", (1, 2, 4, 8), "vectors per thread (loads in flight)"),
        Param("rows", "r", (1, 4), "channels per block"),
        Param("halo", "h", ("shfl", "reload"), "how the width-1 previous inputs are fetched"),
        MAX_REGS,
    ),
    constraints=(_vec_fits, _cf_rows_fit, _regs_distinct),
    # Defaults: 128 registers (8 blocks of 64) measured 1.8x faster than no cap on the
    # H100; wider windows need fewer vectors in flight to fit without spilling.
    preferred=(dict(threads=64, vec_bytes=16, nvec=4, rows=1, halo="shfl", max_regs=128, widths=(2, 3, 4, 5)),
               dict(threads=64, vec_bytes=16, nvec=2, rows=1, halo="shfl", max_regs=128)),
    geometry=_cf_geometry,
)


# ---- forward, channel-last ----------------------------------------------------

def _cl_tile_fits(family: Family, config: Config, arch: Arch) -> str | None:
    ve = _vec_elems(family, config)
    if ve < 1:
        return None  # reported by _vec_fits
    tile_d, threads = int(config["tile_d"]), int(config["threads"])
    if tile_d % ve:
        return f"tile_d {tile_d} not a multiple of the vector's {ve} elements"
    tc = tile_d // ve
    if tc > threads or threads % tc:
        return f"{tc} threads across channels do not divide {threads} threads"
    if tile_d * family.x_bytes < 32:
        return "channel tile narrower than one 32-byte sector"
    return None


def _cl_geometry(family: Family, config: Config, per_thread: str = "rows_per_thread") -> dict:
    """Channel-last tiling: tile_d channels across the block, `per_thread` positions per thread along L."""
    threads = int(config["threads"])
    ve = max(1, _vec_elems(family, config))
    tc = int(config["tile_d"]) // ve
    return dict(threads=threads, tile_l=threads // max(tc, 1) * int(config[per_thread]),
                tile_d=int(config["tile_d"]), smem_bytes=0, align_bytes=int(config["vec_bytes"]),
                split_blocks=int(config.get("split_blocks", 0)))


def _packed_words(config: Config) -> int:
    """32-bit words of one vector as loaded (kept packed while in flight)."""
    return max(1, int(config["vec_bytes"]) // 4)


def fwd_cl_registers(family: Family, config: Config) -> int:
    """Registers the channel-last forward's compute holds, counted in floats: per
    channel of its vector the weights, bias, HALO-row window and one row."""
    ve = max(1, _vec_elems(family, config))
    return ve * (2 * family.width + 1)


def _fwd_cl_registers_fit(family: Family, config: Config, arch: Arch) -> str | None:
    # From ptxas for sm_90 (bf16 and f32, widths 2-8, 4- to 16-byte vectors): the
    # variants whose count is within 9/16 of the cap compiled without spills; the
    # rest is addresses, loop state and the staging. hipRTC for gfx942 spilled at
    # 36 of 64 (its 64-bit indexing): half the cap there.
    cap = int(config["max_regs"])
    share = (9, 16) if arch.vendor == "cuda" else (1, 2)
    need, budget = fwd_cl_registers(family, config), cap * share[0] // share[1]
    if need > budget:
        return (f"weights, window and a row need {need} registers "
                f"(> {budget}, {share[0]}/{share[1]} of max_regs {cap})")
    return None


def fwd_cl_tile_bytes(family: Family, config: Config) -> int:
    """Shared memory of the channel-last forward's staged tile: its rows plus the halo,
    and one int per row for their sequence ids."""
    rows = _cl_geometry(family, config)["tile_l"] + family.width - 1
    return rows * (int(config["tile_d"]) * family.x_bytes + 4)


def _fwd_cl_tile_fits(family: Family, config: Config, arch: Arch) -> str | None:
    need = fwd_cl_tile_bytes(family, config)
    if need > arch.smem_bytes:
        return f"staged tile of {need} bytes exceeds {arch.smem_bytes} bytes of shared memory"
    return None


FWD_CL = Space(
    op="fwd", layout="cl", template="fwd_channel_last.cu.j2",
    params=(
        Param("threads", "t", (64, 128, 256), "threads per block"),
        Param("vec_bytes", "v", (2, 4, 8, 16), "bytes per vector copy, load and store (along dim)"),
        Param("tile_d", "d", (32, 64, 128, 256), "channels per block"),
        Param("rows_per_thread", "l", (4, 8, 16, 32), "consecutive positions per thread"),
        MAX_REGS,
    ),
    constraints=(_vec_fits, _cl_tile_fits, _fwd_cl_tile_fits, _fwd_cl_registers_fit, _regs_distinct),
    # Defaults: the most warps per SM whose registers fit the window without spills
    # (fp16's conversions need a few more registers: at 64 its width 4 spills).
    preferred=(dict(threads=128, vec_bytes=8, tile_d=128, rows_per_thread=16, max_regs=64, x_dtypes=("bf16", "f32")),
               dict(threads=128, vec_bytes=8, tile_d=64, rows_per_thread=16, max_regs=96),
               dict(threads=128, vec_bytes=8, tile_d=64, rows_per_thread=16, max_regs=128),
               dict(threads=128, vec_bytes=8, tile_d=64, rows_per_thread=8, max_regs=255)),
    geometry=_cl_geometry,
)

# ---- backward ---------------------------------------------------------------
# Same tiling ideas as the forward; each thread also keeps fp32 partial sums of
# dweight/dbias, reduced per block in a fixed order (no atomics).

# The partial-sum layout: cc1d_kernel's grid is (splits, channel groups) with
# splits = max(1, min(work items, ceil(split_blocks / channel groups))) (the
# channel-last backward's values and rounding are its own, below), and
# dweight/dbias are first summed into [splits][dim][width + 1] fp32 partials,
# then in split order by cc1d_reduce. More blocks balance the SMs better;
# fewer make fewer partial rows to write and reduce. A launch parameter only:
# it does not change the kernel source, and it is a constant (not the device's
# SM count) so results are bitwise the same on every device. 32768 and 131072
# (session 81): at 8192 a long row's few work items fall unevenly on its splits
# (batch 8 of 16384 positions, 4096-position tiles, dim 5120 in 4-row groups: 32
# items on 7 splits, 4 or 5 a block); 131072 gives most shapes one item a block.
# Measured (H200, docs/PERFORMANCE_NOTES.md): no gain at 8192-16384 positions, 2 %
# at (8, 5120, 2048); the (1, 5376, 32768) backward winners took 131072.
SPLIT_BLOCKS = Param("split_blocks", "s", (512, 2048, 8192, 32768, 131072),
                     "blocks the backward's grid aims at: sets the rows of fp32 partial sums")

def _bwd_cf_geometry(family: Family, config: Config) -> dict:
    threads, rows = int(config["threads"]), int(config["rows"])
    ve = max(1, _vec_elems(family, config))
    return dict(threads=threads, tile_l=threads // rows * ve * int(config["nvec"]), tile_d=rows,
                smem_bytes=0, align_bytes=int(config["vec_bytes"]), split_blocks=int(config["split_blocks"]))


# Above 4 vectors a thread, a channel-first backward segment is walked: its vectors'
# loads go through a ring of this many stages in shared memory (templates/
# bwd_channel_first.cu.j2, WALK_STAGES), not held in registers.
BWD_CF_HELD_NVEC = 4
BWD_CF_WALK_STAGES = 4


def bwd_cf_walked(config: Config) -> bool:
    return int(config["nvec"]) > BWD_CF_HELD_NVEC


def bwd_cf_smem_bytes(family: Family, config: Config) -> int:
    """Static shared memory of the channel-first backward: the block's fp32 sums of
    dweight/dbias (one row a thread), and a walked segment's ring (x and dout)."""
    threads = int(config["threads"])
    sums = threads * (family.width + 1) * 4
    vec = max(int(config["vec_bytes"]), 4)  # a 2-byte vector's slot is one word
    ring = threads * BWD_CF_WALK_STAGES * 2 * vec if bwd_cf_walked(config) else 0
    return sums + ring


def _bwd_cf_smem_fits(family: Family, config: Config, arch: Arch) -> str | None:
    need = bwd_cf_smem_bytes(family, config)
    if need > arch.smem_bytes:
        return f"dweight sums and ring of {need} bytes exceed {arch.smem_bytes} bytes of shared memory"
    return None


def _bwd_cf_registers_fit(family: Family, config: Config, arch: Arch) -> str | None:
    # A rule of thumb from ptxas samples (sm_90, every dtype, widths 2-8): the packed
    # x and dout vectors in flight take at most a quarter of a capped budget, and the
    # edge path's windows (which grow with the width) need more than 64 registers
    # past width 2 and more than 96 past width 5. Near the line a candidate can
    # still spill a little: the tuner times it like any other. A walked segment holds
    # three vectors a step (x of two, dout of one), whatever its length; under 64
    # registers its walk loop kept clear of spills up to width 4 (ptxas, sm_90: bf16,
    # bf16/f32, f16 and f32 at widths 3-4; the edge path, run once a row, spills).
    cap = int(config["max_regs"])
    if cap >= 255:
        return None
    walked = bwd_cf_walked(config)
    held = 3 if walked else 2 * int(config["nvec"])
    in_flight = held * _packed_words(config)
    if 4 * in_flight > cap:
        return f"{in_flight} registers of loads in flight exceed a quarter of max_regs {cap}"
    widest = {64: 4 if walked else 2, 96: 5}.get(cap, WIDTHS[-1])
    if family.width > widest:
        return f"width {family.width} needs more than max_regs {cap} (at most width {widest})"
    return None


BWD_CF = Space(
    op="bwd", layout="cf", template="bwd_channel_first.cu.j2",
    params=(
        Param("threads", "t", (64, 128, 256), "threads per block"),
        Param("vec_bytes", "v", (2, 4, 8, 16), "bytes per vector load/store of x, dout and dx"),
        Param("nvec", "n", (1, 2, 4, 8, 16, 32, 64),
              "vectors of x and of dout per thread and segment: up to 4 all loaded at once into "
              "registers; 8 to 64 walked, their loads staged through a ring in shared memory"),
        Param("rows", "r", (1, 4), "channels per block"),
        MAX_REGS,
        SPLIT_BLOCKS,
    ),
    constraints=(_vec_fits, _cf_rows_fit, _regs_distinct, _bwd_cf_registers_fit, _bwd_cf_smem_fits),
    # Defaults. bf16 widths 2-4, measured on the H100 (width 4, session 5): 64 threads
    # with 4 vectors of x and 4 of dout in flight under a 128-register cap reached 91 %
    # of copy at (8, 5120, 2048), 128 threads with 2 vectors 75 %; with 4 vectors other
    # dtypes and widths spill a few bytes under the cap (ptxas, sm_90). Elsewhere 2
    # vectors, capped at 128 registers up to width 6 and uncapped for 7-8 (they spill).
    preferred=(dict(threads=64, vec_bytes=16, nvec=4, rows=1, max_regs=128, split_blocks=2048,
                    widths=(2, 3, 4), x_dtypes=("bf16",)),
               dict(threads=128, vec_bytes=16, nvec=2, rows=1, max_regs=128, split_blocks=2048,
                    widths=(2, 3, 4, 5, 6)),
               dict(threads=128, vec_bytes=16, nvec=2, rows=1, max_regs=255, split_blocks=2048)),
    geometry=_bwd_cf_geometry,
)


# Channel-last: each thread streams one equal range of the channel group's steps
# (templates/bwd_channel_last.cu.j2), so the grid's size, not a tile, sets the work
# per thread: split_blocks is the whole grid, a whole number of waves of resident
# blocks on sm_90's 132 SMs (2, 4, 5, 8, 10 or 16 blocks per SM: the occupancies
# of 64-256 threads at the register caps, once or twice). The runtime rounds
# split_blocks / channel groups down, so the grid never spills into a part-wave.
STEP = Param("step", "u", (2, 4, 8, 16), "rows whose x and dout loads are in flight together")
CL_SPLIT_BLOCKS = Param("split_blocks", "s", tuple(132 * k for k in (2, 4, 5, 8, 10, 16)),
                        "blocks of the backward's grid, whole waves of resident blocks on 132 SMs: "
                        "sets each thread's share of the work and the rows of fp32 partial sums")


def bwd_cl_registers(family: Family, config: Config) -> int:
    """Registers a thread needs, counted in floats: per channel of its vector, the
    rolling x and g windows (2 * HALO), weights and bias, dweight/dbias sums
    (W + 1 each); the loads in flight (a step's x and dout rows, or the run
    start's 2 * HALO x and HALO dout rows) as packed words; one row unpacked."""
    ve = max(1, _vec_elems(family, config))
    halo = family.width - 1
    state = ve * (2 * halo + 2 * (family.width + 1))
    inflight = max(2 * int(config["step"]), 3 * halo) * _packed_words(config)
    return state + inflight + 3 * ve


def _bwd_cl_registers_fit(family: Family, config: Config, arch: Arch) -> str | None:
    need = bwd_cl_registers(family, config)
    budget = int(config["max_regs"]) - BWD_CL_OVERHEAD
    if need > budget:
        return f"windows, sums and loads in flight need {need} registers (> {budget})"
    return None


# Registers besides bwd_cl_registers (addresses, strides, loop state, the edge
# path's checks), from ptxas for sm_90. Within this margin most variants compile
# without spills; some spill 4-112 bytes (at cap 96 mostly; 8 bytes at 128 for
# 16-bit x with 8-byte vectors and step 8 at width 2): the tuner times them like
# any other, and the defaults, which run untuned, are checked spill-free
# (test_compile_nvidia).
BWD_CL_OVERHEAD = 40


BWD_CL = Space(
    op="bwd", layout="cl", template="bwd_channel_last.cu.j2",
    params=(
        Param("threads", "t", (64, 128, 256), "threads per block"),
        Param("vec_bytes", "v", (2, 4, 8, 16), "bytes per vector load/store of x, dout and dx (along dim)"),
        Param("tile_d", "d", (32, 64, 128), "channels per block"),
        STEP, MAX_REGS, CL_SPLIT_BLOCKS,
    ),
    constraints=(_vec_fits, _cl_tile_fits, _bwd_cl_registers_fit, _regs_distinct),
    # Defaults: the most loads in flight per SM that fit 128 registers (16 warps of
    # 128 threads) without spills, in one wave of 4 blocks per SM. 8-byte vectors
    # for f32 x where they fit, else 4-byte vectors with a longer step (16-bit x
    # with 8-byte vectors spilled at width 3, the capped 4-byte one at width 7);
    # the uncapped one takes what no cap fits. The shipped DB's tuned winners do
    # better.
    preferred=(dict(threads=128, vec_bytes=8, tile_d=128, step=4, max_regs=128, split_blocks=528,
                    x_dtypes=("f32",)),
               dict(threads=128, vec_bytes=4, tile_d=64, step=8, max_regs=128, split_blocks=528,
                    widths=(2, 3, 4, 5, 6)),
               dict(threads=128, vec_bytes=4, tile_d=64, step=4, max_regs=255, split_blocks=528)),
    # tile_l: a block's threads along the sequence x step, the least work per block.
    geometry=functools.partial(_cl_geometry, per_thread="step"),
)

from .space_upd import UPD_CF, UPD_CL  # noqa: E402  (builds on the helpers above)

# ---- varlen prefill ------------------------------------------------------------
# The forward's kernels over the packed token stream as one sequence, then a kernel
# that mends each sequence's start, the padded sequences and the states: the same
# tunables (channel-first: up to 4 vectors a thread), constraints, defaults and
# geometry as the forward. The shipped DB has cc1d-tune's winners for bench_varlen's shapes.

# Channel-first adds where each sequence's first outputs are mended: "kernel" (the second
# kernel, a pass of its own over scattered sectors of x and out) or "tile" (the tile that
# stored them, after a barrier, while they are in cache; its blocks then wait on the
# initial state's read). On the H100 (session 45, the shipped configs with either) "tile"
# took 64 sequences of 16384 tokens from 173 to 145 us, and 64 of 65536 from 512 to 668:
# tuned per shape.
VFWD_CF = Space(op="vfwd", layout="cf", template="varlen_channel_first.cu.j2",
                params=tuple(Param(p.name, p.abbrev, (1, 2, 4), p.doc) if p.name == "nvec" else p
                             for p in FWD_CF.params)
                + (Param("mend", "m", ("kernel", "tile"), "who mends each sequence's first outputs"),),
                constraints=FWD_CF.constraints,
                preferred=tuple({**d, "mend": "kernel"} for d in FWD_CF.preferred), geometry=_cf_geometry)
VFWD_CL = Space(op="vfwd", layout="cl", template="varlen_channel_last.cu.j2", params=FWD_CL.params,
                constraints=FWD_CL.constraints, preferred=FWD_CL.preferred, geometry=_cl_geometry)

SPACES: Mapping[tuple[str, str], Space] = {("fwd", "cf"): FWD_CF, ("fwd", "cl"): FWD_CL,
                                           ("bwd", "cf"): BWD_CF, ("bwd", "cl"): BWD_CL,
                                           ("vfwd", "cf"): VFWD_CF, ("vfwd", "cl"): VFWD_CL,
                                           ("upd", "cf"): UPD_CF, ("upd", "cl"): UPD_CL}


def space_for(family: Family) -> Space:
    return SPACES[(family.op, family.layout)]
