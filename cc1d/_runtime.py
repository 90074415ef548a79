"""Access to the compiled C++ runtime (``cc1d._cc1d``) with a clear error if it is missing."""
from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType

log = logging.getLogger("cc1d")

_configured = False


def runtime() -> ModuleType:
    global _configured
    try:
        from . import _cc1d
    except ImportError as exc:  # pragma: no cover - only on broken installs
        raise ImportError(
            "cc1d's C++ runtime (cc1d._cc1d) is not built: install the package with "
            "`pip install .` from the repository root") from exc
    if not _configured:
        # The dispatcher reads the shipped tuning results from <package>/tuning_db/<arch>.db.
        _cc1d.set_package_dir(str(Path(__file__).resolve().parent))
        _configured = True
    return _cc1d
