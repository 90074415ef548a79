"""cc1d-tune: per-shape kernel search, validation, timing and the SQLite tuning DB.

Imported as ``cc1d.tuner`` (relative imports only). Nothing here imports torch
at module level: the CPU parts (shapes, search with injected measurements, the
DB, ``--compile-only``) run on machines without torch or a GPU.
"""
from .shapes import Shape, ShapesError, load_shapes, parse_shapes

__all__ = ["Shape", "ShapesError", "load_shapes", "parse_shapes"]
