"""Render a variant's kernel source from the Jinja2 templates."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

from .space import BWD_CF_WALK_STAGES, DTYPES, EPOCH, bwd_cf_walked, occupancy_bounds, space_for

if TYPE_CHECKING:
    from .variant import Variant

# Source tree: <repo>/templates; installed wheel: cc1d/templates (beside cc1d/generator).
TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"


@lru_cache(maxsize=4)
def _environment(template_dir: Path) -> jinja2.Environment:
    if not template_dir.is_dir():
        raise FileNotFoundError(f"cc1d templates not found at {template_dir}")
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def approx_sigmoid(family) -> bool:
    """Whether the backward's SiLU gradient takes its sigmoid from one tanh.approx, in
    halves (templates/bwd_common.cuh.j2: weights and bias halved, g doubled): where every
    output is bf16 (x and weights bf16), so the approximation's error (at most 2.5e-4 of
    the sigmoid) stays far below the outputs' rounding (2^-9), and only in the
    channel-first kernel, which is bound by instruction issue: on the H100 the sigmoid
    made it 2-4 % faster (session 34), the halves another 1-5 % (session 35). fp16 and
    fp32 outputs, fp32 dweight and the channel-last kernel keep ex2 + rcp: the
    channel-last winners ran up to 5 % slower with either change."""
    return family.op == "bwd" and family.layout == "cf" and family.x_dtype == family.w_dtype == "bf16"


def realign_max_regs(max_regs: int) -> int:
    """The register cap of a channel-first forward's realigned build (fwd_cf_tiles.cuh.j2,
    CC1D_FWD_REALIGN): 8 more where the tuned cap is 64 or less. Its partial vectors keep
    a few more values live across the tiles: at the shipped winners' 64-register caps the
    tile loop spilled up to 56 bytes. Session 60, H200, the (1, 4096, 2048) winner's twin
    at (2, 4096, 2047): 25.3 us at 64 registers, 24.9 at 72 (16 bytes spilled), 25.8 at
    80 (none: fewer blocks fit)."""
    return max_regs + 8 if max_regs <= 64 else max_regs


def bwd_realign_max_regs(max_regs: int, seq_idx: bool = False) -> int:
    """The register cap of a channel-first backward's realigned build (bwd_channel_first.cu.j2,
    CC1D_BWD_REALIGN): 128, whatever the variant's own cap, but for the seq_idx build of
    an uncapped (255) variant, which stays uncapped. Its partial vectors, computed alone
    after the segments, and the moved cut segment keep more values live: at the shipped
    winners' caps of 64 and 96 the twins spilled 40-152 bytes (ptxas, sm_90, session 61);
    at 128, none. Left uncapped the compiler gave the twins 158-177 registers where most
    plain builds of 128 threads or fewer take 128, so fewer blocks fit: session 64, H200,
    the shipped `t128.v16.n8.r4.g255` twin at (2, 4096, 2000 / 2048 / 4095) 55.8 / 39.7 /
    102.4 us at 168 registers, 45.9 / 33.9 / 88.8 at 128 (4 bytes spilled);
    `t128.v16.n16.r4.g255` at (2, 4096, 4001) 92.4 against 78.8. At 128 the 255-cap
    twins of the bf16 width-4 space spill nothing but `t64.v16.n{8,16}` (40 bytes, still
    9-14 % faster) and `t128.v16.n{8,16}.r4` (4); the width 7 and 8 defaults' twins, none.
    Their seq_idx builds would spill 40-236 bytes at 128 (their own take 198-233
    registers), and a call with seq_idx and an odd length was not timed: uncapped."""
    if seq_idx:
        return max(max_regs, 128)
    return 128


def bwd_twin_takes_cuts(family, config: dict) -> bool:
    """Whether the runtime serves a channel-first backward variant's aligned calls whose
    sequence cuts a segment (seqlen not a whole number of segments) through its realigned
    twin (dispatch.cpp cut_twin, read from the source's CC1D_BWD_CUT_TWIN). The twin moves
    the cut segment back onto the fast path where the plain build sends it to its edge
    path: held segments only (on NVIDIA GPUs, where the space gives every row a warp at
    least), and only where the variant's own register cap is the twin's (128) or looser,
    so that at least as many blocks fit. Session 62, H200, (2, 4096, 2000) / (2, 4096,
    4000) / (8, 5120, 2000) / (8, 5120, 3000): `t64.v16.n4.r1.g128`'s twin 40.2 / 77.6 /
    168.5 / 326.4 us, its plain build 101.3 / 129.2 / 480.3 / 621.7 (the peer 40.1 / 63.2
    / 159.9 / 216.3; session 64's twin: 154.9 and 291.1 at 5120 x 2000 / 3000). At a
    cap of 96 the twin (128) fits fewer blocks and won two of four (`t128.v16.n2.r4.g96`:
    58.7 / 117.3 / 298.9 / 451.6 against 63.8 / 107.1 / 297.5 / 395.2); walked segments
    lost all four (their twin moves nothing). Vectors of one element were not measured."""
    cap = int(config["max_regs"])
    return (int(config["vec_bytes"]) > family.x_bytes and not bwd_cf_walked(config) and
            cap >= bwd_realign_max_regs(cap))


# The realigned builds' register caps, by (op, layout).
REALIGN_CAPS = {("fwd", "cf"): realign_max_regs, ("bwd", "cf"): bwd_realign_max_regs}


def template_context(variant: "Variant") -> dict:
    fam = variant.family
    params = variant.params
    ctx = dict(
        op=fam.op, layout=fam.layout, width=fam.width,
        x_dtype=fam.x_dtype, w_dtype=fam.w_dtype,
        x_ctype=DTYPES[fam.x_dtype][0], w_ctype=DTYPES[fam.w_dtype][0],
        approx_sigmoid=approx_sigmoid(fam), **params,
    )
    if "max_regs" in params:
        ctx.update(occupancy_bounds(int(params["threads"]), int(params["max_regs"])))
        realign_cap = REALIGN_CAPS.get((fam.op, fam.layout))
        if realign_cap is not None:
            threads, cap = int(params["threads"]), int(params["max_regs"])
            ctx["realign_min_blocks"] = occupancy_bounds(threads, realign_cap(cap))["min_blocks"]
            if fam.op == "bwd":
                ctx["realign_seq_min_blocks"] = occupancy_bounds(threads, realign_cap(cap, seq_idx=True))["min_blocks"]
    if "vec_bytes" in params:
        ctx["vec_elems"] = int(params["vec_bytes"]) // fam.x_bytes
    if (fam.op, fam.layout) == ("bwd", "cf"):
        ctx.update(walked=bwd_cf_walked(params), walk_stages=BWD_CF_WALK_STAGES,
                   twin_takes_cuts=bwd_twin_takes_cuts(fam, params))
    return ctx


def render_from(variant: "Variant", template_dir: Path) -> str:
    """variant's source rendered from the templates in template_dir (another checkout's
    `templates/`, say: a template change timed against main at one config)."""
    template = _environment(Path(template_dir)).get_template(space_for(variant.family).template)
    body = template.render(**template_context(variant))
    return f"// cc1d kernel {variant.key()} (generator epoch {EPOCH})\n{body}"


@lru_cache(maxsize=4096)
def render(variant: "Variant") -> str:
    return render_from(variant, TEMPLATE_DIR)
