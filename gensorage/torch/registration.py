"""``torch.compile(model, backend="gensorage")`` after ``import gensorage``, without importing torch.

``import gensorage`` calls :func:`install`. When torch's backend registry is already loaded the backend is
registered at once; otherwise an import hook waits for the registry module (``torch._dynamo.backends.registry``,
loaded by ``torch.compile`` before it looks a backend up) and registers the backend right after it loads. The
``torch_dynamo_backends`` entry point (pyproject.toml) names the same function for installs that read it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

REGISTRY = "torch._dynamo.backends.registry"
NAME = "gensorage"


def _register(registry: ModuleType) -> None:
    def gensorage(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        from gensorage.torch.backend import gensorage_backend

        return gensorage_backend(gm, example_inputs, **kwargs)

    if NAME not in registry._COMPILER_FNS:
        registry.register_backend(gensorage, name=NAME)


class _RegistryHook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds nothing itself: wraps the real loader of the registry module to register after it executes."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != REGISTRY:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _register(module)


def install() -> None:
    """Register the backend now if torch's registry is loaded, else when it loads."""
    registry = sys.modules.get(REGISTRY)
    if registry is not None:
        _register(registry)
    elif not any(isinstance(f, _RegistryHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegistryHook())


__all__ = ["NAME", "install"]
