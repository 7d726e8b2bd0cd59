"""The time-travel debugger: find module calls by type, replay one, get it back bound.

A trainer's `trace(state, batch, key, sharding=...)` is one pure model call. Flax
linen reports every module method call to `nn.intercept_methods`; this module
listens there and names each call by its module path (`"blocks_0/attn"`, the root
module is `""`):

- `discover(run, target)` lists the paths of every `__call__` of a module of type
  `target` (subclasses too), in call order, each once. Callers run it under
  `jax.eval_shape`, so discovery costs no FLOPs.
- `capture(run, paths)` runs the call until the first `__call__` at each of `paths`
  has happened and returns, for each, the module bound to its real variables and
  the call's arguments by name (`DebugInputs`). The rest of the forward pass is not
  run. Used eagerly by `BaseTrainer.debug` and under `jax.jit` by the analysis engine.

Calls inside a Flax lifted transform (`nn.remat`, `nn.vmap`, `nn.scan`, ...) run in the
transform's own trace, so their values cannot leave it. `capture` therefore takes
them at the transformed module's own call, outside the transform (classes made inside
`setup` or a compact method included: they are hooked as Flax creates them): a
selected transformed module (`nn.remat(Block)` at `"blocks_0"`, `nn.vmap(MLP)`,
`nn.scan(...)`) is captured bound as it is, so calling it runs the transform on its
real arguments; a call inside `nn.remat`/`nn.checkpoint` or `nn.jit` (value-transparent)
is captured by running the original class untransformed on the same variables and
arguments; a call below `nn.vmap` or `nn.scan` is captured by running the original class
under the same transform, with the body returning the call's array arguments next to
its output, so they leave stacked on a leading axis (one entry per mapped call or per
iteration; Python values stay as they are); its module is wrapped in `nn.vmap` over
that axis (variables on the transform's own axes), so calling it gives every entry's
output. A call below any other transform, or below an `nn.scan` that carries
variables, is a `TransformedCallError` naming the module to select.

`DebugSession` is what `trainer.debug(path)` returns: unpack it
(`layer, inputs = trainer.debug(path)`) or use it as a context manager; `close()`
releases the layer and inputs, and using either afterwards is a `DebugClosedError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.core import lift

from theseus.errors import TheseusError

__all__ = [
    "DebugClosedError",
    "DebugInputs",
    "DebugLayer",
    "DebugSession",
    "DebugTargetError",
    "TransformedCallError",
    "UnknownArgumentError",
    "UnknownPathError",
    "capture",
    "check_paths",
    "check_target",
    "discover",
    "path_of",
]


class UnknownPathError(TheseusError, ValueError):
    """A module path that the trace never calls (the message lists the discovered ones)."""


class DebugTargetError(TheseusError, TypeError):
    """`find()` or `debug()` was given something that is not a module class."""


class UnknownArgumentError(TheseusError, KeyError):
    """`inputs[name]` for a name the recorded call did not take."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DebugClosedError(TheseusError, RuntimeError):
    """A debug layer or its inputs used after `close()`."""


class TransformedCallError(TheseusError, ValueError):
    """A selected call inside a transform whose calls cannot be taken apart (`jax.lax.scan`, ...)."""


def path_of(module: nn.Module) -> str:
    """The path string of a bound module: `"blocks_0/attn"`; the root module is `""`."""
    return "/".join(str(part) for part in module.path)


def check_paths(wanted: Sequence[Any], discovered: Sequence[str], what: str) -> list[str]:
    """Validate selected paths against the discovered ones.

    Args:
        wanted: the paths asked for.
        discovered: the paths `discover` found.
        what: who asked (`"trainer.debug()"`, `"Activations.select()"`), for the message.

    Returns:
        `wanted` as a list of strings.

    Raises:
        UnknownPathError: a path that is not a string or was not discovered.
    """
    shown = ", ".join(repr(p) for p in discovered) or "none"
    for path in wanted:
        if not isinstance(path, str):
            raise UnknownPathError(
                f"{what} must name module paths as strings like 'blocks_0/attn'; got "
                f"{path!r} ({type(path).__name__}). Discovered paths: {shown}."
            )
        if path not in discovered:
            close = difflib.get_close_matches(path.replace(".", "/"), discovered, n=1)
            hint = f" Did you mean {close[0]!r}? (paths are joined with '/')" if close else ""
            raise UnknownPathError(
                f"{what} asked for module path {path!r}, which the trace never calls.{hint} "
                f"Discovered paths: {shown}."
            )
    return list(wanted)


def check_target(target: Any, what: str) -> None:
    """Raise `DebugTargetError` (a `TypeError`) unless `target` is a module class or a tuple of them."""
    targets = target if isinstance(target, tuple) else (target,)
    if not targets or not all(isinstance(t, type) for t in targets):
        raise DebugTargetError(
            f"{what} expects a module class such as SelfAttention (or a tuple of classes); "
            f"got {target!r} ({type(target).__name__})"
        )


def _closed(kind: str) -> DebugClosedError:
    return DebugClosedError(
        f"this debug {kind} was released by close(); call trainer.debug(path) again for a new one"
    )


class DebugInputs(Mapping[str, Any]):
    """The arguments of one module call by name, defaults applied; read-only.

    Read them as attributes (`inputs.x`), by key (`inputs["x"]`) or unpacked into a
    call (`layer(**inputs)`). The values are the arrays of the call itself, not copies.
    """

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_values", dict(values))

    def _live(self) -> dict[str, Any]:
        values = object.__getattribute__(self, "_values")
        if values is None:
            raise _closed("input")
        return values

    def __getitem__(self, name: str) -> Any:
        values = self._live()
        if name not in values:
            raise UnknownArgumentError(
                f"{name!r} is not an argument of this call; it has {sorted(values)}"
            )
        return values[name]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        values = self._live()
        if name not in values:
            raise AttributeError(
                f"{name!r} is not an argument of this call; it has {sorted(values)}"
            )
        return values[name]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("DebugInputs are read-only; build a new dict to change an argument")

    def __iter__(self) -> Iterator[str]:
        return iter(self._live())

    def __len__(self) -> int:
        return len(self._live())

    def __repr__(self) -> str:
        values = object.__getattribute__(self, "_values")
        if values is None:
            return "DebugInputs(<closed>)"
        shown = ", ".join(f"{k}={_describe(v)}" for k, v in values.items())
        return f"DebugInputs({shown})"

    def close(self) -> None:
        """Release the arrays; later reads raise `DebugClosedError`."""
        object.__setattr__(self, "_values", None)


def _describe(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{value.dtype}{list(value.shape)}"
    return repr(value)


def _flatten(inputs: DebugInputs) -> tuple[Any, Any]:
    values = inputs._live()
    return [(jax.tree_util.DictKey(k), v) for k, v in values.items()], tuple(values)


def _unflatten(names: Any, children: Any) -> DebugInputs:
    return DebugInputs(dict(zip(names, children, strict=True)))


jax.tree_util.register_pytree_with_keys(DebugInputs, _flatten, _unflatten)


class DebugLayer:
    """A module bound to its real variables, callable like the module itself.

    Attributes of the module pass through (`layer.c_fc(x)` calls the bound
    submodule; `layer.config` reads its settings). `module` is the bound Flax module.
    """

    __slots__ = ("_module", "_path")

    def __init__(self, module: nn.Module, path: str) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_path", path)

    @property
    def module(self) -> nn.Module:
        """The bound Flax module."""
        module = object.__getattribute__(self, "_module")
        if module is None:
            raise _closed("layer")
        return module

    @property
    def path(self) -> str:
        """Where the module sits in the model (`"blocks_0/attn"`)."""
        return str(object.__getattribute__(self, "_path"))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a DebugLayer is read-only")

    def __repr__(self) -> str:
        module = object.__getattribute__(self, "_module")
        if module is None:
            return f"DebugLayer({self.path!r}, <closed>)"
        return f"DebugLayer({self.path!r}, {type(module).__name__})"

    def close(self) -> None:
        """Release the bound variables; later use raises `DebugClosedError`."""
        object.__setattr__(self, "_module", None)


class DebugSession:
    """What `trainer.debug(path)` returns: a `(layer, inputs)` pair that can be released.

    Example:
        `layer, inputs = trainer.debug("blocks_0/attn")`, or
        `with trainer.debug("blocks_0/attn") as (layer, inputs): ...`
    """

    def __init__(self, layer: DebugLayer, inputs: DebugInputs) -> None:
        self.layer = layer
        self.inputs = inputs

    def __iter__(self) -> Iterator[Any]:
        return iter((self.layer, self.inputs))

    def __enter__(self) -> DebugSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the layer and its inputs (their arrays can then be freed)."""
        self.layer.close()
        self.inputs.close()

    def __repr__(self) -> str:
        return f"DebugSession({self.layer!r}, {self.inputs!r})"


class _Captured(Exception):
    """Raised inside the trace once every wanted call is captured: the rest is not run."""


def _arguments(context: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """An intercepted call's arguments by name (the module is already bound in)."""
    return _named(inspect.signature(context.orig_method), args, kwargs)


# ----------------------------------------------------------- lifted transforms
# `nn.remat(Block)` etc. return a subclass of `Block` whose `__call__` is Flax's
# `wrapped_fn` (functools.wraps copies its name and the flag that keeps Flax from
# wrapping it again, so `nn.intercept_methods` never sees that outer call). While
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
_make_lifted = nn.transforms.module_class_lift_transform  # the original, never hooked
_hooks: list[Callable[..., Any]] = []


def _trace_state() -> Any:
    """The trace values are being computed in (a transform opens a new one)."""
    try:
        from jax.extend.core import get_opaque_trace_state
    except ImportError:  # JAX 0.9 exports it from jax.core only
        from jax.core import get_opaque_trace_state
    return get_opaque_trace_state(convention="flax")


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


def _join(prefix: str, path: str) -> str:
    return "/".join(p for p in (prefix, path) if p)


def discover(run: Callable[[], Any], target: type | tuple[type, ...]) -> list[str]:
    """Paths of every `__call__` of a `target` module while `run()` runs, in call order.

    Args:
        run: runs the model once (call it under `jax.eval_shape` to spend no FLOPs).
        target: a module class (or tuple of classes); subclasses match too.

    Returns:
        Each path once, as a string (`""` is the root module).
    """
    found: list[str] = []

    def listen(next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
        wanted = context.method_name == "__call__" and isinstance(context.module, target)
        if wanted:
            path = path_of(context.module)
            if path not in found:
                found.append(path)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(listen):
        run()
    return found


class _Restart(Exception):
    """A selected call ran inside a lifted transform whose class was not hooked yet."""


_WHOLE = {
    "vmap": "the whole vmapped batch of calls (outputs stacked on the mapped axis)",
    "scan": "every iteration of the scan (outputs stacked on the scanned axis)",
}


def _named(signature: inspect.Signature, args: Any, kwargs: Any) -> dict[str, Any]:
    """`args` and `kwargs` bound to `signature` by name, defaults filled, `**kwargs` spread."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


def capture(
    run: Callable[[], Any], paths: Sequence[str], rngs: dict[str, jax.Array] | None = None
) -> list[tuple[nn.Module, DebugInputs]]:
    """Run `run()` until the first `__call__` at each of `paths`; return them bound.

    Calls inside Flax lifted transforms are taken at the transformed module's own
    call (see the module docstring): a transformed module itself is returned bound as
    it is (calling it runs the transform), a call inside `nn.remat`/`nn.jit` comes from
    the original class run untransformed on the same variables and arguments, a call
    below `nn.vmap`/`nn.scan` from the original class run under the same transform with
    its values returned stacked on a leading axis (one entry per mapped call or per
    iteration) and its module wrapped in `nn.vmap` over that axis.

    Args:
        run: runs the model once (eagerly, or while tracing under `jax.jit`).
        paths: module paths, as `discover` returns them.
        rngs: RNG streams the returned modules are bound with (none: deterministic use).

    Returns:
        `(module, inputs)` per path, in the order of `paths`: each module is bound to
        the variables it was called with and usable after `run` stops.

    Raises:
        UnknownPathError: `run()` finished without calling some of the paths.
        TransformedCallError: a path is called below a transform that is neither
            value-transparent nor mapped (or an `nn.scan` that carries variables), or
            inside a JAX transform that no module call wraps.
    """
    if isinstance(paths, str) or not all(isinstance(path, str) for path in paths):
        raise UnknownPathError(
            "capture() takes a list of module paths as strings like ['blocks_0/attn'] (as "
            f"discover() returns them); got {paths!r}."
        )
    wanted = list(dict.fromkeys(paths))
    undo: list[Callable[[], None]] = []
    hooked: set[type] = set()
    restarted: set[str] = set()
    try:
        with _hook_new_classes(hooked, undo):
            while True:
                try:
                    got = _capture_once(run, wanted, rngs, hooked, restarted)
                    break
                except _Restart as restart:
                    [boundary, classes] = restart.args
                    restarted.add(boundary)
                    for cls in classes:
                        hooked.add(cls)
                        undo.append(_hook(cls))
    finally:
        for step in reversed(undo):
            step()
    missing = [p for p in wanted if p not in got]
    if missing:
        called = discover(run, nn.Module)  # every path the trace calls, for the message
        check_paths([p for p in missing if p not in called], called, "capture()")
        raise UnknownPathError(
            f"the trace finished without calling module path(s) {missing}; a path that "
            "discovery found must be called on every run (does the trace branch on its inputs?)"
        )
    return [got[p] for p in paths]


@dataclasses.dataclass
class _Level:
    """Where calls are being taken: the run itself, or the body of a mapped transform.

    Attributes:
        trace: the trace state calls at this level run in.
        recorded: inside a probed `nn.vmap`/`nn.scan` body, the selected calls seen
            there (module, arguments by name), returned from the body stacked; None for
            the run itself, whose calls are taken as they come.
    """

    trace: Any
    recorded: dict[str, tuple[nn.Module, dict[str, Any]]] | None = None


class _MappedLeaf:
    """Stands for an array argument in a probed call's arguments (returned stacked)."""


_MAPPED_LEAF = _MappedLeaf()


def _attributes(module: nn.Module) -> dict[str, Any]:
    """The dataclass fields a module was constructed with (what a copy of it needs)."""
    return {
        f.name: getattr(module, f.name)
        for f in dataclasses.fields(module)
        if f.name != "parent" and f.init
    }


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array | np.ndarray)


def _subtree(variables: Mapping[str, Any], path: str) -> dict[str, Any]:
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


def _public_methods(cls: type) -> list[str]:
    """`__call__` and the public methods `cls` defines below `nn.Module` (mapped on a layer)."""
    names = ["__call__"]
    for klass in cls.__mro__:
        if klass is nn.Module or not issubclass(klass, nn.Module):
            continue
        for name, value in vars(klass).items():
            public = not name.startswith("_") and name != "setup"
            if public and inspect.isfunction(value) and name not in names:
                names.append(name)
    return names


def _layer_mapping(
    kind: str, path: str, trafo_args: tuple[Any, ...], trafo_kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`lift.vmap` arguments that map a call below `nn.vmap`/`nn.scan` over its stacked values.

    The variables keep the transform's own axes (`variable_axes`; an `nn.scan`'s
    broadcast collections are shared), RNGs are split as the transform splits them,
    and every positional argument and output is mapped over axis 0.
    """
    if kind == "vmap":
        variable_axes, split_rngs = trafo_args
        names = ("axis_name", "spmd_axis_name")
        extra: dict[str, Any] = {k: trafo_kwargs[k] for k in names if k in trafo_kwargs}
    else:
        if trafo_kwargs.get("variable_carry", False) is not False:
            raise TransformedCallError(
                f"the calls below nn.scan at {path!r} cannot be taken apart: it carries "
                f"variables from one iteration to the next (variable_carry="
                f"{trafo_kwargs['variable_carry']!r}); select {path!r} instead"
            )
        variable_axes = dict(trafo_kwargs.get("variable_axes", {}))
        broadcast = trafo_kwargs.get("variable_broadcast", False)
        if broadcast is not False:
            variable_axes[broadcast] = None
        split_rngs = trafo_kwargs.get("split_rngs", {})
        extra = {}
    metadata = trafo_kwargs.get("metadata_params", {})
    return (variable_axes, split_rngs), {"metadata_params": metadata, **extra}


def _capture_once(
    run: Callable[[], Any],
    wanted: list[str],
    rngs: dict[str, jax.Array] | None,
    hooked: set[type],
    restarted: set[str],
) -> dict[str, tuple[nn.Module, DebugInputs]]:
    got: dict[str, tuple[nn.Module, DebugInputs]] = {}
    levels = [_Level(_trace_state())]  # the innermost is where calls are taken now
    prefix = [""]  # where the copy being run (untransformed or probed) sits in the model
    stack: list[tuple[str, bool, type]] = []  # active calls: (path, at its level, class)

    def take(module: nn.Module, path: str, named: dict[str, Any], bound: bool = False) -> None:
        recorded = levels[-1].recorded
        if recorded is not None:  # inside a probe: returned from its body, taken after it
            recorded.setdefault(path, (module, named))
            return
        if not bound:
            module = module.clone(parent=None).bind(dict(module.variables), rngs=rngs)
        got[path] = (module, DebugInputs(named))
        if len(got) == len(wanted):
            raise _Captured

    def pending(path: str) -> bool:
        recorded = levels[-1].recorded
        return path in wanted and path not in got and (recorded is None or path not in recorded)

    def inside(path: str) -> None:
        """`path` is called in a trace a transform opened: hook its class, or explain."""
        foreign = [frame for frame in stack if not frame[1]]
        boundary, _, cls = foreign[0] if foreign else (path, False, type(None))
        outer = [frame[0] for frame in stack if frame[1]]
        around = repr(outer[-1]) if outer else ""
        subclasses = _lifted_subclasses(cls) if foreign else []
        classes = [c for c in subclasses if c not in hooked]
        if classes and boundary not in restarted:
            raise _Restart(boundary, classes)
        around_cls = _lifted_call_around() if subclasses else None
        if around_cls is not None:  # hooked, yet not seen from outside: not made by Flax
            kind = (lifted(around_cls) or ("transform", cls))[0]
            raise TransformedCallError(
                f"module path {path!r} is called inside nn.{kind} at {boundary!r}, whose "
                "transformed class was not created through flax.linen.transforms while the "
                "capture ran, so its values cannot leave the transform; create the class "
                f"with nn.{kind}(Module, ...) and use it"
            )
        if not outer:
            raise TransformedCallError(
                f"module path {path!r} is called inside a JAX transformation (jax.jit, "
                "jax.vmap, jax.grad, ...) that `run` opens around the model, so its values "
                "cannot leave it; call the model directly in `run` (capture() itself may run "
                "under jax.jit: jax.jit(lambda x: capture(lambda: model.apply(v, x), paths)))"
            )
        raise TransformedCallError(
            f"module path {path!r} is called inside a JAX transformation that module "
            f"{around} opens with no lifted module class around it (a Flax function "
            "transform such as nn.cond, nn.switch or nn.while_loop, or jax.lax.scan, "
            "jax.vmap, ... over module calls), so its values cannot leave it; select "
            f"{around} instead, or make the transformed part a module class lifted with "
            "nn.vmap, nn.scan or nn.remat"
        )

    def listen(next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        module = context.module
        path = _join(prefix[-1], path_of(module))
        here = _trace_state() == levels[-1].trace
        if pending(path):
            if not here:
                stack.append((path, here, type(module)))
                try:
                    inside(path)
                finally:
                    stack.pop()
            take(module, path, _arguments(context, args, kwargs))
        stack.append((path, here, type(module)))
        try:
            return next_fun(*args, **kwargs)
        finally:
            stack.pop()

    def probe(module: nn.Module, original: Any, path: str, kind: str, args: Any) -> None:
        """Run a mapped module's original class under its transform; take the calls below.

        The body records the selected calls below (at its own level) and returns their
        array arguments next to its output, so they leave the transform stacked on
        axis 0; each is then taken with its module wrapped in `nn.vmap` over that axis.
        """
        transform, trafo_args, trafo_kwargs = _lift_arguments(original)
        layer_args, layer_kwargs = _layer_mapping(kind, path, trafo_args, trafo_kwargs)
        cls = lifted(type(module))[1]  # type: ignore[index]
        recorded: dict[str, tuple[nn.Module, dict[str, Any]]] = {}
        kept: dict[str, tuple[Any, list[Any]]] = {}

        def body(copy: nn.Module, *inner: Any) -> Any:
            recorded.clear()  # a transform may trace its body more than once
            levels.append(_Level(_trace_state(), recorded))
            prefix.append(path)
            try:
                out = copy(*inner)
            finally:
                prefix.pop()
                levels.pop()
            found: dict[str, list[Any]] = {}
            for where, (_, named) in recorded.items():
                leaves, treedef = jax.tree_util.tree_flatten(named)
                kept[where] = (treedef, [_MAPPED_LEAF if _is_array(x) else x for x in leaves])
                found[where] = [x for x in leaves if _is_array(x)]
            values = (found, jnp.zeros((), jnp.int8))  # the marker stacks to [axis size]
            if kind == "scan":
                carry, ys = out
                return carry, (ys, values)
            return out, values

        out_axes = (trafo_kwargs.get("out_axes", 0), 0)
        probed = nn.transforms.decorator_lift_transform(
            transform, body, *trafo_args, **{**trafo_kwargs, "out_axes": out_axes}
        )
        copy = cls(parent=None, **_attributes(module)).bind(dict(module.variables), rngs=rngs)
        out = probed(copy, *args)
        found, marker = out[1][1] if kind == "scan" else out[1]
        for where, (inner_module, _) in recorded.items():
            treedef, leaves = kept[where]
            arrays = iter(found[where])
            named = jax.tree_util.tree_unflatten(
                treedef, [next(arrays) if x is _MAPPED_LEAF else x for x in leaves]
            )
            inner_cls = type(inner_module)
            layer_cls = _make_lifted(
                lift.vmap,
                inner_cls,
                *layer_args,
                methods=_public_methods(inner_cls),
                in_axes=0,
                out_axes=0,
                axis_size=marker.shape[0],
                **layer_kwargs,
            )
            relative = where[len(path) + 1 :] if path else where
            variables = _subtree(module.variables, relative)
            layer = layer_cls(parent=None, **_attributes(inner_module))
            take(layer.bind(variables, rngs=rngs), where, named, bound=True)

    def outer_call(module: nn.Module, original: Any, args: Any, kwargs: Any) -> Any:
        """The call of a lifted module, outside its transform (the hooked `__call__`)."""
        path = _join(prefix[-1], path_of(module))
        kind, cls = lifted(type(module)) or ("", type(module))
        if (
            _trace_state() != levels[-1].trace
        ):  # nested in another transform: the inner call decides
            return original(module, *args, **kwargs)
        if pending(path):
            named = _named(inspect.signature(cls.__call__), (module, *args), kwargs)
            named.pop(next(iter(named)))  # self
            take(module, path, named)
        below = [p for p in wanted if pending(p) and p.startswith(path + "/" if path else "")]
        if below and kind in _TRANSPARENT:
            copy = cls(parent=None, **_attributes(module)).bind(dict(module.variables), rngs=rngs)
            prefix.append(path)
            try:
                copy(*args, **kwargs)
            finally:
                prefix.pop()
        elif below and kind in _MAPPED:
            probe(module, original, path, kind, args)
        elif below:
            name = f"nn.{kind}" if kind else "a Flax transform"
            what = _WHOLE.get(kind, "the transformed call as a whole")
            raise TransformedCallError(
                f"module path {below[0]!r} is called inside {name} at {path!r}, whose calls "
                f"cannot be taken apart outside the transform; select {path!r} instead (the "
                f"{type(module).__name__} module bound, with its arguments: calling it runs "
                f"{what})"
            )
        return original(module, *args, **kwargs)

    _hooks.append(outer_call)
    try:
        with nn.intercept_methods(listen):
            run()
    except _Captured:
        pass
    finally:
        _hooks.pop()
    return got
