"""Access to the compiled C++ runtime (``cc1d._cc1d``) with a clear error if it is missing."""
from __future__ import annotations

import logging
from types import ModuleType

log = logging.getLogger("cc1d")


def runtime() -> ModuleType:
    try:
        from . import _cc1d
    except ImportError as exc:  # pragma: no cover - only on broken installs
        raise ImportError(
            "cc1d's C++ runtime (cc1d._cc1d) is not built: install the package with "
            "`pip install .` from the repository root") from exc
    return _cc1d
