"""cc1d kernel generator: the variant space, rendering and variant identity.

Imported as ``cc1d.generator`` when installed, or as the top-level
``generator`` package from the source tree (the build renders the default
catalog that way), so modules here use relative imports only.
"""
from .space import (ARCHS, DTYPES, EPOCH, LAYOUTS, OPS, WIDTHS, Arch, Family, Param, Space,
                    arch_info, families, space_for)
from .variant import Variant, default_variant, fallback_chain, variants
from .render import render

__all__ = [
    "ARCHS", "DTYPES", "EPOCH", "LAYOUTS", "OPS", "WIDTHS", "Arch", "Family", "Param", "Space",
    "Variant", "arch_info", "default_variant", "fallback_chain", "families", "render", "space_for",
    "variants",
]
