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

`DebugSession` is what `trainer.debug(path)` returns: unpack it
(`layer, inputs = trainer.debug(path)`) or use it as a context manager; `close()`
releases the layer and inputs, and using either afterwards is a `DebugClosedError`.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax

from theseus.errors import TheseusError

__all__ = [
    "DebugClosedError",
    "DebugInputs",
    "DebugLayer",
    "DebugSession",
    "DebugTargetError",
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
    signature = inspect.signature(context.orig_method)  # the module is already bound in
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    return named


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


def capture(
    run: Callable[[], Any], paths: Sequence[str], rngs: dict[str, jax.Array] | None = None
) -> list[tuple[nn.Module, DebugInputs]]:
    """Run `run()` until the first `__call__` at each of `paths`; return them bound.

    Args:
        run: runs the model once (eagerly, or while tracing under `jax.jit`).
        paths: module paths, as `discover` returns them.
        rngs: RNG streams the returned modules are bound with (none: deterministic use).

    Returns:
        `(module, inputs)` per path, in the order of `paths`: each module is bound to
        the variables it was called with and usable after `run` stops.

    Raises:
        UnknownPathError: `run()` finished without calling some of the paths.
    """
    wanted = list(dict.fromkeys(paths))
    got: dict[str, tuple[nn.Module, DebugInputs]] = {}

    def listen(next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
        module = context.module
        if context.method_name == "__call__":
            path = path_of(module)
            if path in wanted and path not in got:
                variables = dict(module.variables)
                bound = module.clone(parent=None).bind(variables, rngs=rngs)
                got[path] = (bound, DebugInputs(_arguments(context, args, kwargs)))
                if len(got) == len(wanted):
                    raise _Captured
        return next_fun(*args, **kwargs)

    try:
        with nn.intercept_methods(listen):
            run()
    except _Captured:
        pass
    missing = [p for p in wanted if p not in got]
    if missing:
        raise UnknownPathError(
            f"the trace finished without calling module path(s) {missing}; a path that "
            "discovery found must be called on every run (does the trace branch on its inputs?)"
        )
    return [got[p] for p in paths]
