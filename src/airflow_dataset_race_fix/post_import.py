"""
Post-import hooks (wrapt's ``when_imported`` semantics): ``hook(module)`` runs once, at once if
the module is imported, else right after its code first ran; a hook that raises makes that
import raise. One meta-path finder, first on ``sys.meta_path``, wraps the loader of watched
names and answers ``None`` at once for the others. Imports nothing beyond ``sys``: the
start-up shim imports it in every interpreter.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing costs milliseconds at interpreter start; only type checkers need it
if TYPE_CHECKING:
    from collections.abc import Callable
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    Hook = Callable[[ModuleType], None]

# Module name -> hooks still waiting for that module's first import.
_pending: dict[str, list[Hook]] = {}


def when_imported(name: str, hook: Hook) -> None:
    """Run ``hook(module)`` now if ``name`` is imported, else right after its first import."""
    module = sys.modules.get(name)
    if module is not None:
        hook(module)
        return
    _pending.setdefault(name, []).append(hook)
    _ensure_finder()


def cancel(name: str | None = None) -> None:
    """Forget the hooks still waiting for ``name`` (for every module when ``name`` is None)."""
    if name is None:
        _pending.clear()
    else:
        _pending.pop(name, None)


def waiting() -> tuple[str, ...]:
    """Names of modules that still have hooks waiting for their import."""
    return tuple(_pending)


def _fire(name: str, module: ModuleType) -> None:
    for hook in _pending.pop(name, ()):
        hook(module)


class _HookedLoader:
    """Runs the real loader, then the hooks; everything else is the real loader's."""

    def __init__(self, loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: ModuleSpec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        # Give the module its real loader back before it runs: inspect, linecache,
        # importlib.resources and reload() then see what they would see without us.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _fire(self._name, module)

    def __getattr__(self, attribute: str):
        return getattr(self._loader, attribute)


class PostImportFinder:
    """Meta-path finder that wraps the loader of watched modules; it finds nothing itself."""

    def __init__(self) -> None:
        self._resolving: set[str] = set()  # names whose real spec we are asking others for

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in _pending or fullname in self._resolving:
            return None
        self._resolving.add(fullname)
        try:
            spec = self._find_real_spec(fullname, path, target)
        finally:
            self._resolving.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, fullname)
        return spec

    def _find_real_spec(self, fullname: str, path, target):
        for finder in list(sys.meta_path):
            find_spec = getattr(finder, "find_spec", None)
            if finder is not self and find_spec is not None:
                spec = find_spec(fullname, path, target)
                if spec is not None:
                    return spec
        return None


def _ensure_finder() -> None:
    if not any(isinstance(finder, PostImportFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, PostImportFinder())
