"""The compiled analysis: `trace` + capture of the selected calls + `analyze`, under one jit.

`Selection` is what `select()` returned, checked against the discovered paths before
anything compiles. `compile_program` is the one jit wrapper of every compiled analysis
(trace counting, the results' check, replication), and `compile_analysis` builds
`fn(state, batch, key) -> results` with it:
it runs the trainer's pure `trace` until the first call at every selected path,
hands the bound modules and their arguments to `analyze`, and returns its pytree,
replicated on every device so that each host reads the global arrays. The caller
caches the jitted function; state, batch and key are its only arguments, so a new
state or batch of the same shapes runs without compiling again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from theseus.analysis._errors import AnalysisError, AnalysisSelectionError
from theseus.model import debug as _debug
from theseus.training import keys
from theseus.training.sharding import ParameterShardingContext

__all__ = ["Selection", "compile_analysis", "compile_program", "to_host"]


@dataclass(frozen=True)
class Selection:
    """The module paths an analysis inspects, and whether `analyze` gets lists.

    Attributes:
        paths: the selected paths, in selection order.
        many: `select()` returned a list (even of one path): `analyze` gets lists.
    """

    paths: tuple[str, ...]
    many: bool

    @classmethod
    def check(cls, chosen: Any, discovered: Sequence[str], owner: str) -> Selection:
        """Validate what `owner.select(paths)` returned.

        Raises:
            AnalysisSelectionError: an empty list, a non-string, or an undiscovered path.
        """
        what = f"{owner}.select()"
        shown = ", ".join(repr(p) for p in discovered) or "none"
        if isinstance(chosen, str):
            paths, many = [chosen], False
        elif isinstance(chosen, list | tuple):
            if not chosen:
                raise AnalysisSelectionError(
                    f"{what} returned an empty list; return one path or a nonempty list of "
                    f"paths. Discovered paths: {shown}."
                )
            paths, many = list(chosen), True
        else:
            raise AnalysisSelectionError(
                f"{what} returned {chosen!r} ({type(chosen).__name__}); return a path string "
                f"or a nonempty list of them. Discovered paths: {shown}."
            )
        try:
            _debug.check_paths(paths, discovered, what)
        except _debug.UnknownPathError as exc:
            raise AnalysisSelectionError(str(exc)) from None
        return cls(tuple(paths), many)


def _check_leaves(leaves: list[tuple[Any, Any]], owner: str) -> None:
    for path, leaf in leaves:
        if not isinstance(leaf, jax.Array | np.ndarray | np.generic | int | float | bool):
            where = f" at {jax.tree_util.keystr(path)}" if path else ""
            raise AnalysisError(
                f"{owner}.analyze() returned {type(leaf).__name__}{where}; it must return "
                "a pytree of arrays, numbers or None (render text and figures in plot())"
            )


def compile_program(
    body: Callable[[Any, dict[str, Any], jax.Array | None], Any],
    sharding: ParameterShardingContext,
    owner: str,
    on_trace: Callable[[], None] | None = None,
) -> Any:
    """`jax.jit` of `fn(state, batch, key) -> body(state, batch, key)`, results replicated.

    The one wrapper of every compiled analysis (`compile_analysis`,
    `_intervene.compile_intervention`): it counts traces, checks that the results are
    a pytree of arrays and numbers, and replicates them on every device so that each
    host reads the global arrays.

    Args:
        body: the program; `key` may be None (deterministic: no dropout).
        sharding: the trainer's mesh and rules.
        owner: the analysis class name, for messages.
        on_trace: called each time the function is traced (to count compilations).

    Returns:
        The jitted function.
    """

    def run(state: Any, batch: dict[str, Any], key: jax.Array | None) -> Any:
        if on_trace is not None:
            on_trace()
        leaves, treedef = jax.tree_util.tree_flatten_with_path(body(state, batch, key))
        _check_leaves(leaves, owner)
        return jax.tree_util.tree_unflatten(treedef, [leaf for _, leaf in leaves])

    return jax.jit(run, out_shardings=sharding.replicated())


def compile_analysis(
    trace: Callable[..., Any],
    analyze: Callable[[Any, Any], Any],
    selection: Selection,
    sharding: ParameterShardingContext,
    owner: str,
    on_trace: Callable[[], None] | None = None,
) -> Any:
    """`compile_program` of `trace` cut at the selected calls, then `analyze(layers, inputs)`.

    Args:
        trace: the trainer's `trace` classmethod.
        analyze: the analysis's bound `analyze` method.
        selection: the checked selection.
        sharding: the trainer's mesh and rules.
        owner: the analysis class name, for messages.
        on_trace: called each time the function is traced (to count compilations).

    Returns:
        The jitted function. `key` may be None (deterministic: no dropout).
    """

    def body(state: Any, batch: dict[str, Any], key: jax.Array | None) -> Any:
        captured = _debug.capture(
            lambda: trace(state, batch, key, sharding=sharding),
            selection.paths,
            keys.layer_rngs(key),
        )
        layers = [
            _debug.DebugLayer(m, p) for (m, _), p in zip(captured, selection.paths, strict=True)
        ]
        inputs = [i for _, i in captured]
        try:
            chosen = (layers, inputs) if selection.many else (layers[0], inputs[0])
            results = analyze(*chosen)
            # Flattened before the inputs close: a result may hold the DebugInputs
            # itself (or a part of it), which reads its values only while open.
            leaves, treedef = jax.tree_util.tree_flatten(results)
        finally:  # the bound scopes and their tracers must not outlive analyze()
            for layer, given in zip(layers, inputs, strict=True):
                layer.close()
                given.close()
        return jax.tree_util.tree_unflatten(treedef, leaves)

    return compile_program(body, sharding, owner, on_trace)


def to_host(results: Any) -> Any:
    """The results as NumPy arrays on this host, with their global shapes."""
    return jax.tree.map(np.asarray, results)
