"""Sending traced values to the host: one packed host callback per call.

A callback's operands are each copied into a host buffer of their own before
Python sees them, which costs more than the copy itself; so the values of one
call are raveled and joined into one 1-D buffer per dtype inside the program,
sent together, and cut back into views on the host (no further copy; the bits
are the program's). The callback is wrapped in a ``custom_vmap`` so that under
``vmap`` the host receives the whole batch once, batch axis first, instead of
one callback per example.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from functools import partial
from types import FrameType
from typing import Any

import numpy as np

__all__ = ["is_tracer", "send", "trace_state"]

Layout = tuple[tuple[int, int, tuple[int, ...]], ...]


def is_tracer(value: Any) -> bool:
    """Whether ``value`` is a JAX tracer (a value of a trace, not a concrete array)."""
    import jax

    return isinstance(value, jax.core.Tracer)


def trace_state() -> Any:
    """An opaque token of the current trace (equal within one trace, else different)."""
    try:  # exported here by newer JAX releases
        from jax.extend.core import get_opaque_trace_state
    except ImportError:  # JAX 0.9 exports it from jax.core only
        from jax.core import get_opaque_trace_state
    return get_opaque_trace_state(convention="flax")


def pack(values: Sequence[Any]) -> tuple[list[Any], Layout]:
    """Ravel and join ``values`` into one 1-D buffer per dtype (in order of first use).

    Returns:
        The buffers and, per value, ``(buffer index, offset, shape)``.
    """
    import jax.numpy as jnp

    groups: dict[Any, list[Any]] = {}
    sizes: dict[Any, int] = {}
    layout = []
    for value in values:
        if value.dtype not in groups:
            groups[value.dtype], sizes[value.dtype] = [], 0
        layout.append((list(groups).index(value.dtype), sizes[value.dtype], tuple(value.shape)))
        groups[value.dtype].append(value.reshape(-1))
        sizes[value.dtype] += math.prod(value.shape)
    buffers = [parts[0] if len(parts) == 1 else jnp.concatenate(parts) for parts in groups.values()]
    return buffers, tuple(layout)


def unpack(buffers: Sequence[Any], layout: Layout) -> list[np.ndarray]:
    """Cut the host copies of ``pack``'s buffers back into arrays (views, no copy)."""
    flat = [np.asarray(buffer) for buffer in buffers]
    return [
        flat[index][offset : offset + math.prod(shape)].reshape(shape)
        for index, offset, shape in layout
    ]


def _in_flax_scan_broadcast_pass() -> bool:
    """Whether this trace is ``nn.scan``'s first pass over its body (Flax >= 0.12.12).

    That pass traces the body once to find the variables broadcast to every
    iteration and refuses any equation that uses the scanned inputs; a callback
    (an effect, never removed as dead code) would be one. Nothing of that pass
    ever runs, so the recorder sends nothing from it; the scan itself records.
    """
    if "flax.core.axes_scan" not in sys.modules:
        return False
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "body_fn" and code.co_filename.endswith(("axes_scan.py",)):
            return frame.f_locals.get("init_mode") is True
        frame = frame.f_back
    return False


def send(deliver: Callable[[list[np.ndarray]], None], values: list[Any]) -> None:
    """Stage one host callback that calls ``deliver(arrays)`` when the program runs.

    Args:
        deliver: receives the values as NumPy arrays, in order.
        values: traced (or concrete) arrays of the current trace.
    """
    import jax
    import jax.numpy as jnp

    if _in_flax_scan_broadcast_pass():
        return

    def host(layout: Layout, *buffers: Any) -> None:
        deliver(unpack(buffers, layout))

    @jax.custom_batching.custom_vmap
    def staged(*xs: Any) -> Any:
        buffers, layout = pack(xs)
        jax.debug.callback(partial(host, layout), *buffers)
        return jnp.zeros((), jnp.int32)

    @staged.def_vmap
    def _batched(axis_size: int, in_batched: list[bool], *xs: Any) -> Any:
        xs = tuple(
            x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))
            for x, batched in zip(xs, in_batched, strict=True)
        )
        return staged(*xs), False

    staged(*[jnp.asarray(value) for value in values])
