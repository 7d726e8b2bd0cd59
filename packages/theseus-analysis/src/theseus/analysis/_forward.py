"""One forward of the trace with the selected calls' outputs passed through a callback.

`forward(run, paths, on_call, owner)` runs `run()` listening to its module calls
through `theseus.model.hooks`: the first `__call__` at each selected path (a site, as
the debugger captures it) returns what `on_call(path, module, arguments, output)`
returns, and each site's call is recorded (`hooks.Recorded`: module, variables,
arguments, output) as values of the caller's trace. A site inside an `nn.remat`/`nn.checkpoint` module is replaced inside the
transform (`theseus.model.debug.call_lifted` runs its body there); a site inside
any other transform is an `InterventionError`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax

from theseus.analysis._sites import InterventionError
from theseus.model import debug as _debug
from theseus.model import hooks
from theseus.model.hooks import Recorded

__all__ = ["OnCall", "Recorded", "forward", "is_array", "unchanged"]


# `(path, module, arguments by name, output) -> output to use`: what a forward does at a site.
OnCall = Callable[[str, nn.Module, dict[str, Any], Any], Any]

# Lifted transforms whose body's values are those of the untransformed call: a site
# inside one is replaced inside it, and its call leaves the transform as an extra output.
_REMAT = ("checkpoint", "remat")


@dataclasses.dataclass
class _Level:
    """A trace sites are taken in: the forward's own, or the body of an `nn.remat` in it."""

    trace: Any
    calls: dict[str, Recorded]


def forward(
    run: Callable[[], Any], paths: tuple[str, ...], on_call: OnCall, owner: str
) -> tuple[Any, dict[str, Recorded]]:
    """`run()` with the first `__call__` at each of `paths` passed through `on_call`.

    Returns `(run()'s result, each site's call)`: its module (unbound copy), variables,
    arguments and the output it returned before `on_call`, all as values of the
    caller's trace. A site inside an `nn.remat`/`nn.checkpoint` module is replaced
    inside the transform (its body runs under the same `jax.checkpoint`, so the
    backward recomputes the replaced block), and its call leaves the transform as an
    extra output. A site inside any other transform (`nn.scan`, `nn.vmap`) is an
    `InterventionError`.
    """
    levels: list[_Level] = []
    busy = [False]  # an intervention's own module calls are not sites

    def pending(path: str) -> bool:
        return path in paths and not any(path in level.calls for level in levels)

    def listen(restart: hooks.Restart, call: hooks.ModuleCall) -> Any:
        if busy[0]:
            return call.proceed()
        path = call.path
        if not pending(path):
            return call.proceed()
        if hooks.trace_state() != levels[-1].trace:
            around = _debug.lifted_call_around()
            if around is not None and around[0] in _REMAT and not around[2]:
                restart(around[1])  # an `nn.remat` class made before: hook it, run again
            kind = f"nn.{around[0]}" if around is not None else "a transform"
            raise InterventionError(
                f"{owner}: the call at {path!r} runs inside {kind} (nn.scan, nn.vmap, ...), "
                "whose values cannot be replaced from outside it; select the transformed "
                "module itself"
            )
        output = call.proceed()
        recorded = levels[-1].calls[path] = call.record(output)
        busy[0] = True
        try:
            return on_call(path, call.module, recorded.arguments, output)
        finally:
            busy[0] = False

    def outer(module: nn.Module, original: Any, args: Any, kwargs: Any) -> Any:
        """A lifted module's call: an `nn.remat` with sites below runs them inside it."""
        kind = (_debug.lifted(type(module)) or ("",))[0]
        path = hooks.path_of(module)
        below = [p for p in paths if pending(p) and _within(p, path)]
        here = hooks.trace_state() == levels[-1].trace
        if busy[0] or not here or kind not in _REMAT or not below:
            return original(module, *args, **kwargs)
        statics: dict[str, tuple[nn.Module, Any, list[Any]]] = {}

        def body(method: Callable[..., Any], *inner: Any, **named: Any) -> Any:
            statics.clear()  # a transform may trace its body more than once
            levels.append(_Level(hooks.trace_state(), {}))
            try:
                out = method(*inner, **named)
                calls = levels[-1].calls
            finally:
                levels.pop()
            arrays = {}
            for where, call in calls.items():  # the variables are read outside
                leaves, treedef = jax.tree_util.tree_flatten(call.arguments)
                statics[where] = (
                    call.module,
                    treedef,
                    [None if is_array(x) else x for x in leaves],
                )
                arrays[where] = ([x for x in leaves if is_array(x)], call.output)
            return out, arrays

        out, arrays = _debug.call_lifted(module, original, args, kwargs, body)
        for where, (given, output) in arrays.items():
            copy, treedef, kept = statics[where]
            values = iter(given)
            named = jax.tree_util.tree_unflatten(
                treedef, [next(values) if x is None else x for x in kept]
            )
            variables = _debug.subtree(module.variables, where[len(path) :].lstrip("/"))
            levels[-1].calls[where] = Recorded(copy, variables, named, output)
        return out

    def attempt(restart: hooks.Restart) -> Any:
        levels[:] = [_Level(hooks.trace_state(), {})]
        with hooks.intercept(functools.partial(listen, restart)):
            return run()

    with _debug.lifted_calls(outer) as hook:
        result = hooks.restarting(attempt, hook)
    [level] = levels
    missing = [p for p in paths if p not in level.calls]
    if missing:
        raise InterventionError(
            f"{owner}: the trace finished without calling {missing}; a selected path must be "
            "called on every forward"
        )
    return result, level.calls


def _within(path: str, root: str) -> bool:
    """Whether module `path` is `root` or below it (every path is below the root `""`)."""
    return not root or path == root or path.startswith(root + "/")


def unchanged(path: str, module: nn.Module, named: dict[str, Any], output: Any) -> Any:
    """An `OnCall` that changes nothing (a forward that only records the sites' calls)."""
    return output


def is_array(leaf: Any) -> bool:
    """Whether an argument leaf is an array (it leaves a transform as an output)."""
    return isinstance(leaf, jax.Array)
