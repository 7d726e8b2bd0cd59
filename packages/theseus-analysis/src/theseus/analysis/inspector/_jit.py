"""``jit``: ``jax.jit`` for functions that call recorded models, with no host callback.

Under a plain ``jax.jit`` a recorded model sends its values to the host by callback,
and a program that holds a callback loses JAX's fast dispatch path. When the jitted
function goes through :func:`jit` instead, the values recorded in its own trace
become extra outputs of the compiled program; after each call they are handed to
the recordings that hold their slots, exactly as the callback would have (the same
keys, order and arrays). Values recorded inside a transformation opened within the
function (``vmap``, ``scan``) still travel by callback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ._emit import _deliver, collect_outputs
from ._errors import InspectorOptionError

__all__ = ["jit"]


@functools.lru_cache(maxsize=256)
def _routes(names: tuple[str, ...]) -> dict[int, tuple[list[int], list[str], list[int]]]:
    """Per slot: positions, keys and sites of the output names ``"site|slot|key"``."""
    routes: dict[int, tuple[list[int], list[str], list[int]]] = {}
    for position, name in enumerate(names):
        site, slot, key = name.split("|", 2)
        positions, keys, sites = routes.setdefault(int(slot), ([], [], []))
        positions.append(position)
        keys.append(key)
        sites.append(int(site))
    return routes


def jit(fun: Callable[..., Any], **jit_kwargs: Any) -> Callable[..., Any]:
    """Compile ``fun`` like ``jax.jit``; what recorded models in it see leaves as outputs.

    Args:
        fun: a function that calls models yielded by :func:`tail` (passed as
            arguments, like the model to ``jax.jit``).
        **jit_kwargs: passed to ``jax.jit`` (``static_argnums``, ``donate_argnums``,
            ``in_shardings``, ...), except ``out_shardings``.

    Returns:
        A function with ``fun``'s signature and result. Each call delivers the
        recorded values to the recordings open at that moment.

    Raises:
        InspectorOptionError: ``out_shardings`` was given (the program has extra outputs).

    Example:
        >>> import jax.numpy as jnp, tempfile
        >>> from flax import nnx
        >>> from theseus.analysis.inspector import jit, read_from_safetensors, tail
        >>> model = nnx.Sequential(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), nnx.Linear(3, 1, rngs=nnx.Rngs(1)))
        >>> forward = jit(lambda m, x: m(x))
        >>> folder = tempfile.mkdtemp()
        >>> with tail(model, folder) as fm:
        ...     _ = forward(fm, jnp.ones((4, 2)))
        >>> {k: v.shape for k, v in read_from_safetensors(folder).items()}
        {'layers.0.__call__': (4, 3), 'layers.1.__call__': (4, 1)}
    """
    import jax

    if "out_shardings" in jit_kwargs:
        raise InspectorOptionError(
            "inspector.jit adds the recorded values to the program's outputs, so it takes "
            "no out_shardings; constrain the result inside fun "
            "(jax.lax.with_sharding_constraint) or use jax.jit with the recorded model."
        )

    @functools.wraps(fun)  # jax.jit reads fun's signature (static_argnames)
    def traced(*args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        with collect_outputs() as outbox:
            out = fun(*args, **kwargs)
        records = {f"{site:012d}|{slot}|{key}": value for slot, key, value, site in outbox.items}
        return out, records

    compiled = jax.jit(traced, **jit_kwargs)

    @functools.wraps(fun)
    def call(*args: Any, **kwargs: Any) -> Any:
        out, records = compiled(*args, **kwargs)
        if records:
            names = tuple(records)  # sorted by site: the order of the calls in the trace
            values = list(records.values())
            for slot, (positions, keys, sites) in _routes(names).items():
                _deliver(slot, keys, sites, [np.asarray(values[p]) for p in positions])
        return out

    return call
