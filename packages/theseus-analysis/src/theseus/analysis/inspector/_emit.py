"""Getting values out of a JAX computation: directly, by callback, or as outputs.

A *sink* receives ``(key, value)`` pairs from a call site. :class:`RecordSink`
feeds a recording's host cache: concrete values go straight to the host; traced
values (under ``jit``, ``grad``, ``vmap``, ``scan``) travel by ``jax.debug.callback``,
wrapped in a ``custom_vmap`` so that under ``vmap`` the host receives the whole
batch once, batch axis first, instead of one callback per example.
:class:`CaptureSink` is the path for a jitted call that theseus owns: values are
collected while tracing and returned from the compiled program as outputs, with
no callback at all.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import numpy as np

from ._errors import CaptureTraceError
from ._store import RecordingStore

__all__ = ["CaptureSink", "RecordSink", "assemble"]


def _is_tracer(value: Any) -> bool:
    import jax

    return isinstance(value, jax.core.Tracer)


def _host(value: Any) -> Any:
    if type(value).__module__.startswith("torch"):
        return value.detach().clone()
    return np.asarray(value)


class RecordSink:
    """Deliver a call's values to a recording's host cache.

    Args:
        store: the cache of the recording.
    """

    def __init__(self, store: RecordingStore) -> None:
        self.store = store
        self.closed = False

    def emit(self, pairs: list[tuple[str, Any]]) -> None:
        """Record ``pairs`` now (concrete values) or when the program runs (traced ones)."""
        if self.closed or not pairs:
            return
        if not any(_is_tracer(value) for _, value in pairs):
            for key, value in pairs:
                self.store.add(key, _host(value))
            return
        import jax

        keys = tuple(key for key, _ in pairs)
        for key in keys:
            self.store.declare(key)
        values = [jax.lax.stop_gradient(value) for _, value in pairs]
        _send(self, keys, values)

    def deliver(self, keys: tuple[str, ...], *arrays: Any) -> None:
        """Host side of the callback: add the arrays of one call."""
        if self.closed:
            return
        for key, array in zip(keys, arrays, strict=True):
            self.store.add(key, np.asarray(array))


def _send(sink: RecordSink, keys: tuple[str, ...], values: list[Any]) -> None:
    import jax
    import jax.numpy as jnp

    @jax.custom_batching.custom_vmap
    def send(*xs: Any) -> tuple[Any, ...]:
        jax.debug.callback(partial(sink.deliver, keys), *xs)
        return xs

    @send.def_vmap
    def _batched(axis_size: int, in_batched: list[bool], *xs: Any) -> Any:
        xs = tuple(
            x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))
            for x, batched in zip(xs, in_batched, strict=True)
        )
        return send(*xs), (True,) * len(xs)

    send(*values)


class _Frame:
    def __init__(self, state: Any) -> None:
        self.state = state
        self.items: list[tuple[str, Any]] = []


class CaptureSink:
    """Collect a call's values while tracing, to be returned as outputs.

    Args:
        stack: ``"concat"`` or ``"separate"``, as for recordings.
    """

    def __init__(self, stack: str) -> None:
        self.stack = stack
        self._local = threading.local()

    def _frames(self) -> list[_Frame]:
        if not hasattr(self._local, "frames"):
            self._local.frames = []
        frames: list[_Frame] = self._local.frames
        return frames

    def open(self) -> None:
        """Start collecting for one call of the captured model."""
        from jax.extend.core import get_opaque_trace_state

        self._frames().append(_Frame(get_opaque_trace_state(convention="flax")))

    def close(self) -> dict[str, Any]:
        """Stop collecting and return ``{key: value}`` in order of first call."""
        return assemble(self._frames().pop().items, self.stack)

    def emit(self, pairs: list[tuple[str, Any]]) -> None:
        """Collect ``pairs``; they must belong to the trace the capture was opened in.

        Raises:
            CaptureTraceError: a value comes from inside ``scan``/``vmap``/``grad``
                opened within the captured call, or the model runs outside it.
        """
        import jax
        from jax.extend.core import get_opaque_trace_state

        frames = self._frames()
        if not frames:
            raise CaptureTraceError(
                "a captured model was called outside its capture call; call the object "
                "capture() returned (or its .apply), not the model inside it."
            )
        frame = frames[-1]
        if any(_is_tracer(v) for _, v in pairs) and (
            get_opaque_trace_state(convention="flax") != frame.state
        ):
            raise CaptureTraceError(
                f"{pairs[0][0]} is computed inside a transformation (scan, vmap, grad) "
                "opened within the captured call, so its value cannot be returned from it; "
                "record it with tail() (host callbacks work there) or filter it out."
            )
        frame.items += [(k, jax.lax.stop_gradient(v)) for k, v in pairs]


def assemble(items: list[tuple[str, Any]], stack: str) -> dict[str, Any]:
    """Join repeated keys: concatenated along axis 0, or kept apart as ``key#i``.

    Args:
        items: ``(key, array)`` in call order.
        stack: ``"concat"`` or ``"separate"``.

    Returns:
        ``{key: array}`` in order of first call.
    """
    import jax.numpy as jnp

    grouped: dict[str, list[Any]] = {}
    for key, value in items:
        grouped.setdefault(key, []).append(value)
    if stack == "separate":
        return {f"{k}#{i}": v for k, vs in grouped.items() for i, v in enumerate(vs)}
    return {
        k: vs[0] if len(vs) == 1 else jnp.concatenate([jnp.atleast_1d(v) for v in vs])
        for k, vs in grouped.items()
    }
