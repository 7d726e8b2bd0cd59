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
baseline (and the source). Calls are seen through `theseus.model.hooks` (by
`_forward.forward`); the first `__call__` at each selected path is the site (as the
debugger captures it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.analysis._engine import Selection, compile_program
from theseus.analysis._forward import OnCall, Recorded, is_array, unchanged
from theseus.analysis._forward import forward as traced_forward
from theseus.analysis._sites import Call, Effect, Hooks, InterventionError, Outcome, Site
from theseus.model import debug as _debug
from theseus.training import keys
from theseus.training.sharding import ParameterShardingContext

__all__ = ["compile_intervention"]


def compile_intervention(
    trace: Callable[..., Any],
    hooks: Hooks,
    selection: Selection,
    sharding: ParameterShardingContext,
    owner: str,
    on_trace: Callable[[], None] | None = None,
) -> Any:
    """`compile_program` of `fn(state, batch, key) -> analyze(Effect(...))`.

    Args:
        trace: the trainer's `trace` classmethod.
        hooks: the analysis's `intervene`, `measure`, `analyze`, `variants`, `corrupt`.
        selection: the checked selection (the sites, in order).
        sharding: the trainer's mesh and rules.
        owner: the analysis class name, for messages.
        on_trace: called each time the function is traced (to count compilations).

    Returns:
        The jitted function (the same wrapper as `compile_analysis`'s).
    """
    paths = selection.paths

    def body(state: Any, batch: dict[str, Any], key: jax.Array | None) -> Any:
        rngs = keys.layer_rngs(key)

        def forward(rows: dict[str, Any], on_call: OnCall) -> tuple[Outcome, dict[str, Recorded]]:
            output, calls = traced_forward(
                lambda: trace(state, rows, key, sharding=sharding), paths, on_call, owner
            )
            return Outcome.of(output, rows), calls

        def measure(outcome: Outcome) -> Any:
            return hooks.measure(outcome)

        sources: dict[str, Call] = {}
        source = None
        if hooks.corrupt is not None:
            outcome, calls = forward(batch, unchanged)
            source = measure(outcome)
            sources = {p: Call(_debug.DebugInputs(c.arguments), c.output) for p, c in calls.items()}
            target = hooks.corrupt(batch)
        else:
            target = batch

        def replacement(call: Recorded, path: str, k: Any) -> Any:
            layer = _debug.DebugLayer(call.module.bind(call.variables, rngs=rngs), path)
            given = _debug.DebugInputs(call.arguments)
            site = Site(path, paths.index(path), layer, given, call.output, k, sources.get(path))
            try:
                new = hooks.intervene(site)
            finally:
                layer.close()
                given.close()
            return _check_replacement(new, call.output, path, owner)

        def count(recorded: dict[str, Recorded]) -> int | None:
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

                def estimate(k: jax.Array, call: Recorded = call, path: str = path) -> Any:
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
            outcome, recorded = forward(target, unchanged)
            baseline = measure(outcome)
            variants = count(recorded)
            width = variants or 1

            def one(i: jax.Array) -> Any:
                site, k = i // width, i % width

                def at(path: str, module: nn.Module, named: dict[str, Any], output: Any) -> Any:
                    call = Recorded(
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
        return hooks.analyze(Effect(baseline, intervened, source))

    return compile_program(body, sharding, owner, on_trace)


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


def _gradients(
    forward: Callable[..., Any],
    measure: Callable[[Any], Any],
    target: dict[str, Any],
    paths: tuple[str, ...],
    owner: str,
) -> tuple[jax.Array, dict[str, Recorded], dict[str, Any]]:
    """`(measure, the sites' calls, d measure / d output at each site)` from one forward and
    one backward of `target`.

    A zero is added to each site's output and differentiated; the calls leave the
    differentiated function as its auxiliary output (their arrays; Python arguments such
    as `deterministic=True` stay on this side). The zeros' shapes come from an abstract
    trace (no FLOPs).
    """
    shapes = jax.eval_shape(lambda: {p: c.output for p, c in forward(target, unchanged)[1].items()})
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    statics: dict[str, tuple[nn.Module, Any, list[Any]]] = {}

    def value(deltas: dict[str, Any]) -> Any:
        def add(path: str, module: nn.Module, named: dict[str, Any], output: Any) -> Any:
            return jax.tree.map(jnp.add, output, deltas[path])

        outcome, calls = forward(target, add)
        arrays: dict[str, Any] = {}
        for path, call in calls.items():
            leaves, treedef = jax.tree_util.tree_flatten(call.arguments)
            statics[path] = (call.module, treedef, [None if is_array(x) else x for x in leaves])
            arrays[path] = (call.variables, [x for x in leaves if is_array(x)], call.output)
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
        recorded[path] = Recorded(module, variables, named, output)
    return baseline, recorded, grads


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
