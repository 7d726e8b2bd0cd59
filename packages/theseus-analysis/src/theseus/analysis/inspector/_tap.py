"""The call site: what one recorded call contributes (inputs by name, output leaves)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

from ._errors import InspectorOptionError
from ._paths import PATH_SEP, leaf_items

__all__ = ["RECORDS", "Tap", "check_record"]

RECORDS = ("outputs", "inputs", "both")


def check_record(record: str) -> None:
    """Raise unless ``record`` is one of :data:`RECORDS`.

    Raises:
        InspectorOptionError: an unknown value.
    """
    if record not in RECORDS:
        raise InspectorOptionError(
            f"record must be one of {RECORDS}, got {record!r}: 'outputs' stores what each "
            "module returns, 'inputs' its arguments by name, 'both' stores the two."
        )


@lru_cache(maxsize=4096)
def _signature(function: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


def _unbind(function: Any) -> tuple[Any, tuple[Any, ...]]:
    if inspect.ismethod(function):
        return function.__func__, (function.__self__,)
    if isinstance(function, partial) and not function.keywords:
        return function.func, function.args
    if inspect.isfunction(function) or inspect.isbuiltin(function):
        return function, ()
    if inspect.isfunction(getattr(function, "__wrapped__", None)):
        return function.__wrapped__, ()
    return type(function).__call__, (function,)


def _named_arguments(signature_of: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    function, prefix = _unbind(signature_of)
    try:
        signature = _signature(function)
    except TypeError:  # an unhashable callable object
        signature = None
    if signature is not None:
        try:
            bound = signature.bind_partial(*prefix, *args, **kwargs)
        except TypeError:
            pass
        else:
            skip = set(list(signature.parameters)[: len(prefix)])
            named: dict[str, Any] = {}
            for name, value in bound.arguments.items():
                if name in skip:
                    continue
                if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                    named.update(value)
                else:
                    named[name] = value
            return named
    return {"args": args, **kwargs}


@dataclass(frozen=True)
class Tap:
    """How a call site reports to its sink (hashable: it is static under ``jit``).

    Args:
        sink: a ``SinkSlot`` (compared by value) or a ``CaptureSink`` (by identity);
            anything with ``emit(pairs)``, ``open_call()`` and ``close_call(opened, failed)``.
        record: ``"outputs"``, ``"inputs"`` or ``"both"``.
        transform: ``transform(key, array) -> array`` applied before the value
            leaves the call (e.g. a crop), or ``None``.
    """

    sink: Any
    record: str = "outputs"
    transform: Callable[[str, Any], Any] | None = None

    def _emit(self, pairs: list[tuple[str, Any]]) -> None:
        if self.transform is not None:
            pairs = [(key, self.transform(key, value)) for key, value in pairs]
        self.sink.emit(pairs)

    def call(
        self,
        key: str,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        signature_of: Any = None,
    ) -> Any:
        """Run ``function(*args, **kwargs)`` and report it under ``key``.

        Args:
            key: ``path.method`` of the call.
            function: what to run.
            args: positional arguments.
            kwargs: keyword arguments.
            signature_of: the callable whose signature names the arguments
                (defaults to ``function``).

        Returns:
            What ``function`` returned, untouched.
        """
        opened = self.sink.open_call()
        failed = True
        try:
            self.report_inputs(key, signature_of or function, args, kwargs)
            out = function(*args, **kwargs)
            self.report_output(key, out)
            failed = False
        finally:
            self.sink.close_call(opened, failed)
        return out

    def report_inputs(
        self, key: str, signature_of: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Report a call's arguments by name as ``key.name`` (unless only outputs are kept)."""
        if self.record == "outputs":
            return
        named = _named_arguments(signature_of, args, kwargs)
        pairs: list[tuple[str, Any]] = []
        for name, value in named.items():
            pairs += leaf_items(value, key + PATH_SEP + name, python_scalars=False)
        self._emit(pairs)

    def report_output(self, key: str, out: Any) -> None:
        """Report a call's output leaves under ``key`` (unless only inputs are kept)."""
        if self.record != "inputs":
            self._emit(leaf_items(out, key, python_scalars=True))
