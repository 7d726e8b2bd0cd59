"""Recording PyTorch modules with forward hooks.

A pre-hook records a module's arguments (by name, from ``forward``'s signature)
and a hook its output, for every submodule below the root that the filter keeps,
under ``path.__call__``, the key a JAX module's call gets, so recordings of a
PyTorch model and its JAX port compare key by key; the hooks are removed when the
recording ends. Tensors are detached and cloned, so later in-place updates cannot
change them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._paths import PATH_SEP, ModulePath, leaf_items
from ._tap import Tap, _named_arguments

__all__ = ["CALL", "hook_model"]

# What a module call is recorded under, for PyTorch as for JAX (`nn.Module.__call__`
# runs `forward` and its hooks).
CALL = "__call__"


def hook_model(
    model: Any,
    tap: Tap,
    filter_: Callable[[ModulePath, Any], bool] | None = None,
    is_leaf: Callable[[ModulePath, Any], bool] | None = None,
) -> tuple[list[Any], list[str]]:
    """Register recording hooks on the submodules of ``model``.

    Args:
        model: a ``torch.nn.Module``.
        tap: where the calls are reported.
        filter_: ``filter_(path, module) -> bool``; default: every submodule.
        is_leaf: ``is_leaf(path, module) -> bool``; do not descend below it.

    Returns:
        The hook handles (call ``.remove()`` on each) and the paths seen.
    """
    from torch import nn

    handles: list[Any] = []
    seen: list[str] = []

    def report(pairs: list[tuple[str, Any]]) -> None:
        tap.sink.emit([(k, tap.transform(k, v) if tap.transform else v) for k, v in pairs])

    def pre_hook(key: str) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            named = _named_arguments(module.forward, args, kwargs)
            pairs: list[tuple[str, Any]] = []
            for name, value in named.items():
                pairs += leaf_items(value, key + PATH_SEP + name, python_scalars=False)
            report(pairs)

        return hook

    def post_hook(key: str) -> Callable[..., None]:
        def hook(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            report(leaf_items(output, key, python_scalars=True))

        return hook

    lone = next(iter(model.children()), None) is None

    def visit(path: ModulePath, node: Any) -> None:
        if node is None or (is_leaf is not None and is_leaf(path, node)):
            return
        if path or lone:
            key = (path + PATH_SEP if path else "") + CALL
            seen.append(key)
            if filter_(path, node) if filter_ else isinstance(node, nn.Module):
                if tap.record != "outputs":
                    handles.append(node.register_forward_pre_hook(pre_hook(key), with_kwargs=True))
                if tap.record != "inputs":
                    handles.append(node.register_forward_hook(post_hook(key), with_kwargs=True))
        for name, child in node.named_children():
            visit(path.child(name), child)

    visit(ModulePath(()), model)
    return handles, seen
