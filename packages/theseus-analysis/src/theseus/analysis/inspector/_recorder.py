"""``tail``: record a model's forward pass to safetensors files while it runs."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from ._emit import RecordSink, SinkSlot
from ._errors import EmptyRecordingWarning, UnsupportedModelError
from ._paths import ModulePath
from ._store import RecordingStore
from ._tap import Tap, check_record

__all__ = ["DEFAULT_PATH", "is_jax_model", "is_torch_model", "model_framework", "tail"]

DEFAULT_PATH = Path(".clouseau")
"""The default folder of a recording (relative to the working directory)."""

Filter = Callable[[ModulePath, Any], bool]


def is_torch_model(model: Any) -> bool:
    """Whether ``model`` is a ``torch.nn.Module`` (``False`` when torch is absent)."""
    torch = sys.modules.get("torch")  # a torch module exists only once torch is imported
    return torch is not None and isinstance(model, torch.nn.Module)


def is_jax_model(model: Any) -> bool:
    """Whether ``model`` is a JAX pytree model: a container holding at least one ``jax.Array``.

    A bare leaf (an int, a string, a single array) flattens to itself and is not a
    model.
    """
    try:
        import jax
    except ImportError:
        return False
    leaves = jax.tree.leaves(model)
    if len(leaves) == 1 and leaves[0] is model:
        return False
    return any(isinstance(leaf, jax.Array) for leaf in leaves)


def model_framework(model: Any) -> str:
    """``"torch"``, ``"linen"`` or ``"jax"``.

    Raises:
        UnsupportedModelError: none of them.
    """
    if is_torch_model(model):
        return "torch"
    if "flax.linen" in sys.modules:
        from ._linen import is_linen_module

        if is_linen_module(model):
            return "linen"
    if is_jax_model(model):
        return "jax"
    raise UnsupportedModelError(
        f"cannot record a {type(model).__name__}: expected a JAX pytree model holding "
        "jax.Array leaves (a registered dataclass, an Equinox or Flax NNX module), a Flax "
        "linen module or a torch.nn.Module. Pass the model itself, not its output or a "
        "bare array."
    )


class _Recorder:
    """A recording in progress; use it as a context manager (see :func:`tail`)."""

    def __init__(
        self,
        model: Any,
        path: str | Path,
        filter_: Filter | None,
        is_leaf: Filter | None,
        filename_pattern: str,
        max_size_mb: float,
        record: str,
        stack: str,
        exist: str,
        transform: Callable[[str, Any], Any] | None,
        key_map: Sequence[tuple[str, str]] = (),
    ) -> None:
        check_record(record)
        self.model = model
        self.framework = model_framework(model)
        self.path = Path(path)
        self.filter_ = filter_
        self.is_leaf = is_leaf
        self._options = (filename_pattern, max_size_mb, stack, exist)
        self.key_map = tuple(key_map)
        self.record = record
        self.transform = transform
        self.files: list[Path] = []
        self.available: list[str] = []
        self._handles: list[Any] = []
        self._linen: Any = None

    def __enter__(self) -> Any:
        pattern, max_size_mb, stack, exist = self._options
        self.store = RecordingStore(self.path, pattern, max_size_mb, stack, exist, self.key_map)
        self.sink = RecordSink(self.store)
        tap = Tap(SinkSlot(self.sink.slot), self.record, self.transform)
        try:
            return self._instrument(tap)
        except BaseException:
            self.sink.close()
            raise

    def _instrument(self, tap: Tap) -> Any:
        if self.framework == "torch":
            from ._torch import hook_model

            self._handles, self.available = hook_model(self.model, tap, self.filter_, self.is_leaf)
            return self.model
        if self.framework == "linen":
            from ._linen import LinenTail

            self._linen = LinenTail(self.model, tap, self.filter_, self.is_leaf)
            return self._linen
        from ._pytree import wrap_model

        wrapped, self.available = wrap_model(self.model, tap, self.filter_, self.is_leaf)
        return wrapped

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if "jax" in sys.modules:
            import jax

            jax.effects_barrier()
        self.sink.close()
        for handle in self._handles:
            handle.remove()
        if self._linen is not None:
            self.available = self._linen.seen
        if exc_type is not None:
            with contextlib.suppress(Exception):  # the error inside the block matters more
                self.files = self.store.close()
            return
        self.files = self.store.close()
        if not self.files:
            warnings.warn(
                EmptyRecordingWarning(
                    f"nothing was recorded into {str(self.path)!r}: no recorded module ran, "
                    f"or filter_ kept none. The paths available were: "
                    f"{', '.join(self.available) or '(none: is the model callable?)'}. "
                    "Check filter_/is_leaf against these names, and call the object "
                    "tail() yields (fm(x) or fm.apply(...)), not the original model."
                ),
                stacklevel=2,
            )


def tail(
    model: Any,
    path: str | Path = DEFAULT_PATH,
    filter_: Filter | None = None,
    is_leaf: Filter | None = None,
    filename_pattern: str = "activations-{idx:03d}.safetensors",
    max_size_mb: float = 1024,
    *,
    record: str = "outputs",
    stack: str = "concat",
    exist: str = "overwrite",
    transform: Callable[[str, Any], Any] | None = None,
    key_map: Sequence[tuple[str, str]] = (),
) -> _Recorder:
    r"""Tail and record the forward pass of a model.

    ``with tail(model, path) as fm:`` yields a callable that behaves like the
    model and records while it runs; on exit the cache is written to
    ``path/activations-000.safetensors`` (then ``-001``, ... past ``max_size_mb``).

    Args:
        model: a JAX pytree model (registered dataclass, Equinox or NNX module),
            a Flax linen module (call ``fm.apply(variables, ...)``) or a
            ``torch.nn.Module``.
        path: the folder of the recording (created if needed).
        filter_: ``filter_(path, node) -> bool``, which modules to record; ``path``
            is a :class:`ModulePath`, a dotted string that also indexes like the
            tuple of key objects. Default: every callable node (JAX), every
            submodule (linen, torch).
        is_leaf: ``is_leaf(path, node) -> bool``; ``True`` stops the descent there
            (the node and what is below it are not recorded).
        filename_pattern: file names, with one ``{idx}`` field.
        max_size_mb: cached megabytes that trigger writing the next file.
        record: ``"outputs"``, ``"inputs"`` (stored by argument name, as
            ``key.x``) or ``"both"``.
        stack: repeated calls of one module are ``"concat"``-enated along axis 0,
            or kept ``"separate"`` as ``key#0``, ``key#1``, ...
        exist: files of an earlier recording in ``path`` are replaced and the
            ones not rewritten removed (``"overwrite"``), or ``"error"`` refuses.
        transform: ``transform(key, array) -> array`` applied on the device before
            a value is recorded (e.g. ``lambda k, x: x[:, :8]`` to crop).
        key_map: ``(pattern, replacement)`` renames of the keys, applied in order
            (each ``re.sub`` on the previous result) before they are stored; e.g.
            ``[(r"^blocks\.", "h.")]`` records a port under its original's names.

    Returns:
        The recorder, a context manager; after the block its ``files`` lists the
        files written.

    Raises:
        UnsupportedModelError: the model is of no supported kind.
        InspectorOptionError: an invalid option.
        RecordingExistsError: ``path`` is a file, or holds a recording with
            ``exist="error"``.
        KeyCollisionError: (on exit) ``key_map`` sent two keys to one name.

    Example:
        >>> import jax, jax.numpy as jnp, tempfile
        >>> from flax import nnx
        >>> from theseus.analysis.inspector import read_from_safetensors, tail
        >>> model = nnx.Sequential(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), nnx.Linear(3, 1, rngs=nnx.Rngs(1)))
        >>> folder = tempfile.mkdtemp()
        >>> with tail(model, folder) as fm:
        ...     _ = fm(jnp.ones((4, 2)))
        >>> {k: v.shape for k, v in read_from_safetensors(folder).items()}
        {'layers.0.__call__': (4, 3), 'layers.1.__call__': (4, 1)}
    """
    return _Recorder(
        model,
        path,
        filter_,
        is_leaf,
        filename_pattern,
        max_size_mb,
        record,
        stack,
        exist,
        transform,
        key_map,
    )
