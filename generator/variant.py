"""Variant identity: a family plus a config, with a readable key and a content hash."""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator

from .render import bwd_twin_takes_cuts
from .space import ARCHS, Arch, Family, bwd_cf_walked, space_for


def cf_segment_positions(geometry: dict, arch: str) -> int:
    """Positions one segment of a channel-first forward or backward kernel covers, from its
    geometry or winners row (runtime/src/dispatch.cpp cf_segment_positions): its row's
    threads in segments of one warp, or the row where it is shorter (64-lane wavefronts
    on gfx9)."""
    per_row = max(geometry["threads"] // max(geometry["tile_d"], 1), 1)
    warp = 64 if arch.startswith("gfx9") else 32
    return geometry["tile_l"] * min(per_row, warp) // per_row


@dataclass(frozen=True)
class Variant:
    family: Family
    config: tuple[tuple[str, object], ...]  # (name, value) in the space's parameter order

    @staticmethod
    def of(family: Family, **config: object) -> "Variant":
        space = space_for(family)
        missing = [p.name for p in space.params if p.name not in config]
        extra = sorted(set(config) - {p.name for p in space.params})
        if missing or extra:
            raise ValueError(f"config for {family.key()}: missing {missing}, unknown {extra}")
        return Variant(family, tuple((p.name, config[p.name]) for p in space.params))

    @property
    def params(self) -> dict[str, object]:
        return dict(self.config)

    def key(self) -> str:
        """Readable and complete, e.g. fwd.cf.bf16wf32.w4.t64.v16.n4.r1.hshfl.g128."""
        space = space_for(self.family)
        parts = [f"{space.param(n).abbrev}{v}" for n, v in self.config]
        return ".".join([self.family.key(), *parts])

    @cached_property
    def source(self) -> str:
        from .render import render
        return render(self)

    def hash(self) -> str:
        """sha256 of the rendered source: what the runtime and the DB address it by."""
        return hashlib.sha256(self.source.encode()).hexdigest()

    def geometry(self) -> dict:
        return space_for(self.family).geometry(self.family, self.params)

    def why_invalid(self, arch: Arch | str = "sm_90") -> str | None:
        arch = ARCHS[arch] if isinstance(arch, str) else arch
        return space_for(self.family).why_invalid(self.family, self.params, arch)

    def as_runtime_dict(self) -> dict:
        """The KernelVariant fields the C++ runtime takes."""
        return dict(key=self.key(), hash=self.hash(), source=self.source, **self.geometry())

    def rows_off_vectors(self, seqlen: int) -> bool:
        """Whether a contiguous channel-first forward or backward of this seqlen has rows
        that start off this variant's vectors, which the runtime serves through its
        realigned twin."""
        return (self.family.op in ("fwd", "bwd") and self.family.layout == "cf" and
                seqlen * self.family.x_bytes % self.geometry()["align_bytes"] != 0)

    def _cut_segment_call(self, arch: str, seq_idx: bool, final_states: bool) -> bool:
        """Whether a build that takes a segment the sequence cuts (twin_takes_cut,
        walk_cut_takes) may serve this variant's calls: a channel-first backward without
        seq_idx or final states, on NVIDIA GPUs (dispatch.cpp cut_segment_call)."""
        return (self.family.op, self.family.layout) == ("bwd", "cf") and not arch.startswith("gfx") and \
            not seq_idx and not final_states

    def twin_takes_cut(self, seqlen: int, arch: str, seq_idx: bool = False, final_states: bool = False) -> bool:
        """Whether the runtime serves this channel-first backward variant's aligned calls of
        this seqlen through its realigned twin because the sequence cuts one of its segments
        (dispatch.cpp cut_twin; render.py bwd_twin_takes_cuts says for which variants)."""
        if not self._cut_segment_call(arch, seq_idx, final_states) or \
                not bwd_twin_takes_cuts(self.family, self.params):
            return False
        seg = cf_segment_positions(self.geometry(), arch)
        return seqlen > seg and seqlen % seg != 0

    def walk_cut_takes(self, seqlen: int, arch: str, seq_idx: bool = False, final_states: bool = False) -> bool:
        """Whether the runtime serves this walked channel-first backward variant's aligned
        calls of this seqlen through its walk-cut build, because the sequence's end cuts one
        of its segments (dispatch.cpp walk_cut: NVIDIA GPUs, no seq_idx or final states)."""
        if not self._cut_segment_call(arch, seq_idx, final_states) or not bwd_cf_walked(self.params):
            return False
        return seqlen % cf_segment_positions(self.geometry(), arch) != 0

    def served_build(self, seqlen: int, arch: str, seq_idx: bool = False, final_states: bool = False) -> str:
        """Which build of this variant the runtime serves contiguous calls of this seqlen with
        (fresh, aligned tensors, as the tuner times): "realign" (served_as_twin), "walkcut"
        (walk_cut_takes) or "plain"."""
        if self.served_as_twin(seqlen, arch, seq_idx=seq_idx, final_states=final_states):
            return "realign"
        if self.walk_cut_takes(seqlen, arch, seq_idx=seq_idx, final_states=final_states):
            return "walkcut"
        return "plain"

    def served_as_twin(self, seqlen: int, arch: str, seq_idx: bool = False, final_states: bool = False) -> bool:
        """Whether the runtime serves contiguous calls of this seqlen (fresh, aligned tensors,
        as the tuner times) through this variant's realigned twin: rows off its vectors, or
        a segment cut where its twin moves it."""
        return self.rows_off_vectors(seqlen) or \
            self.twin_takes_cut(seqlen, arch, seq_idx=seq_idx, final_states=final_states)


# What leads a realigned twin's source, by op: the runtime's kRealignDefine and
# kBwdRealignDefine (dispatch.h).
REALIGN_DEFINE = "#define CC1D_FWD_REALIGN 1\n"
BWD_REALIGN_DEFINE = "#define CC1D_BWD_REALIGN 1\n"


def realign_define(key: str) -> str:
    """The define of the realigned build of the channel-first variant `key` (fwd or bwd)."""
    if key.startswith("fwd.cf."):
        return REALIGN_DEFINE
    if key.startswith("bwd.cf."):
        return BWD_REALIGN_DEFINE
    raise ValueError(f"variant {key!r} has no realigned build: only channel-first forward and backward "
                     "variants (keys 'fwd.cf.*', 'bwd.cf.*') have one")


def twin_source(key: str, source: str) -> str | None:
    """The source of the realigned twin the runtime builds from a stored variant's source
    (dispatch.cpp twinnable: a channel-first forward or backward whose source names its
    op's realign macro, i.e. was rendered by templates that know the build), or None."""
    if not key.startswith(("fwd.cf.", "bwd.cf.")):
        return None
    define = realign_define(key)
    macro = define.split()[1]  # "#define CC1D_FWD_REALIGN 1" -> CC1D_FWD_REALIGN
    return define + source if macro in source else None


# What leads a walk-cut build's source: the runtime's kBwdWalkCutDefine (dispatch.h).
WALK_CUT_DEFINE = "#define CC1D_BWD_WALK_CUT 1\n"


def walk_cut_source(key: str, source: str) -> str | None:
    """The source of the walk-cut build the runtime makes from a stored variant's source
    (dispatch.cpp walk_cuttable: a walked channel-first backward whose source names the
    build's macro, i.e. was rendered by templates that know it), or None."""
    if not key.startswith("bwd.cf.") or "#define CC1D_BWD_WALKED 1" not in source or \
            "CC1D_BWD_WALK_CUT" not in source:
        return None
    return WALK_CUT_DEFINE + source


def walk_cut(kernel: dict) -> dict:
    """The walk-cut build of a walked channel-first backward variant's runtime dict, as the
    runtime makes it (dispatch.h walk_cut_build): the source led by its define, key +
    ".walkcut". ValueError for a variant that has none."""
    source = walk_cut_source(kernel["key"], kernel["source"])
    if source is None:
        raise ValueError(f"variant {kernel['key']!r} has no walk-cut build: only walked channel-first backward "
                         "variants (keys 'bwd.cf.*' with 8 or 16 vectors a thread) have one")
    return dict(kernel, key=kernel["key"] + ".walkcut", source=source,
                hash=hashlib.sha256(source.encode()).hexdigest())


def realigned(kernel: dict) -> dict:
    """The realigned twin of a channel-first forward or backward variant's runtime dict, as
    the runtime makes it (dispatch.h realigned_twin): the source led by its op's define,
    key + ".realign"."""
    source = realign_define(kernel["key"]) + kernel["source"]
    return dict(kernel, key=kernel["key"] + ".realign", source=source,
                hash=hashlib.sha256(source.encode()).hexdigest())


# A variant's other builds, by the names Variant.served_build gives them: the runtime keys
# each as the variant's key + "." + its name.
BUILDS = {"realign": realigned, "walkcut": walk_cut}


def served(kernel: dict, build: str) -> dict:
    """A variant's runtime dict as the build Variant.served_build names ("plain" or BUILDS')."""
    return kernel if build == "plain" else BUILDS[build](kernel)


def base_key(key: str) -> str:
    """The variant key of a kernel the runtime names: `key` less a build's suffix."""
    return next((key[:-len(b) - 1] for b in BUILDS if key.endswith("." + b)), key)


def variants(family: Family, arch: Arch | str = "sm_90") -> Iterator[Variant]:
    """Every valid variant of a family for an arch, in a stable order."""
    space = space_for(family)
    for values in itertools.product(*(p.values for p in space.params)):
        v = Variant(family, tuple(zip((p.name for p in space.params), values)))
        if v.why_invalid(arch) is None:
            yield v


def default_variant(family: Family, arch: Arch | str = "sm_90", **overrides: object) -> Variant:
    """The family's first valid preferred config, with `overrides` applied."""
    reasons = []
    for preferred in space_for(family).preferred:
        config = {k: v for k, v in preferred.items() if k not in ("widths", "x_dtypes")}
        if family.width not in preferred.get("widths", (family.width,)) or \
                family.x_dtype not in preferred.get("x_dtypes", (family.x_dtype,)):
            continue
        v = Variant.of(family, **{**config, **overrides})
        reason = v.why_invalid(arch)
        if reason is None:
            return v
        reasons.append(f"{v.key()}: {reason}")
    raise ValueError(f"no valid default for {family.key()}: " + "; ".join(reasons))


def fallback_chain(family: Family, arch: Arch | str = "sm_90") -> list[Variant]:
    """Defaults with ever smaller vectors, down to one element (no alignment need).

    The runtime takes the first whose alignment requirement the call meets, so
    every call has a kernel.
    """
    chain = [default_variant(family, arch)]
    if "vec_bytes" not in chain[0].params:  # a space without vectors needs only the element size
        return chain
    for vec in (16, 8, 4, 2):
        if vec < family.x_bytes or vec >= int(chain[0].params["vec_bytes"]):
            continue
        try:
            v = default_variant(family, arch, vec_bytes=vec)
        except ValueError:
            continue
        if v not in chain:
            chain.append(v)
    assert chain and chain[-1].geometry()["align_bytes"] == family.x_bytes, family.key()
    return chain
