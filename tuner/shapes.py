"""shapes.yaml: the problems to tune, with defaults and a compact grid form.

Format (see examples/shapes.yaml)::

    defaults:                 # optional; overrides the built-in defaults below
      dtypes: bf16/f32
    shapes:                   # or a bare top-level list of entries
      - {op: fwd, layout: [cf, cl], dtypes: [bf16/f32, bf16], width: 4,
         dim: [2048, 4096], batch: [1, 8], seqlen: [512, 2048], bias: true, activation: silu}

Every field takes one value or a list; an entry expands to the product of its
lists. ``dtypes`` is ``x/weight`` or ``x`` (weight in x's dtype). ``batch``,
``dim`` and ``seqlen`` are required; the other fields default to BUILTIN_DEFAULTS.
``state_indices: true`` (op upd only) tunes the decode update as vLLM calls it:
its states read through conv_state_indices from a larger pool. ``width_state: true``
(op upd only) tunes it on states of width entries, as HF transformers' Mamba caches
keep them (state_len = width; without it, width-1 as vLLM's).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from ..generator import DTYPES, LAYOUTS, OPS, WIDTHS, Family
from ..generator.space import DTYPE_PAIRS

BUILTIN_DEFAULTS: dict[str, Any] = dict(op="fwd", layout="cf", dtypes="bf16/f32", width=4, bias=True,
                                        activation="silu", seq_idx=False, initial_states=False,
                                        final_states=False, state_indices=False, width_state=False,
                                        name="")
REQUIRED = ("batch", "dim", "seqlen")
# A shape's features as its DB key names them, in key order, and the field each one is
# (silu: activation == "silu").
FEATURES = (("bias", "bias"), ("silu", None), ("seqidx", "seq_idx"), ("init", "initial_states"),
            ("final", "final_states"), ("pool", "state_indices"), ("wstate", "width_state"))


class ShapesError(ValueError):
    """A shapes file problem; the message names the file, the entry and the field."""


@dataclass(frozen=True)
class Shape:
    op: str
    layout: str
    x_dtype: str
    w_dtype: str
    width: int
    batch: int
    dim: int
    seqlen: int
    bias: bool = True
    activation: str = "silu"   # "none" | "silu"
    seq_idx: bool = False
    initial_states: bool = False
    final_states: bool = False
    state_indices: bool = False  # upd: states read through conv_state_indices (a pool)
    width_state: bool = False    # upd: states of width entries (HF transformers'), not width-1
    name: str = ""             # a label for reports; not part of the key

    def family(self) -> Family:
        return Family(self.op, self.layout, self.x_dtype, self.w_dtype, self.width)

    @classmethod
    def of(cls, family: Family, batch: int, dim: int, seqlen: int, features: Iterable[str]) -> "Shape":
        """The shape of a family, its sizes and its features() (a DB winner's row, say)."""
        on = set(features)
        return cls(family.op, family.layout, family.x_dtype, family.w_dtype, family.width, batch, dim, seqlen,
                   activation="silu" if "silu" in on else "none",
                   **{field: name in on for name, field in FEATURES if field is not None})

    def features(self) -> tuple[str, ...]:
        return tuple(name for name, field in FEATURES
                     if (self.activation == "silu" if field is None else getattr(self, field)))

    def key(self) -> str:
        """The shape part of a DB key, e.g. ``b8.d2048.l512.bias.silu`` (the family holds the rest)."""
        return ".".join([f"b{self.batch}.d{self.dim}.l{self.seqlen}", *self.features()])

    def describe(self) -> str:
        label = f" ({self.name})" if self.name else ""
        return f"{self.family().key()} {self.key()}{label}"


def _choice(options: tuple) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if v not in options:
            raise ValueError(f"expected one of {list(options)}")
        return v
    return check


def _positive_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError("expected a positive integer")
    return v


def _width(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v not in WIDTHS:
        raise ValueError(f"expected an integer in {WIDTHS[0]}..{WIDTHS[-1]}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError("expected true or false")
    return v


def _activation(v: Any) -> str:
    if v is None or v is False:
        return "none"
    if v in ("none", "silu", "swish"):
        return "silu" if v == "swish" else v
    raise ValueError("expected 'silu' or 'none'")


def _dtypes(v: Any) -> tuple[str, str]:
    if not isinstance(v, str):
        raise ValueError("expected 'x/weight' like 'bf16/f32', or 'x' like 'bf16'")
    x, _, w = v.partition("/")
    w = w or x
    if (x, w) not in DTYPE_PAIRS:
        pairs = ", ".join(f"{a}/{b}" for a, b in DTYPE_PAIRS)
        raise ValueError(f"expected x/weight dtypes among {pairs} (x in {list(DTYPES)})")
    return x, w


def _name(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError("expected a string")
    return v


FIELDS: dict[str, Callable[[Any], Any]] = dict(
    op=_choice(OPS), layout=_choice(LAYOUTS), dtypes=_dtypes, width=_width, batch=_positive_int,
    dim=_positive_int, seqlen=_positive_int, bias=_bool, activation=_activation, seq_idx=_bool,
    initial_states=_bool, final_states=_bool, state_indices=_bool, width_state=_bool, name=_name)


def _check_fields(where: str, entry: Any) -> dict:
    if not isinstance(entry, dict):
        raise ShapesError(f"{where}: expected a mapping of fields, got {entry!r}")
    unknown = sorted(set(entry) - set(FIELDS))
    if unknown:
        raise ShapesError(f"{where}: unknown field {unknown[0]!r}; known fields: {', '.join(FIELDS)}")
    checked = {}
    for field, value in entry.items():
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ShapesError(f"{where}.{field}: empty list")
        out = []
        for v in values:
            try:
                out.append(FIELDS[field](v))
            except ValueError as exc:
                raise ShapesError(f"{where}.{field}: {exc}, got {v!r}") from None
        checked[field] = out
    return checked


def parse_shapes(data: Any, source: str = "<shapes>") -> list[Shape]:
    """Validate and expand parsed YAML into shapes (in file order, duplicates dropped)."""
    defaults = dict(BUILTIN_DEFAULTS)
    if isinstance(data, dict):
        unknown = sorted(set(data) - {"defaults", "shapes"})
        if unknown:
            raise ShapesError(f"{source}: unknown top-level key {unknown[0]!r}; expected 'defaults' "
                              f"and 'shapes'")
        if "defaults" in data:
            user = _check_fields(f"{source}: defaults", data["defaults"] or {})
            for field, values in user.items():
                if len(values) != 1:
                    raise ShapesError(f"{source}: defaults.{field}: expected one value, got a list")
            defaults.update(data["defaults"])  # raw values: checked above, re-parsed below
        entries = data.get("shapes")
    else:
        entries = data
    if not isinstance(entries, list) or not entries:
        raise ShapesError(f"{source}: expected a non-empty list of shapes (top level, or under 'shapes:')")
    shapes: dict[tuple, Shape] = {}
    for i, entry in enumerate(entries):
        where = f"{source}: shapes[{i}]"
        checked = _check_fields(where, entry)
        missing = [f for f in REQUIRED if f not in checked and f not in defaults]
        if missing:
            raise ShapesError(f"{where}: missing required field {missing[0]!r}")
        grid = {f: checked.get(f) or [FIELDS[f](defaults[f])] for f in FIELDS}
        for combo in itertools.product(*grid.values()):
            v = dict(zip(grid, combo))
            x, w = v.pop("dtypes")
            shape = Shape(x_dtype=x, w_dtype=w, **v)
            if shape.op == "vfwd" and shape.seq_idx:
                raise ShapesError(f"{where}: op vfwd: seq_idx is not a feature of the varlen prefill "
                                  "(cu_seqlens delimits its sequences)")
            if shape.op == "vfwd" and shape.initial_states and not shape.final_states:
                raise ShapesError(f"{where}: op vfwd: initial_states needs final_states (the state pool is "
                                  "read and written back)")
            for field in ("state_indices", "width_state"):
                if getattr(shape, field) and shape.op != "upd":
                    raise ShapesError(f"{where}: op {shape.op}: {field} is a feature of the decode update "
                                      "(op upd) only")
            shapes.setdefault((shape.family().key(), shape.key()), shape)
    return list(shapes.values())


def load_shapes(path: str | Path) -> list[Shape]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ShapesError(f"{path}: cannot read the shapes file: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ShapesError(f"{path}: not valid YAML: {exc}") from None
    return parse_shapes(data, str(path))

