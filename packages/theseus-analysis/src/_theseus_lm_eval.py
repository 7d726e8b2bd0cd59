"""Lets `lm_eval --model theseus` find Theseus's model, with nothing imported by the user.

lm-evaluation-harness 0.4.13 looks for models in its own registry only (no entry
points). `theseus_lm_eval.pth`, installed with theseus-analysis, imports this module at
interpreter start. It costs nothing until lm-eval's registry is imported: then the name
`theseus` is registered lazily (as lm-eval registers its own models), so theseus and JAX
are imported only when a run asks for the `theseus` model.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

_REGISTRY = "lm_eval.api.registry"
_TARGET = "theseus.analysis.evaluation._harness:TheseusLM"


def _register(registry: ModuleType) -> None:
    models = getattr(registry, "model_registry", None)
    if models is not None and "theseus" not in models:
        models.register("theseus", target=_TARGET)
        # lm-eval fills its registry with its own models only while it is empty: fill it
        importlib.import_module("lm_eval.models")


class _AfterRegistry(importlib.abc.MetaPathFinder):
    """Runs `_register` right after lm-eval's registry module is executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _REGISTRY:
            return None
        sys.meta_path.remove(self)  # one use: find the real module, then step aside
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _register(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Register now if lm-eval's registry is loaded, else right after it is."""
    if _REGISTRY in sys.modules:
        _register(sys.modules[_REGISTRY])
    elif not any(isinstance(f, _AfterRegistry) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterRegistry())


install()
