"""``import causal_conv1d`` served by cc1d: an opt-in drop-in for Mamba code.

``install_causal_conv1d_alias()`` puts a finder first on ``sys.meta_path`` that
answers for the package ``causal_conv1d`` and its modules
``causal_conv1d_interface``, ``causal_conv1d_varlen`` and ``cpp_functions``
with modules holding the peer's public names (``cc1d.compat``). Because it is a
real finder, ``importlib.util.find_spec("causal_conv1d")`` finds it (the check
transformers' ``is_causal_conv1d_available`` makes) and ``importlib.metadata``
reports a ``causal_conv1d`` distribution (version ``1.6.0+cc1d...``).

Ways to turn it on, none of which edits the model code:
- call ``cc1d.install_causal_conv1d_alias()`` before the model code imports causal_conv1d;
- set ``CC1D_AS_CAUSAL_CONV1D=1`` and import cc1d first (``import cc1d`` installs it);
- run ``python -m cc1d.alias SCRIPT [ARGS...]`` (or ``-m MODULE ...``): installs it, then runs the program.
An installed Dao-AILab causal-conv1d stays shadowed while the alias is in place.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
from types import ModuleType
from typing import Any, Optional, Sequence

from . import compat

ENV_SWITCH = "CC1D_AS_CAUSAL_CONV1D"
PACKAGE = "causal_conv1d"

# module -> its public names (each a function of cc1d.compat of that name), as in the peer 1.6
MODULES: dict[str, tuple[str, ...]] = {
    PACKAGE: ("causal_conv1d_fn", "causal_conv1d_update"),
    f"{PACKAGE}.causal_conv1d_interface": ("causal_conv1d_fn", "causal_conv1d_ref", "causal_conv1d_update",
                                           "causal_conv1d_update_ref"),
    f"{PACKAGE}.causal_conv1d_varlen": ("causal_conv1d_varlen_states", "causal_conv1d_varlen_states_ref"),
    f"{PACKAGE}.cpp_functions": ("causal_conv1d_fwd_function", "causal_conv1d_bwd_function",
                                 "causal_conv1d_update_function"),
}
# names resolved on first access (they need torch)
LAZY: dict[str, dict[str, Any]] = {
    f"{PACKAGE}.causal_conv1d_interface": {"CausalConv1dFn": compat.autograd_fn},
}


def alias_version() -> str:
    from . import __version__
    return f"{compat.PEER_VERSION}+cc1d.{__version__}"


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        for attr in MODULES[name]:
            setattr(module, attr, getattr(compat, attr))
        module.__all__ = list(MODULES[name]) + list(LAZY.get(name, ()))
        module.__cc1d__ = True  # lets code tell the alias from the peer
        if name == PACKAGE:
            module.__version__ = alias_version()
        lazy = LAZY.get(name)
        if lazy:
            def __getattr__(attr: str, _lazy: dict = lazy, _module: ModuleType = module) -> Any:
                make = _lazy.get(attr)
                if make is None:
                    raise AttributeError(f"module {_module.__name__!r} has no attribute {attr!r}")
                value = make()
                setattr(_module, attr, value)
                return value
            module.__getattr__ = __getattr__


class _Distribution(importlib.metadata.Distribution):
    """Metadata of the aliased package, for importlib.metadata.version('causal_conv1d') and friends."""

    def read_text(self, filename: str) -> Optional[str]:
        if filename == "METADATA":
            return (f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {alias_version()}\n"
                    f"Summary: causal_conv1d API served by cc1d (cc1d.alias)\n")
        if filename == "top_level.txt":
            return PACKAGE + "\n"
        return None

    def locate_file(self, path: Any) -> Any:
        return path


class CausalConv1dFinder(importlib.abc.MetaPathFinder):
    """Answers for causal_conv1d and its modules; every other name goes on down sys.meta_path."""

    _loader = _Loader()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in MODULES:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, self._loader, origin="cc1d.alias",
                                              is_package=fullname == PACKAGE)
        if fullname == PACKAGE:
            spec.submodule_search_locations = []
        return spec

    def find_distributions(self, context: Any = importlib.metadata.DistributionFinder.Context()) -> list:
        name = getattr(context, "name", None)
        if name is None or name.replace("-", "_").lower() == PACKAGE:
            return [_Distribution()]
        return []


def _installed_finder() -> Optional[CausalConv1dFinder]:
    return next((f for f in sys.meta_path if isinstance(f, CausalConv1dFinder)), None)


def install_causal_conv1d_alias() -> ModuleType:
    """Make ``import causal_conv1d`` (and its modules) resolve to cc1d; returns the
    ``causal_conv1d`` module. Idempotent. Modules of a real causal-conv1d imported
    before the call are replaced in sys.modules (code that already holds them keeps them)."""
    if _installed_finder() is None:
        sys.meta_path.insert(0, CausalConv1dFinder())
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        if not getattr(sys.modules[name], "__cc1d__", False):
            del sys.modules[name]
    importlib.invalidate_caches()
    return importlib.import_module(PACKAGE)


def uninstall_causal_conv1d_alias() -> None:
    """Undo ``install_causal_conv1d_alias`` (the finder and the alias modules go)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, CausalConv1dFinder)]
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        if getattr(sys.modules[name], "__cc1d__", False):
            del sys.modules[name]
    importlib.invalidate_caches()


def is_installed() -> bool:
    return _installed_finder() is not None


def install_from_environment() -> bool:
    """Install the alias when $CC1D_AS_CAUSAL_CONV1D is 1/true/yes/on (called by ``import cc1d``)."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() in ("1", "true", "yes", "on"):
        install_causal_conv1d_alias()
        return True
    return False


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m cc1d.alias SCRIPT [ARGS]`` / ``python -m cc1d.alias -m MODULE [ARGS]``."""
    import runpy
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m cc1d.alias SCRIPT [ARGS...] | -m MODULE [ARGS...]\n"
              "Runs the program with `import causal_conv1d` served by cc1d.")
        return 0 if args else 2
    install_causal_conv1d_alias()
    if args[0] == "-m":
        if len(args) < 2:
            print("cc1d.alias: -m: expected a module name", file=sys.stderr)
            return 2
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    # run the package module's main, so the finder installed is cc1d.alias's own class
    from cc1d.alias import main as _main
    sys.exit(_main())
