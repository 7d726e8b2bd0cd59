"""Compiled interventions: the trace runs on, with selected calls' outputs replaced.

`compile_intervention` builds `fn(state, batch, key) -> results` under one `jax.jit`,
like `compile_analysis`, but the trace is not cut at the selected calls: it runs to
its end, and `measure(outcome)` reads what the intervention changed downstream.

    source   = trace(batch), calls recorded           (only when `corrupt` is given)
    target   = corrupt(batch) if given, else batch
    baseline = trace(target), calls recorded
    exact:   for each (site s, variant k), in a `jax.lax.map`:
                 trace(target) with call s returning intervene(Site(..., variant=k))
    linear:  one forward and one backward of trace(target) give d measure / d output
             at every site; each replacement's effect is estimated as
             sum(grad * (replacement - output))   (attribution patching)
    results  = analyze(Effect(baseline, intervened, source))

Every site's replacement is under `jax.lax.cond` on the variant index, so a forward
computes only its own site's intervention and the program is traced once however
many sites and variants a sweep has: `n` interventions cost `n` forwards plus the
baseline (and the source). Calls are intercepted with `nn.intercept_methods`; the
first `__call__` at each selected path is the site (as the debugger captures it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.analysis._engine import Selection, _check_leaves
from theseus.analysis._errors import AnalysisError
from theseus.model import debug as _debug
from theseus.training import keys
from theseus.training.sharding import ParameterShardingContext

__all__ = ["Call", "Effect", "InterventionError", "Outcome", "Site", "compile_intervention"]


class InterventionError(AnalysisError):
    """An intervention that cannot run: a replacement of the wrong shape, a measure that
    is not a scalar where one is needed, a site inside a transform."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Call:
    """One call's arguments by name and what it returned (on the source batch, when patching)."""

    inputs: Any
    output: Any


@dataclasses.dataclass(frozen=True)
class Site:
    """A selected call, as `intervene(site)` sees it during an intervened forward.

    Attributes:
        path: the call's module path (`"blocks_1/attn"`).
        index: its position in the selection (0 for a single path).
        layer: the module bound to its variables (`site.layer.heads(site.inputs.x)`).
        inputs: the call's arguments by name (`site.inputs.x`).
        output: what the call returned; `intervene` returns a replacement of the same
            shapes and dtypes.
        variant: which of `variants(layer)` interventions this forward makes at this
            site (a traced int32 scalar: index arrays with it, e.g.
            `heads[:, :, site.variant]`); 0 when the analysis declares no variants.
        source: the same call on the source batch (`corrupt()` defined), else None.
    """

    path: str
    index: int
    layer: Any
    inputs: Any
    output: Any
    variant: Any
    source: Call | None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one forward produced, as `measure(outcome)` reads it.

    Attributes:
        output: what the trainer's `trace` returned.
        logits: `output[0]` when the trace returns `forward`'s `(logits, loss, metadata)`,
            else None.
        loss: `output[1]` likewise (the batch's mean cross-entropy), else None.
        batch: the rows this forward ran on (`batch["y"]`: the targets).
    """

    output: Any
    batch: Any
    logits: Any = None
    loss: Any = None

    @classmethod
    def of(cls, output: Any, batch: Any) -> Outcome:
        if isinstance(output, tuple) and len(output) >= 2:
            logits, loss = output[0], output[1]
            if isinstance(logits, jax.Array) and isinstance(loss, jax.Array | None):
                return cls(output, batch, logits, loss)
        return cls(output, batch)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Effect:
    """What `analyze(effect)` receives: `measure()` with and without the interventions.

    Attributes:
        baseline: `measure()` of the forward the interventions change, run without them
            (on `corrupt(batch)` when `corrupt` is defined, else on the batch).
        intervened: `measure()` of each intervened forward, stacked: a leading axis over
            the selected paths when `select()` returned a list, then one over the
            variants when `variants()` is defined. With `ESTIMATE = "linear"`, the
            linear estimates of those measures (attribution patching).
        source: `measure()` of the source batch (the batch itself) when `corrupt` is
            defined, else None.
    """

    baseline: Any
    intervened: Any
    source: Any = None

    @property
    def change(self) -> Any:
        """`intervened - baseline`, leaf by leaf (broadcast over the sweep's axes)."""
        return jax.tree.map(jnp.subtract, self.intervened, self.baseline)


# `(path, module, arguments by name, output) -> output to use`: what a forward does at a site.
OnCall = Callable[[str, nn.Module, dict[str, Any], Any], Any]

# Lifted transforms whose body's values are those of the untransformed call: a site
# inside one is replaced inside it, and its call leaves the transform as an extra output.
_REMAT = ("checkpoint", "remat")


@dataclasses.dataclass
class _Level:
    """A trace sites are taken in: the forward's own, or the body of an `nn.remat` in it."""

    trace: Any
    calls: dict[str, _Recorded]


class _Restart(Exception):
    """A site ran inside an `nn.remat` class made before the forward: hook it, run again."""


def _forward(
    run: Callable[[], Any], paths: tuple[str, ...], on_call: OnCall, owner: str
) -> tuple[Any, dict[str, _Recorded]]:
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

    def listen(next_fun: Callable[..., Any], args: Any, kwargs: Any, context: Any) -> Any:
        if busy[0] or context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        path = _debug.path_of(context.module)
        if not pending(path):
            return next_fun(*args, **kwargs)
        if _debug._trace_state() != levels[-1].trace:
            around = _debug.lifted_call_around()
            if around is not None and around[0] in _REMAT and not around[2]:
                raise _Restart(around[1])
            kind = f"nn.{around[0]}" if around is not None else "a transform"
            raise InterventionError(
                f"{owner}: the call at {path!r} runs inside {kind} (nn.scan, nn.vmap, ...), "
                "whose values cannot be replaced from outside it; select the transformed "
                "module itself"
            )
        output = next_fun(*args, **kwargs)
        module = context.module
        named = _debug._arguments(context, args, kwargs)
        levels[-1].calls[path] = _Recorded(
            module.clone(parent=None), dict(module.variables), named, output
        )
        busy[0] = True
        try:
            return on_call(path, module, named, output)
        finally:
            busy[0] = False

    def outer(module: nn.Module, original: Any, args: Any, kwargs: Any) -> Any:
        """A lifted module's call: an `nn.remat` with sites below runs them inside it."""
        kind = (_debug.lifted(type(module)) or ("",))[0]
        path = _debug.path_of(module)
        below = [p for p in paths if pending(p) and _within(p, path)]
        here = _debug._trace_state() == levels[-1].trace
        if busy[0] or not here or kind not in _REMAT or not below:
            return original(module, *args, **kwargs)
        statics: dict[str, tuple[nn.Module, Any, list[Any]]] = {}

        def body(method: Callable[..., Any], *inner: Any, **named: Any) -> Any:
            statics.clear()  # a transform may trace its body more than once
            levels.append(_Level(_debug._trace_state(), {}))
            try:
                out = method(*inner, **named)
                calls = levels[-1].calls
            finally:
                levels.pop()
            arrays = {}
            for where, call in calls.items():  # the variables are read outside
                leaves, treedef = jax.tree_util.tree_flatten(call.named)
                statics[where] = (
                    call.module,
                    treedef,
                    [None if _is_array(x) else x for x in leaves],
                )
                arrays[where] = ([x for x in leaves if _is_array(x)], call.output)
            return out, arrays

        out, arrays = _debug.call_lifted(module, original, args, kwargs, body)
        for where, (given, output) in arrays.items():
            copy, treedef, kept = statics[where]
            values = iter(given)
            named = jax.tree_util.tree_unflatten(
                treedef, [next(values) if x is None else x for x in kept]
            )
            variables = _debug._subtree(module.variables, where[len(path) :].lstrip("/"))
            levels[-1].calls[where] = _Recorded(copy, variables, named, output)
        return out

    with _debug.lifted_calls(outer) as hook:
        while True:
            levels[:] = [_Level(_debug._trace_state(), {})]
            try:
                with nn.intercept_methods(listen):
                    result = run()
                break
            except _Restart as restart:
                hook(restart.args[0])
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


def _check_replacement(new: Any, old: Any, path: str, owner: str) -> Any:
    """`new` cast to `old`'s dtypes; a different structure or shape is an error."""
    got, want = jax.tree.structure(new), jax.tree.structure(old)
    if got != want:  # type: ignore[operator]
        raise InterventionError(
            f"{owner}.intervene() at {path!r} returned {got}; it must return what the call "
            f"returned, {want}"
        )

    def cast(a: Any, b: Any) -> Any:
        a = jnp.asarray(a)
        if a.shape != b.shape:
            raise InterventionError(
                f"{owner}.intervene() at {path!r} returned shape {a.shape}; the call returned "
                f"{b.shape} (broadcast explicitly, e.g. jnp.broadcast_to(v, site.output.shape))"
            )
        return a.astype(b.dtype)

    return jax.tree.map(cast, new, old)


@dataclasses.dataclass(frozen=True)
class Hooks:
    """The analysis's methods the engine calls (bound), and its choices."""

    intervene: Callable[[Site], Any]
    measure: Callable[[Outcome], Any]
    analyze: Callable[[Effect], Any]
    variants: Callable[[Any], int | None]
    corrupt: Callable[[dict[str, Any]], dict[str, Any]] | None
    estimate: str  # "exact" | "linear"


def compile_intervention(
    trace: Callable[..., Any],
    hooks: Hooks,
    selection: Selection,
    sharding: ParameterShardingContext,
    owner: str,
    on_trace: Callable[[], None] | None = None,
) -> Any:
    """`jax.jit` of `fn(state, batch, key) -> analyze(Effect(...))`, results replicated.

    Args:
        trace: the trainer's `trace` classmethod.
        hooks: the analysis's `intervene`, `measure`, `analyze`, `variants`, `corrupt`.
        selection: the checked selection (the sites, in order).
        sharding: the trainer's mesh and rules.
        owner: the analysis class name, for messages.
        on_trace: called each time the function is traced (to count compilations).
    """
    paths = selection.paths

    def run(state: Any, batch: dict[str, Any], key: jax.Array | None) -> Any:
        if on_trace is not None:
            on_trace()
        rngs = keys.layer_rngs(key)

        def forward(rows: dict[str, Any], on_call: OnCall) -> tuple[Outcome, dict[str, _Recorded]]:
            output, calls = _forward(
                lambda: trace(state, rows, key, sharding=sharding), paths, on_call, owner
            )
            return Outcome.of(output, rows), calls

        def measure(outcome: Outcome) -> Any:
            return hooks.measure(outcome)

        sources: dict[str, Call] = {}
        source = None
        if hooks.corrupt is not None:
            outcome, calls = forward(batch, _unchanged)
            source = measure(outcome)
            sources = {p: Call(_debug.DebugInputs(c.named), c.output) for p, c in calls.items()}
            target = hooks.corrupt(batch)
        else:
            target = batch

        def replacement(call: _Recorded, path: str, k: Any) -> Any:
            layer = _debug.DebugLayer(call.module.bind(call.variables, rngs=rngs), path)
            given = _debug.DebugInputs(call.named)
            site = Site(path, paths.index(path), layer, given, call.output, k, sources.get(path))
            try:
                new = hooks.intervene(site)
            finally:
                layer.close()
                given.close()
            return _check_replacement(new, call.output, path, owner)

        def count(recorded: dict[str, _Recorded]) -> int | None:
            counts = {}
            for path in paths:
                call = recorded[path]
                layer = _debug.DebugLayer(call.module.bind(call.variables, rngs=rngs), path)
                try:
                    counts[path] = hooks.variants(layer)
                finally:
                    layer.close()
            return _check_variants(counts, owner)

        if hooks.estimate == "linear":
            baseline, recorded, grads = _gradients(forward, measure, target, paths, owner)
            variants = count(recorded)
            width = variants or 1
            rows = []
            for path in paths:
                call = recorded[path]

                def estimate(k: jax.Array, call: _Recorded = call, path: str = path) -> Any:
                    terms = jax.tree.map(
                        lambda g, new, old: jnp.sum(
                            g.astype(jnp.float32) * (new - old).astype(jnp.float32)
                        ),
                        grads[path],
                        replacement(call, path, k),
                        call.output,
                    )
                    return baseline + sum(jax.tree.leaves(terms))

                rows.append(jax.lax.map(estimate, jnp.arange(width, dtype=jnp.int32)))
            intervened = jnp.stack(rows)
        else:
            outcome, recorded = forward(target, _unchanged)
            baseline = measure(outcome)
            variants = count(recorded)
            width = variants or 1

            def one(i: jax.Array) -> Any:
                site, k = i // width, i % width

                def at(path: str, module: nn.Module, named: dict[str, Any], output: Any) -> Any:
                    call = _Recorded(
                        module.clone(parent=None), dict(module.variables), named, output
                    )
                    return jax.lax.cond(
                        site == paths.index(path),
                        lambda: replacement(call, path, k),
                        lambda: output,
                    )

                return measure(forward(target, at)[0])

            flat = jax.lax.map(one, jnp.arange(len(paths) * width, dtype=jnp.int32))
            intervened = jax.tree.map(lambda a: a.reshape(len(paths), width, *a.shape[1:]), flat)
        if variants is None:
            intervened = jax.tree.map(lambda a: a[:, 0], intervened)
        if not selection.many:
            intervened = jax.tree.map(lambda a: a[0], intervened)
        results = hooks.analyze(Effect(baseline, intervened, source))
        leaves, treedef = jax.tree_util.tree_flatten_with_path(results)
        _check_leaves(leaves, owner)
        return jax.tree_util.tree_unflatten(treedef, [leaf for _, leaf in leaves])

    return jax.jit(run, out_shardings=sharding.replicated())


@dataclasses.dataclass(frozen=True)
class _Recorded:
    """A site's call: its module (unbound copy), variables, arguments by name and output."""

    module: nn.Module
    variables: dict[str, Any]
    named: dict[str, Any]
    output: Any


def _unchanged(path: str, module: nn.Module, named: dict[str, Any], output: Any) -> Any:
    """An `OnCall` that changes nothing (a forward that only records the sites' calls)."""
    return output


def _gradients(
    forward: Callable[..., Any],
    measure: Callable[[Any], Any],
    target: dict[str, Any],
    paths: tuple[str, ...],
    owner: str,
) -> tuple[jax.Array, dict[str, _Recorded], dict[str, Any]]:
    """`(measure, the sites' calls, d measure / d output at each site)` from one forward and
    one backward of `target`.

    A zero is added to each site's output and differentiated; the calls leave the
    differentiated function as its auxiliary output (their arrays; Python arguments such
    as `deterministic=True` stay on this side). The zeros' shapes come from an abstract
    trace (no FLOPs).
    """
    shapes = jax.eval_shape(
        lambda: {p: c.output for p, c in forward(target, _unchanged)[1].items()}
    )
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    statics: dict[str, tuple[nn.Module, Any, list[Any]]] = {}

    def value(deltas: dict[str, Any]) -> Any:
        def add(path: str, module: nn.Module, named: dict[str, Any], output: Any) -> Any:
            return jax.tree.map(jnp.add, output, deltas[path])

        outcome, calls = forward(target, add)
        arrays: dict[str, Any] = {}
        for path, call in calls.items():
            leaves, treedef = jax.tree_util.tree_flatten(call.named)
            statics[path] = (call.module, treedef, [None if _is_array(x) else x for x in leaves])
            arrays[path] = (call.variables, [x for x in leaves if _is_array(x)], call.output)
        measured = measure(outcome)
        leaves = jax.tree.leaves(measured)
        if len(leaves) != 1 or jnp.ndim(leaves[0]) != 0:
            raise InterventionError(
                f"{owner}.measure() returned {jax.tree.map(jnp.shape, measured)}; with "
                "ESTIMATE = 'linear' (attribution patching) it must return one scalar, "
                "e.g. outcome.loss or a logit difference"
            )
        return leaves[0], arrays

    (baseline, arrays), grads = jax.value_and_grad(value, has_aux=True)(zeros)
    recorded = {}
    for path in paths:
        module, treedef, kept = statics[path]
        variables, given, output = arrays[path]
        values = iter(given)
        named = jax.tree_util.tree_unflatten(
            treedef, [next(values) if x is None else x for x in kept]
        )
        recorded[path] = _Recorded(module, variables, named, output)
    return baseline, recorded, grads


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array)


def _check_variants(counts: dict[str, Any], owner: str) -> int | None:
    """The one variant count every site shares (None: the analysis declares none)."""
    values = set(counts.values())
    if values == {None}:
        return None
    bad = {p: n for p, n in counts.items() if not (isinstance(n, int) and n >= 1)}
    if bad or len(values) != 1:
        shown = ", ".join(f"{p!r}: {n!r}" for p, n in counts.items())
        raise InterventionError(
            f"{owner}.variants(layer) must return the same positive int at every selected "
            f"path (how many interventions to sweep at each); got {shown}"
        )
    return int(next(iter(values)))
