"""``capture``: return recorded values from the compiled program itself.

When theseus owns the jitted call, there is no need for host callbacks: the
values are collected while tracing and become extra outputs of the program, so
XLA fuses a crop into the forward pass and copies only what was asked. The
captured model returns ``(output, {key: array})``; ``save_recording`` writes that
dictionary in the on-disk format of :func:`tail`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from jax.tree_util import register_dataclass

from ._emit import CaptureSink
from ._errors import UnsupportedModelError
from ._paths import KeyMap, ModulePath
from ._recorder import DEFAULT_PATH, model_framework
from ._store import STACKS, RecordingStore
from ._tap import Tap, check_record

__all__ = ["capture", "save_recording"]


@partial(register_dataclass, data_fields=["model"], meta_fields=["sink"])
@dataclass(frozen=True)
class CapturedModel:
    """A wrapped pytree model whose call returns ``(output, captured)``.

    It is a pytree: pass it to ``jax.jit`` as an argument, like the model.
    """

    model: Any
    sink: CaptureSink

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Run the model; return its output and ``{key: array}`` in call order."""
        self.sink.open()
        try:
            out = self.model(*args, **kwargs)
        finally:
            captured = self.sink.close()
        return out, captured


class CapturedLinen:
    """A linen module whose ``apply`` returns ``(output, captured)``."""

    def __init__(self, tail: Any, sink: CaptureSink) -> None:
        self._tail = tail
        self.sink = sink

    def apply(self, variables: Any, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """``module.apply(variables, ...)`` plus ``{key: array}`` in call order."""
        self.sink.open()
        try:
            out = self._tail.apply(variables, *args, **kwargs)
        finally:
            captured = self.sink.close()
        return out, captured


def capture(
    model: Any,
    filter_: Callable[[ModulePath, Any], bool] | None = None,
    is_leaf: Callable[[ModulePath, Any], bool] | None = None,
    *,
    record: str = "outputs",
    stack: str = "concat",
    transform: Callable[[str, Any], Any] | None = None,
    key_map: Sequence[tuple[str, str]] = (),
) -> Any:
    """Make a model return the recorded values as outputs, for use inside ``jax.jit``.

    Args:
        model: a JAX pytree model or a Flax linen module.
        filter_: which modules to record, as for :func:`tail`.
        is_leaf: where to stop descending, as for :func:`tail`.
        record: ``"outputs"``, ``"inputs"`` or ``"both"``.
        stack: ``"concat"`` or ``"separate"`` for repeated calls.
        transform: ``transform(key, array) -> array`` applied inside the program
            (a crop costs nothing but the copy of what it keeps).
        key_map: ordered ``(pattern, replacement)`` renames of the keys.

    Returns:
        For a pytree model, a pytree callable as ``captured(*args) -> (out, dict)``;
        for a linen module, an object with ``apply(variables, *args) -> (out, dict)``.

    Raises:
        UnsupportedModelError: a PyTorch model (use :func:`tail`) or another kind.
        InspectorOptionError: an invalid option.
        CaptureTraceError: (when called) a recorded call happens inside ``scan`` or
            ``vmap`` opened within the captured call; record those with ``tail``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from flax import nnx
        >>> from theseus.analysis.inspector import capture
        >>> model = nnx.Sequential(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), nnx.Linear(3, 1, rngs=nnx.Rngs(1)))
        >>> out, got = jax.jit(lambda m, x: m(x))(capture(model), jnp.ones((4, 2)))
        >>> {k: v.shape for k, v in got.items()}
        {'layers.0.__call__': (4, 3), 'layers.1.__call__': (4, 1)}
    """
    check_record(record)
    if stack not in STACKS:
        from ._errors import InspectorOptionError

        raise InspectorOptionError(f"stack must be one of {STACKS}, got {stack!r}.")
    framework = model_framework(model)
    KeyMap(key_map)  # validate the patterns now
    sink = CaptureSink(stack, key_map)
    tap = Tap(sink, record, transform)
    if framework == "torch":
        raise UnsupportedModelError(
            "capture() returns values from a compiled JAX program; a torch.nn.Module has "
            "none. Record PyTorch models with tail()."
        )
    if framework == "linen":
        from ._linen import LinenTail

        return CapturedLinen(LinenTail(model, tap, filter_, is_leaf), sink)
    from ._pytree import wrap_model

    wrapped, _ = wrap_model(model, tap, filter_, is_leaf)
    return CapturedModel(wrapped, sink)


def save_recording(
    captured: Mapping[str, Any],
    path: str | Path = DEFAULT_PATH,
    filename_pattern: str = "activations-{idx:03d}.safetensors",
    max_size_mb: float = 1024,
) -> list[Path]:
    """Write ``{key: array}`` (e.g. what :func:`capture` returned) as a recording.

    The folder gets the same files a :func:`tail` recording would (key order kept,
    roll-over at ``max_size_mb``, files of an earlier recording replaced).

    Args:
        captured: key to array, in order.
        path: the folder.
        filename_pattern: file names, with one ``{idx}`` field.
        max_size_mb: megabytes per file.

    Returns:
        The files written.
    """
    import numpy as np

    store = RecordingStore(Path(path), filename_pattern, max_size_mb)
    for site, (key, value) in enumerate(captured.items()):
        store.add(key, np.asarray(value), site)
    return store.close()
