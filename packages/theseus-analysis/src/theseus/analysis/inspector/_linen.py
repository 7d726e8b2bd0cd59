"""Recording Flax linen modules by method interception.

Linen modules are not pytrees: their parameters live in ``variables`` and their
submodules are created while ``apply`` runs. ``theseus.model.hooks`` (the one
module that installs a Flax method interceptor) hands every ``__call__`` to a
listener with the bound module, whose ``path`` names it (``("blocks_0", "attn")``);
the listener reports ``__call__`` of every module
below the root to a :class:`~._tap.Tap`, under ``blocks_0.attn.__call__`` (a lone
module without submodules is recorded itself, as ``__call__``). The
interception happens while tracing, so it works when ``apply`` is called inside
``jax.jit``, ``jax.grad``, ``jax.vmap`` or through ``nn.scan``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
from jax.tree_util import GetAttrKey

from theseus.model import hooks

from ._paths import PATH_SEP, ModulePath
from ._tap import Tap

__all__ = ["LinenTail", "is_linen_module"]


def is_linen_module(model: Any) -> bool:
    """Whether ``model`` is a Flax linen module (bound or not)."""
    return isinstance(model, nn.Module)


def _module_path(module: nn.Module) -> ModulePath:
    return ModulePath(tuple(GetAttrKey(name) for name in module.path))


class LinenTail:
    """A linen module whose ``apply`` records its submodules' calls.

    Args:
        module: the root module.
        tap: where the calls are reported.
        filter_: ``filter_(path, module) -> bool``; default: every submodule.
        is_leaf: ``is_leaf(path, module) -> bool``; a module for which it holds
            is not recorded, nor is anything below it.

    Everything but ``apply`` falls through to the module (``init``, attributes).
    """

    def __init__(
        self,
        module: nn.Module,
        tap: Tap,
        filter_: Callable[[ModulePath, Any], bool] | None = None,
        is_leaf: Callable[[ModulePath, Any], bool] | None = None,
    ) -> None:
        self.module = module
        self.tap = tap
        self.filter_ = filter_
        self.is_leaf = is_leaf
        self.seen: list[str] = []
        self._submodule_calls = 0

    def __getattr__(self, name: str) -> Any:
        """Attributes of the module (``init``, ``tabulate``, fields)."""
        if name.startswith("__") or name == "module":
            raise AttributeError(name)
        return getattr(self.module, name)

    def _inside_leaf(self, module: nn.Module) -> bool:
        assert self.is_leaf is not None
        parent: Any = module
        while isinstance(parent, nn.Module) and parent.path:
            if self.is_leaf(_module_path(parent), parent):
                return True
            parent = parent.parent
        return False

    def intercept(self, call: hooks.ModuleCall) -> Any:
        """The listener handed to ``theseus.model.hooks.intercept`` (``__call__`` only)."""
        module = call.module
        if not module.path:
            return self._root(call)
        self._submodule_calls += 1
        path = _module_path(module)
        key = path + PATH_SEP + call.method
        if key not in self.seen:
            self.seen.append(key)
        if self.filter_ is not None and not self.filter_(path, module):
            return call.proceed()
        if self.is_leaf is not None and self._inside_leaf(module):
            return call.proceed()
        return self.tap.call(
            key, call.function, call.args, call.kwargs, signature_of=call.bound_method
        )

    def _root(self, call: hooks.ModuleCall) -> Any:
        """Run the root; record it only when no submodule was called (a lone module)."""
        before = self._submodule_calls
        opened = self.tap.sink.open_call()
        failed = True
        try:
            out = call.proceed()
            root = ModulePath(())
            lone = self._submodule_calls == before
            if lone and (self.filter_ is None or self.filter_(root, call.module)):
                if "__call__" not in self.seen:
                    self.seen.append("__call__")
                self.tap.report_inputs("__call__", call.bound_method, call.args, call.kwargs)
                self.tap.report_output("__call__", out)
            failed = False
        finally:
            self.tap.sink.close_call(opened, failed)
        return out

    def apply(self, variables: Any, *args: Any, **kwargs: Any) -> Any:
        """``module.apply(variables, *args, **kwargs)``, recording the calls inside."""
        with hooks.intercept(self.intercept):
            return self.module.apply(variables, *args, **kwargs)
