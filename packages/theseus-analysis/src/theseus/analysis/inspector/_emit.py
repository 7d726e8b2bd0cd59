"""Getting values out of a JAX computation: directly, by callback, or as outputs.

A *sink* receives ``(key, value)`` pairs from a call site. :class:`SinkSlot`, what
call sites hold, feeds the recording that holds its slot (a :class:`RecordSink`):
concrete values go straight to its host cache; traced values (under ``jit``,
``grad``, ``vmap``, ``scan``) travel by one host callback per outermost recorded
call, the model's own call for a wrapped root (see ``_callback``), or, in the
trace of a function compiled by ``inspector.jit``, into an :class:`Outbox` that
becomes extra outputs. Whether a traced call sends its values depends only on
the slot, never on whether a recording holds it while tracing, so the compiled
program is a function of the wrapped model's structure alone and can be reused
by every later recording of that slot. :class:`CaptureSink` is the path of
``capture``: values are collected while tracing and returned to the caller.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ._callback import is_tracer, send, trace_state
from ._errors import CaptureTraceError
from ._paths import KeyMap
from ._store import RecordingStore

__all__ = ["CaptureSink", "Outbox", "RecordSink", "SinkSlot", "assemble", "collect_outputs"]

_SLOTS: dict[int, RecordSink] = {}
_SITES = itertools.count()  # call sites, numbered in program order as they are traced or run
_SLOTS_LOCK = threading.Lock()
_LOCAL = threading.local()  # per thread: {slot: [open frames of traced calls]}


def _host(value: Any) -> Any:
    if type(value).__module__.startswith("torch"):
        return value.detach().clone()
    return np.asarray(value)


class _Frame:
    def __init__(self, state: Any) -> None:
        self.state = state
        self.items: list[tuple[str, Any, int]] = []


def _frames(slot: int) -> list[_Frame]:
    if not hasattr(_LOCAL, "frames"):
        _LOCAL.frames = {}
    frames: list[_Frame] = _LOCAL.frames.setdefault(slot, [])
    return frames


def _deliver(slot: int, keys: Sequence[str], sites: Sequence[int], arrays: Sequence[Any]) -> None:
    """Host side: add the arrays to the recording that holds ``slot`` now, if any."""
    sink = _SLOTS.get(slot)
    if sink is not None:
        sink.store.add_calls(keys, arrays, sites)


class Outbox:
    """The values of one trace that leave its program as outputs, not by callback.

    Args:
        state: the trace (``trace_state()``) whose values it takes; values traced
            inside a transformation opened within it (``vmap``, ``scan``) still
            travel by callback.
    """

    def __init__(self, state: Any) -> None:
        self.state = state
        self.items: list[tuple[int, str, Any, int]] = []  # (slot, key, value, site)


def _outboxes() -> list[Outbox]:
    if not hasattr(_LOCAL, "outboxes"):
        _LOCAL.outboxes = []
    outboxes: list[Outbox] = _LOCAL.outboxes
    return outboxes


@contextmanager
def collect_outputs() -> Iterator[Outbox]:
    """Within the block, traced values of the current trace go to the yielded outbox."""
    outbox = Outbox(trace_state())
    _outboxes().append(outbox)
    try:
        yield outbox
    finally:
        _outboxes().pop()


class RecordSink:
    """A recording's claim on a slot, and the host cache its deliveries go to.

    An open sink holds the lowest free *slot* number; call sites and compiled
    callbacks name the slot, not the sink. Two recordings open at once hold two
    slots and never mix; a recording opened after another has closed reuses its
    slot, so the wrapped model has the same static structure and a jitted
    forward compiled for the first recording is reused by the next.

    Args:
        store: the cache of the recording.
    """

    def __init__(self, store: RecordingStore) -> None:
        self.store = store
        with _SLOTS_LOCK:
            self.slot = next(i for i in range(len(_SLOTS) + 1) if i not in _SLOTS)
            _SLOTS[self.slot] = self

    def close(self) -> None:
        """Give the slot back; later deliveries to it are dropped until it is reused."""
        with _SLOTS_LOCK:
            if _SLOTS.get(self.slot) is self:
                del _SLOTS[self.slot]


@dataclass(frozen=True)
class SinkSlot:
    """A recording's slot, as call sites hold it (static, compared by value).

    Traced values are batched per *frame*: the outermost recorded call of a trace
    opens one, the calls nested in it (in the same trace) add their values to it,
    and one callback carries them all when the outer call returns. Calls inside a
    transformation opened within the frame (``vmap``, ``scan``) send their own.
    """

    slot: int

    def emit(self, pairs: list[tuple[str, Any]]) -> None:
        """Record ``pairs`` now (concrete values) or when the program runs (traced ones)."""
        if not pairs:
            return
        site = next(_SITES)
        if not any(is_tracer(value) for _, value in pairs):
            sink = _SLOTS.get(self.slot)
            if sink is not None:
                keys = [key for key, _ in pairs]
                sink.store.add_calls(keys, [_host(value) for _, value in pairs], [site] * len(keys))
            return
        import jax

        items = [(key, jax.lax.stop_gradient(value), site) for key, value in pairs]
        frames = _frames(self.slot)
        if frames and frames[-1].state == trace_state():
            frames[-1].items += items
            return
        self._send(items)

    def _send(self, items: list[tuple[str, Any, int]]) -> None:
        outboxes = _outboxes()
        if outboxes and outboxes[-1].state == trace_state():
            outboxes[-1].items += [(self.slot, key, value, site) for key, value, site in items]
            return
        keys, values, sites = zip(*items, strict=True)
        send(partial(_deliver, self.slot, keys, sites), list(values))

    def open_call(self) -> bool:
        """Open a frame unless one is open in the current trace; return whether it did."""
        frames, state = _frames(self.slot), trace_state()
        if frames and frames[-1].state == state:
            return False
        frames.append(_Frame(state))
        return True

    def close_call(self, opened: bool, failed: bool = False) -> None:
        """Close the frame ``open_call`` opened, sending its values in one callback."""
        if not opened:
            return
        frame = _frames(self.slot).pop()
        if frame.items and not failed:
            self._send(frame.items)


class CaptureSink:
    """Collect a call's values while tracing, to be returned as outputs.

    Args:
        stack: ``"concat"`` or ``"separate"``, as for recordings.
        key_map: ordered ``(pattern, replacement)`` renames of the keys.
    """

    def __init__(self, stack: str, key_map: Sequence[tuple[str, str]] = ()) -> None:
        self.stack = stack
        self.key_map = tuple(key_map)
        self._local = threading.local()

    def _frames(self) -> list[_Frame]:
        if not hasattr(self._local, "frames"):
            self._local.frames = []
        frames: list[_Frame] = self._local.frames
        return frames

    def open(self) -> None:
        """Start collecting for one call of the captured model."""
        self._frames().append(_Frame(trace_state()))

    def close(self) -> dict[str, Any]:
        """Stop collecting and return ``{key: value}`` in order of first call."""
        rename = KeyMap(self.key_map)
        items = [(rename(k), v) for k, v, _ in self._frames().pop().items]
        return assemble(items, self.stack)

    def emit(self, pairs: list[tuple[str, Any]]) -> None:
        """Collect ``pairs``; they must belong to the trace the capture was opened in.

        Raises:
            CaptureTraceError: a value comes from inside ``scan``/``vmap``/``grad``
                opened within the captured call, or the model runs outside it.
        """
        import jax

        frames = self._frames()
        if not frames:
            raise CaptureTraceError(
                "a captured model was called outside its capture call; call the object "
                "capture() returned (or its .apply), not the model inside it."
            )
        frame = frames[-1]
        if any(is_tracer(v) for _, v in pairs) and trace_state() != frame.state:
            raise CaptureTraceError(
                f"{pairs[0][0]} is computed inside a transformation (scan, vmap, grad) "
                "opened within the captured call, so its value cannot be returned from it; "
                "record it with tail() (host callbacks work there) or filter it out."
            )
        frame.items += [(k, jax.lax.stop_gradient(v), 0) for k, v in pairs]

    def open_call(self) -> bool:
        """Captured values need no frame per call."""
        return False

    def close_call(self, opened: bool, failed: bool = False) -> None:
        """Nothing to close."""


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
