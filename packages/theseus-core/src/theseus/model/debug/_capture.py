"""`capture`: run a trace until the selected module calls happen; return them bound.

Calls inside a Flax lifted transform are taken at the transformed module's own call,
outside the transform (see `theseus.model.debug`): a selected transformed module is
returned bound, called like its class (`_lifted.called_by_name`); a call below `nn.remat`/`nn.jit` comes from the original class
run untransformed on the same variables and arguments; a call below `nn.vmap`/`nn.scan`
from a probe that runs the original class under the same transform and returns the
call's array arguments stacked (`_mapped.mapped_layer` makes its module).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.model import hooks
from theseus.model.debug._discovery import (
    TransformedCallError,
    UnknownPathError,
    check_paths,
    discover,
)
from theseus.model.debug._lifted import (
    _MAPPED,
    _TRANSPARENT,
    _hook,
    _hook_new_classes,
    _hooks,
    _lift_arguments,
    _lifted_call_around,
    _lifted_subclasses,
    attributes,
    called_by_name,
    lifted,
    subtree,
)
from theseus.model.debug._mapped import is_array, layer_mapping, mapped_layer
from theseus.model.debug._session import DebugInputs

_WHOLE = {
    "vmap": "the whole vmapped batch of calls (outputs stacked on the mapped axis)",
    "scan": "every iteration of the scan (outputs stacked on the scanned axis)",
}


def capture(
    run: Callable[[], Any], paths: Sequence[str], rngs: dict[str, jax.Array] | None = None
) -> list[tuple[nn.Module, DebugInputs]]:
    """Run `run()` until the first `__call__` at each of `paths`; return them bound.

    Calls inside Flax lifted transforms are taken at the transformed module's own
    call (see the module docstring): a transformed module itself is returned bound
    (calling it runs the transform; it takes its arguments by keyword too), a call inside `nn.remat`/`nn.jit` comes from
    the original class run untransformed on the same variables and arguments, a call
    below `nn.vmap`/`nn.scan` from the original class run under the same transform with
    its values returned stacked on a leading axis (one entry per mapped call or per
    iteration) and its module mapped over that axis (`mapped_layer`), called like its class.

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

    def attempt(restart: hooks.Restart) -> dict[str, tuple[nn.Module, DebugInputs]]:
        return _capture_once(run, wanted, rngs, hooked, restarted, restart)

    def hook(boundary: str, classes: list[type]) -> None:
        """A selected call ran inside lifted classes not hooked yet: hook them, run again."""
        restarted.add(boundary)
        for cls in classes:
            hooked.add(cls)
            undo.append(_hook(cls))

    try:
        with _hook_new_classes(hooked, undo):
            got = hooks.restarting(attempt, hook)
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


def _capture_once(
    run: Callable[[], Any],
    wanted: list[str],
    rngs: dict[str, jax.Array] | None,
    hooked: set[type],
    restarted: set[str],
    restart: hooks.Restart,
) -> dict[str, tuple[nn.Module, DebugInputs]]:
    got: dict[str, tuple[nn.Module, DebugInputs]] = {}
    levels = [_Level(hooks.trace_state())]  # the innermost is where calls are taken now
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
            interception.stop()  # the rest of the trace is not run

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
            restart(boundary, classes)
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

    def listen(call: hooks.ModuleCall) -> Any:
        module = call.module
        path = hooks.join(prefix[-1], call.path)
        here = hooks.trace_state() == levels[-1].trace
        if pending(path):
            if not here:
                stack.append((path, here, type(module)))
                try:
                    inside(path)
                finally:
                    stack.pop()
            take(module, path, call.arguments)
        stack.append((path, here, type(module)))
        try:
            return call.proceed()
        finally:
            stack.pop()

    def probe(module: nn.Module, original: Any, path: str, kind: str, args: Any) -> None:
        """Run a mapped module's original class under its transform; take the calls below.

        The body records the selected calls below (at its own level) and returns their
        array arguments next to its output, so they leave the transform stacked on
        axis 0; each is then taken with its module mapped over that axis (`mapped_layer`).
        """
        transform, trafo_args, trafo_kwargs = _lift_arguments(original)
        layer_mapping(kind, path, trafo_args, trafo_kwargs)  # refuses a variable carry first
        cls = lifted(type(module))[1]  # type: ignore[index]
        recorded: dict[str, tuple[nn.Module, dict[str, Any]]] = {}
        kept: dict[str, tuple[Any, list[Any]]] = {}

        def body(copy: nn.Module, *inner: Any) -> Any:
            recorded.clear()  # a transform may trace its body more than once
            levels.append(_Level(hooks.trace_state(), recorded))
            prefix.append(path)
            try:
                out = copy(*inner)
            finally:
                prefix.pop()
                levels.pop()
            found: dict[str, list[Any]] = {}
            for where, (_, named) in recorded.items():
                leaves, treedef = jax.tree_util.tree_flatten(named)
                kept[where] = (treedef, [_MAPPED_LEAF if is_array(x) else x for x in leaves])
                found[where] = [x for x in leaves if is_array(x)]
            values = (found, jnp.zeros((), jnp.int8))  # the marker stacks to [axis size]
            if kind == "scan":
                carry, ys = out
                return carry, (ys, values)
            return out, values

        out_axes = (trafo_kwargs.get("out_axes", 0), 0)
        probed = nn.transforms.decorator_lift_transform(
            transform, body, *trafo_args, **{**trafo_kwargs, "out_axes": out_axes}
        )
        copy = cls(parent=None, **attributes(module)).bind(dict(module.variables), rngs=rngs)
        out = probed(copy, *args)
        found, marker = out[1][1] if kind == "scan" else out[1]
        for where, (inner_module, _) in recorded.items():
            treedef, leaves = kept[where]
            arrays = iter(found[where])
            named = jax.tree_util.tree_unflatten(
                treedef, [next(arrays) if x is _MAPPED_LEAF else x for x in leaves]
            )
            relative = where[len(path) + 1 :] if path else where
            layer = mapped_layer(
                inner_module,
                kind,
                path,
                trafo_args,
                trafo_kwargs,
                marker.shape[0],
                subtree(module.variables, relative),
                rngs,
            )
            take(layer, where, named, bound=True)

    def outer_call(module: nn.Module, original: Any, args: Any, kwargs: Any) -> Any:
        """The call of a lifted module, outside its transform (the hooked `__call__`)."""
        path = hooks.join(prefix[-1], hooks.path_of(module))
        kind, cls = lifted(type(module)) or ("", type(module))
        if (
            hooks.trace_state() != levels[-1].trace
        ):  # nested in another transform: the inner call decides
            return original(module, *args, **kwargs)
        if pending(path):
            named = hooks.named_arguments(inspect.signature(cls.__call__), (module, *args), kwargs)
            named.pop(next(iter(named)))  # self
            if kind:  # called like its class: `layer(**inputs)` (a transform drops keywords)
                take(called_by_name(module, rngs), path, named, bound=True)
            else:
                take(module, path, named)
        below = [p for p in wanted if pending(p) and p.startswith(path + "/" if path else "")]
        if below and kind in _TRANSPARENT:
            copy = cls(parent=None, **attributes(module)).bind(dict(module.variables), rngs=rngs)
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
        with hooks.intercept(listen) as interception:
            run()  # until `take` has every path: then `interception.stop()` ends it
    finally:
        _hooks.pop()
    return got
