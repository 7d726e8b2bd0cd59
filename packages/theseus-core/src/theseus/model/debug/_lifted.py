"""Flax lifted module classes (`nn.remat(X)`, `nn.vmap(X, ...)`, `nn.scan(X, ...)`, ...).

A lifted class's transformed call runs in the transform's own trace, so values made
inside cannot leave it. These functions let a caller see such calls from outside:
`lifted` tells a lifted class and its original apart, `lifted_calls` routes the outer
calls of lifted classes to a callback while a block runs (hooking classes Flax makes
meanwhile), `lifted_call_around` names the one the Python stack is inside, and
`call_lifted` runs a lifted call's own transform with a body of the caller's around
the method, so values computed inside leave as outputs; `called_by_name` lets a
captured lifted module take its arguments by keyword. `trace_state` (from
`theseus.model.hooks`) tells whether a call runs in the trace a caller started in; `subtree` and `attributes` copy a
submodule's variables and a module's constructor fields. The debugger's `capture`
and the engine's interventions share them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import flax.linen as nn

# ----------------------------------------------------------- lifted transforms
# `nn.remat(Block)` etc. return a subclass of `Block` whose `__call__` is Flax's
# `wrapped_fn` (functools.wraps copies its name and the flag that keeps Flax from
# wrapping it again, so `theseus.model.hooks` never sees that outer call). While
# `capture` runs, such classes get a thin `__call__` that reports the outer call, with
# its real arguments, to the capture; it is removed again when `capture` returns.
# Classes that exist before `capture` starts are hooked when a selected call is first
# seen inside one (the capture then runs again); classes made while it runs
# (`nn.remat(Block)` inside `setup` or a compact method) are hooked as Flax makes them:
# `capture` wraps `flax.linen.transforms.module_class_lift_transform` (and its cached
# twin, used by `nn.jit`), through which every lifted module class is created.
_TRANSFORMS_FILE = inspect.getsourcefile(nn.transforms)
_TRANSPARENT = ("checkpoint", "remat", "jit")  # values are those of the untransformed call
_MAPPED = ("vmap", "scan")  # calls below are re-run in a probe that returns their values
_MAKERS = ("module_class_lift_transform", "module_class_lift_transform_cached")
_hooks: list[Callable[..., Any]] = []


def lifted(cls: type) -> tuple[str, type] | None:
    """`(transform, original class)` when `cls` is `nn.remat(X)`, `nn.vmap(X, ...)`, ...; else None.

    `transform` is Flax's name of the lifted transform in lower case (`"checkpoint"`
    for `nn.remat`/`nn.checkpoint`, `"vmap"`, `"scan"`, `"jit"`, ...).
    """
    call = cls.__dict__.get("__call__")
    if _hooked_call(cls):
        call = call.__theseus_lifted__  # type: ignore[union-attr]
    code = getattr(call, "__code__", None)
    if code is None or code.co_name != "wrapped_fn" or code.co_filename != _TRANSFORMS_FILE:
        return None
    base = cls.__bases__[0]
    return cls.__name__.removesuffix(base.__name__).lower(), base


def _lifted_call_around() -> type | None:
    """The lifted module class whose transformed call the Python stack is inside, if any.

    Flax runs a lifted class's call in a `wrapped_fn` of `module_class_lift_transform`
    (or its cached twin) whose `self` is the lifted module; a function transform
    (`nn.cond`) or a JAX transform (`jax.vmap`) around module calls has no such frame.
    """
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if (
            code.co_name == "wrapped_fn"
            and code.co_filename == _TRANSFORMS_FILE
            and code.co_qualname.startswith("module_class_lift_transform")
            and isinstance(frame.f_locals.get("self"), nn.Module)
        ):
            return type(frame.f_locals["self"])
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _lift_arguments(call: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """`(lift transform, its positional, its keyword arguments)` a lifted `__call__` closes over."""
    cells = dict(zip(call.__code__.co_freevars, call.__closure__ or (), strict=True))
    return (
        cells["transform"].cell_contents,
        tuple(cells["trafo_args"].cell_contents),
        dict(cells["trafo_kwargs"].cell_contents),
    )


def _lifted_subclasses(cls: type) -> list[type]:
    found: list[type] = []
    todo: list[type] = list(cls.__subclasses__())
    seen: set[type] = set()
    while todo:
        sub = todo.pop()
        if sub in seen:
            continue
        seen.add(sub)
        todo.extend(sub.__subclasses__())
        if lifted(sub) is not None:
            found.append(sub)
    return found


def _hooked_call(cls: type) -> bool:
    """Whether `cls.__call__` is `_hook`'s wrapper made for `cls` itself.

    Only the wrapper's owner counts: a lifted class made from a hooked one (`nn.remat`
    of an `nn.vmap` class created while a capture ran) wraps the hooked `__call__`
    with `functools.wraps`, which copies the wrapper's attributes onto its own.
    """
    call = cls.__dict__.get("__call__")
    return getattr(call, "__theseus_hook_of__", None) is cls


def _hook(cls: type) -> Callable[[], None]:
    """Report `cls`'s outer (transformed) call to the innermost active capture; returns an undo."""
    original = cls.__dict__["__call__"]
    if _hooked_call(cls):
        return lambda: None

    @functools.wraps(original)
    def __call__(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if _hooks:
            return _hooks[-1](self, original, args, kwargs)
        return original(self, *args, **kwargs)

    __call__.__theseus_lifted__ = original  # type: ignore[attr-defined]
    __call__.__theseus_hook_of__ = cls  # type: ignore[attr-defined]
    type.__setattr__(cls, "__call__", __call__)

    def undo() -> None:
        type.__setattr__(cls, "__call__", original)

    return undo


@contextlib.contextmanager
def _hook_new_classes(hooked: set[type], undo: list[Callable[[], None]]) -> Iterator[None]:
    """Hook every lifted module class Flax creates while the block runs (see above)."""
    saved = {name: getattr(nn.transforms, name) for name in _MAKERS}

    def hooking(make: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(make)
        def making(*args: Any, **kwargs: Any) -> Any:
            made = make(*args, **kwargs)
            cls = made.func if isinstance(made, functools.partial) else made
            if isinstance(cls, type) and cls not in hooked and lifted(cls) is not None:
                hooked.add(cls)
                undo.append(_hook(cls))
            return made

        return making

    for name, make in saved.items():
        setattr(nn.transforms, name, hooking(make))
    try:
        yield
    finally:
        for name, make in saved.items():
            setattr(nn.transforms, name, make)


@contextlib.contextmanager
def lifted_calls(
    on_call: Callable[[nn.Module, Any, tuple[Any, ...], dict[str, Any]], Any],
) -> Iterator[Callable[[type], None]]:
    """Route the outer calls of lifted module classes to `on_call` while the block runs.

    Every lifted class Flax creates inside the block is hooked, and so is each class
    passed to the yielded `hook(cls)` (a class that existed before, found with
    `lifted_call_around()`). A hooked class's call `module(*args, **kwargs)`, outside its
    transform, becomes `on_call(module, original, args, kwargs)`; `original(module, *args,
    **kwargs)` is the transformed call itself. The hooks are removed on exit.
    """
    undo: list[Callable[[], None]] = []
    hooked: set[type] = set()

    def hook(cls: type) -> None:
        if cls not in hooked:
            hooked.add(cls)
            undo.append(_hook(cls))

    _hooks.append(on_call)
    try:
        with _hook_new_classes(hooked, undo):
            yield hook
    finally:
        _hooks.pop()
        for step in reversed(undo):
            step()


def lifted_call_around() -> tuple[str, type, bool] | None:
    """`(transform, lifted class, hooked)` of the innermost lifted call running now, if any."""
    cls = _lifted_call_around()
    if cls is None:
        return None
    kind = (lifted(cls) or ("transform", cls))[0]
    return kind, cls, _hooked_call(cls)


def call_lifted(
    module: nn.Module,
    original: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    body: Callable[..., tuple[Any, Any]],
) -> tuple[Any, Any]:
    """A lifted module's call under its own transform, with `body` around the method inside.

    Flax's call of `nn.remat(Block)` runs `Block.__call__` on a clone of the module
    inside `jax.checkpoint`. This runs the same transform, with the same arguments,
    scopes and RNGs, but calls `body(method, *args, **kwargs)` in there instead, where
    `method(*args, **kwargs)` is that `Block.__call__` on the clone. `body` returns
    `(output, extra)`: both leave the transform as its outputs, so values computed
    inside (arrays only in `extra`) can be used outside it.

    Args:
        module: the lifted module (bound), as a hooked call receives it.
        original: the class's transformed `__call__` (`lifted_calls` passes it).
        args, kwargs: the call's arguments.
        body: runs inside the transform; returns `(output, extra)`.

    Returns:
        `(output, extra)`, as values of the trace around the call.
    """
    transform, trafo_args, trafo_kwargs = _lift_arguments(original)
    cells = dict(zip(original.__code__.co_freevars, original.__closure__ or (), strict=True))
    method = cells["fn"].cell_contents

    def inside(clone: nn.Module, *inner: Any, **named: Any) -> tuple[Any, Any]:
        return body(functools.partial(method, clone), *inner, **named)

    lifted_body = nn.transforms.decorator_lift_transform(
        transform, inside, *trafo_args, **trafo_kwargs
    )
    return lifted_body(module, *args, **kwargs)


def called_by_name(module: nn.Module, rngs: dict[str, Any] | None) -> nn.Module:
    """A lifted module, bound as `module` is, whose call also takes its arguments by name.

    Flax's transformed `__call__` hands keyword arguments to the transform, and
    `nn.scan` and `nn.vmap` ignore them (with a warning), so `layer(**inputs)` would
    miss every argument. The returned module, of a subclass of the lifted class, binds
    its arguments to the original class's `__call__` signature (defaults applied) and
    passes them on positionally, as the model's own call does; a keyword-only argument
    is passed by keyword (the transform ignores it, as it does in the model) unless it
    is its default, which is left out.

    Args:
        module: a bound module of a lifted class (`lifted(type(module))` is not None).
        rngs: RNG streams to bind (none: deterministic use).

    Returns:
        A module of the same transform, variables and RNGs, called like the original class.
    """
    lifted_cls = type(module)
    signature = inspect.signature(lifted(lifted_cls)[1].__call__)  # type: ignore[index]

    def __call__(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        named = {
            name: value
            for name, value in bound.kwargs.items()
            if name not in signature.parameters or value is not signature.parameters[name].default
        }
        return lifted_cls.__call__(self, *bound.args[1:], **named)

    __call__.__qualname__ = f"{lifted_cls.__qualname__}.__call__"
    __call__.method_handler_wrapped = True  # type: ignore[attr-defined]  # Flax: not wrapped
    by_name = type(lifted_cls.__name__, (lifted_cls,), {"__call__": __call__})
    copy = by_name(parent=None, **attributes(module))
    return copy.bind(dict(module.variables), rngs=rngs)


def attributes(module: nn.Module) -> dict[str, Any]:
    """The dataclass fields a module was constructed with (what a copy of it needs)."""
    return {
        f.name: getattr(module, f.name)
        for f in dataclasses.fields(module)
        if f.name != "parent" and f.init
    }


def subtree(variables: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Each collection's variables of the submodule at `path` (relative, `/`-joined)."""
    found: dict[str, Any] = {}
    for collection, tree in variables.items():
        for part in path.split("/") if path else ():
            if not isinstance(tree, Mapping) or part not in tree:
                break
            tree = tree[part]
        else:
            found[collection] = tree
    return found
