"""What device is present, and the environment recorded with each winner.

`probe_device` is what the CLI calls by default; tests inject their own.
"""
from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DeviceInfo:
    target: str                    # sm_90, gfx942, ...
    name: str                      # NVIDIA H100 80GB HBM3
    index: int = 0
    environment: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.name} ({self.target})"


def probe_device() -> DeviceInfo | None:
    """The current torch device, or None when torch or a GPU is missing."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    vendor = "hip" if getattr(torch.version, "hip", None) else "cuda"
    target = None
    try:
        from .._runtime import runtime
        target = runtime().device_target(vendor, idx)
    except (ImportError, RuntimeError):
        pass
    if not target:
        target = (getattr(props, "gcnArchName", "").split(":")[0] if vendor == "hip"
                  else f"sm_{props.major}{props.minor}")
    env = dict(device=props.name, sm_count=props.multi_processor_count, vendor=vendor,
               memory_gib=round(props.total_memory / 2**30, 1),
               runtime=torch.version.hip if vendor == "hip" else torch.version.cuda,
               torch=torch.__version__)
    try:
        env["driver"] = torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") \
            else torch._C._cuda_getDriverVersion()
    except Exception:  # noqa: BLE001 - informational only
        pass
    return DeviceInfo(target, props.name, idx, env)


def environment(device: DeviceInfo | None, rt: Any, target: str) -> dict[str, Any]:
    from .. import __version__
    env = dict(device.environment) if device else {}
    env.update(cc1d=__version__, python=platform.python_version(), host_os=platform.system())
    try:
        env["compiler"] = rt.compiler_version(target)
    except Exception:  # noqa: BLE001 - informational only
        pass
    return env
