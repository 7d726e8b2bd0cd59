"""The one hook on Flax module calls: each call named, recorded, replaced.

Flax linen hands every module method call to the interceptors installed with
`nn.intercept_methods`. This module is the only one that installs one (a test reads
the sources of the four packages); the debugger (`theseus.model.debug`), the analysis
engine's forward and the inspector's Flax recorder all listen through it:

- `intercept(listener)` runs a block with `listener(call)` in the way of every
  `__call__` (or of the methods named); `call` is a `ModuleCall`: the bound module,
  its `path` (`"blocks_0/attn"`, the root module is `""`), the `method`'s name and
  its `arguments` by name with defaults applied. The listener returns the call's
  output: `call.proceed()` runs it, `call.proceed(x=...)` runs it with arguments
  replaced by name, and anything else returned replaces the output downstream.
  The block yields an `Interception` whose `stop()` ends the run early.
- `discover(run, where)` lists the paths of the calls `where(call)` selects.
- `record(run, paths, replace)` records the first call at each path (a `Recorded`:
  module, variables, arguments, output) and replaces the output of each path in
  `replace`.
- `restarting(attempt, on_restart)` is the one way to start a run over: `attempt`
  gets a `restart(*why)` that abandons the run; `on_restart(*why)` runs (a listener
  that met an `nn.remat` class made before it hooks it there), then `attempt` again.

Calls inside a JAX or Flax transform (`jax.vmap`, `nn.remat`, `nn.scan`, ...) run in
the transform's own trace (`trace_state` tells them apart), so their values cannot
leave it: `record` refuses them; the debugger's `capture` takes them at the
transformed module's own call, and the engine's forward replaces a site inside an
`nn.remat` within the transform (both through `theseus.model.debug`'s lifted hooks).

Example:
    >>> import flax.linen as nn, jax, jax.numpy as jnp
    >>> from theseus.model import hooks
    >>> class Net(nn.Module):
    ...     @nn.compact
    ...     def __call__(self, x):
    ...         return nn.Dense(2, name="head")(x) + 1.0
    >>> net = Net()
    >>> variables = net.init(jax.random.key(0), jnp.ones((1, 3)))
    >>> run = lambda: net.apply(variables, jnp.ones((1, 3)))
    >>> hooks.discover(run, lambda call: isinstance(call.module, nn.Dense))
    ['head']
    >>> out, calls = hooks.record(run, ["head"], {"head": lambda rec: rec.output * 0})
    >>> out.tolist(), sorted(calls["head"].arguments)
    ([[1.0, 1.0]], ['inputs'])
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NoReturn, TypeVar

import flax.linen as nn

from theseus.errors import TheseusError

__all__ = [
    "HookError",
    "Interception",
    "ModuleCall",
    "Recorded",
    "Restart",
    "discover",
    "intercept",
    "join",
    "listening_depth",
    "named_arguments",
    "path_of",
    "record",
    "restarting",
    "trace_state",
]

T = TypeVar("T")

# A listener: gets each module call, returns what the call returns downstream.
Listener = Callable[["ModuleCall"], Any]
# What `restarting` hands an attempt: `restart(*why)` abandons the run (never returns).
Restart = Callable[..., NoReturn]


class HookError(TheseusError, ValueError):
    """A path `record` never saw called, a call it cannot record, or an argument a call lacks."""


def path_of(module: nn.Module) -> str:
    """The path string of a bound module: `"blocks_0/attn"`; the root module is `""`."""
    return "/".join(str(part) for part in module.path)


def join(prefix: str, path: str) -> str:
    """`prefix/path`, either of them possibly empty (the root module's path is `""`)."""
    return "/".join(p for p in (prefix, path) if p)


def named_arguments(signature: inspect.Signature, args: Any, kwargs: Any) -> dict[str, Any]:
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


def trace_state() -> Any:
    """The trace values are being computed in now (a transform opens a new one).

    Two calls see equal states exactly when they run in the same trace, so a call
    whose state differs from the caller's runs inside a transform the caller did not
    open.
    """
    try:
        from jax.extend.core import get_opaque_trace_state
    except ImportError:  # JAX 0.9 exports it from jax.core only
        from jax.core import get_opaque_trace_state
    return get_opaque_trace_state(convention="flax")


@dataclasses.dataclass(frozen=True)
class Recorded:
    """A recorded call: its module (an unbound copy), variables, arguments by name, output.

    `module.bind(variables)` is the module as the call ran it; `arguments` and
    `output` are values of the trace the call ran in.
    """

    module: nn.Module
    variables: dict[str, Any]
    arguments: dict[str, Any]
    output: Any


class ModuleCall:
    """One module method call, as a listener of `intercept` receives it.

    Attributes:
        module: the module, bound to the variables of the call.
        method: the method's name (`"__call__"`).
        args, kwargs: the arguments as the caller passed them (without `self`).
        function: the rest of the call (later listeners, then the method itself),
            called as `function(*args, **kwargs)`; `proceed()` calls it.
        bound_method: the method bound to `module`, whose signature names the arguments.
    """

    __slots__ = ("_arguments", "args", "bound_method", "function", "kwargs", "method", "module")

    def __init__(
        self,
        context: Any,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.module: nn.Module = context.module
        self.method: str = context.method_name
        self.bound_method: Callable[..., Any] = context.orig_method
        self.function = function
        self.args = args
        self.kwargs = kwargs
        self._arguments: dict[str, Any] | None = None

    @property
    def path(self) -> str:
        """The module's path, `"blocks_0/attn"` (the root module's is `""`)."""
        return path_of(self.module)

    @property
    def arguments(self) -> dict[str, Any]:
        """The arguments by name, defaults applied, a `**kwargs` parameter spread."""
        if self._arguments is None:
            signature = inspect.signature(self.bound_method)
            self._arguments = named_arguments(signature, self.args, self.kwargs)
        return dict(self._arguments)

    def proceed(self, **replaced: Any) -> Any:
        """Run the call, with the arguments named in `replaced` replaced; returns its output.

        Raises:
            HookError: a name the method takes no argument by (and has no `**kwargs`).
        """
        if not replaced:
            return self.function(*self.args, **self.kwargs)
        signature = inspect.signature(self.bound_method)
        bound = signature.bind(*self.args, **self.kwargs)
        parameters = signature.parameters
        spread = [n for n, p in parameters.items() if p.kind is inspect.Parameter.VAR_KEYWORD]
        for name, value in replaced.items():
            kind = parameters[name].kind if name in parameters else None
            if kind is not None and kind is not inspect.Parameter.VAR_POSITIONAL:
                bound.arguments[name] = value
            elif spread:
                bound.arguments[spread[0]] = {**bound.arguments.get(spread[0], {}), name: value}
            else:
                raise HookError(
                    f"{type(self.module).__name__}.{self.method} at {self.path!r} takes no "
                    f"argument named {name!r}; it takes {list(parameters)}: replace one of those"
                )
        return self.function(*bound.args, **bound.kwargs)

    def record(self, output: Any) -> Recorded:
        """This call as a `Recorded`, with `output` as what it returned."""
        module = self.module
        return Recorded(module.clone(parent=None), dict(module.variables), self.arguments, output)

    def __repr__(self) -> str:
        return f"ModuleCall({self.path!r}, {type(self.module).__name__}.{self.method})"


class _Stop(Exception):
    """Raised by `Interception.stop()`: the run ends there; its `intercept` block returns."""


class Interception:
    """What `intercept` yields: `stop()` ends the run inside its block early."""

    def stop(self) -> NoReturn:
        """End the run here: the rest of it is not run, and the `intercept` block exits."""
        raise _Stop(self)


@contextlib.contextmanager
def intercept(
    listener: Listener, methods: Iterable[str] | None = ("__call__",)
) -> Iterator[Interception]:
    """Within the block, every module call of `methods` (None: every method) goes through `listener`.

    `listener(call)` gets a `ModuleCall` and returns the call's output downstream
    (`call.proceed()` runs the call). Blocks nest: an inner block's listener sees a
    call after an outer one's, and `stop()` ends only its own block's run.

    Yields:
        An `Interception`; `stop()` leaves the block at once, as if the run had ended.
    """
    names = None if methods is None else frozenset(methods)
    interception = Interception()
    _LISTENING.depth = listening_depth() + 1

    def interceptor(
        function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], context: Any
    ) -> Any:
        if names is not None and context.method_name not in names:
            return function(*args, **kwargs)
        return listener(ModuleCall(context, function, args, kwargs))

    try:
        with nn.intercept_methods(interceptor):
            yield interception
    except _Stop as stop:
        if stop.args[0] is not interception:
            raise
    finally:
        _LISTENING.depth -= 1


# How many `intercept` blocks are open on each thread (Flax keeps its interceptors per
# thread too): a module reads it to keep its submodules' calls visible to a listener.
_LISTENING = threading.local()


def listening_depth() -> int:
    """How many `intercept` blocks are open on this thread (0: no listener).

    A module that can compute its output past its submodules' calls (the attention's
    fused path uses `c_attn`'s and `c_proj`'s kernels by einsum) does so only at 0, so
    a listener always sees, records and replaces every call it could name.
    """
    return getattr(_LISTENING, "depth", 0)


class _Restart(Exception):
    """Raised by a `restart` that `restarting` handed out: the run starts over."""


def restarting(attempt: Callable[[Restart], T], on_restart: Callable[..., Any]) -> T:
    """`attempt(restart)`, again after `on_restart(*why)` each time it calls `restart(*why)`.

    Args:
        attempt: one run; `restart(*why)` (never returns) abandons it. Nested
            `restarting` calls each restart only their own attempt.
        on_restart: what must change before the next attempt (e.g. a class to hook).

    Returns:
        What the first attempt that does not restart returns.
    """
    token = object()

    def restart(*why: Any) -> NoReturn:
        raise _Restart(token, why)

    while True:
        try:
            return attempt(restart)
        except _Restart as again:
            if again.args[0] is not token:
                raise
            on_restart(*again.args[1])


def discover(run: Callable[[], Any], where: Callable[[ModuleCall], bool]) -> list[str]:
    """The paths of the `__call__`s `where(call)` selects while `run()` runs, in call order.

    Args:
        run: runs the model once (under `jax.eval_shape` it spends no FLOPs).
        where: `where(call) -> bool`, e.g. `lambda call: isinstance(call.module, nn.Dense)`.

    Returns:
        Each path once, as a string (`""` is the root module).
    """
    found: list[str] = []

    def listen(call: ModuleCall) -> Any:
        if where(call):
            path = call.path
            if path not in found:
                found.append(path)
        return call.proceed()

    with intercept(listen):
        run()
    return found


def record(
    run: Callable[[], T],
    paths: Iterable[str],
    replace: Mapping[str, Callable[[Recorded], Any]] | None = None,
) -> tuple[T, dict[str, Recorded]]:
    """`run()` with the first `__call__` at each path recorded, and some outputs replaced.

    Args:
        run: runs the model once.
        paths: module paths (`"blocks_0/attn"`) whose first call is recorded.
        replace: path -> `fn(recorded)`; what it returns replaces that call's output
            for everything downstream (these paths are recorded too). Module calls
            that `fn` makes itself are neither recorded nor replaced.

    Returns:
        `(run()'s result, path -> Recorded)`; each record holds the call's own output.

    Raises:
        HookError: a path `run()` never calls, or calls inside a transform (its
            values live in the transform's trace; `theseus.model.debug.capture`
            takes such calls at the transformed module instead).
    """
    replace = dict(replace or {})
    wanted = list(dict.fromkeys([*paths, *replace]))
    calls: dict[str, Recorded] = {}
    busy = [False]  # a replacement's own module calls
    trace = trace_state()

    def listen(call: ModuleCall) -> Any:
        path = call.path
        if busy[0] or path not in wanted or path in calls:
            return call.proceed()
        if trace_state() != trace:
            raise HookError(
                f"record() cannot take the call at {path!r}: it runs inside a transform "
                "(jax.vmap, nn.remat, nn.scan, ...), whose values cannot leave it; record "
                "the transformed module's path instead, or use theseus.model.debug.capture"
            )
        output = call.proceed()
        calls[path] = call.record(output)
        if path not in replace:
            return output
        busy[0] = True
        try:
            return replace[path](calls[path])
        finally:
            busy[0] = False

    with intercept(listen):
        result = run()
    missing = [p for p in wanted if p not in calls]
    if missing:
        raise HookError(
            f"record() asked for module path(s) {missing}, which the run never called; "
            "list the calls with hooks.discover(run, lambda call: True) and pick from those"
        )
    return result, calls
