"""The inspector's exceptions and warnings: each subclasses a built-in type.

Every error raised at the boundary of :mod:`theseus.analysis.inspector` says what
was expected, what arrived and how to fix it. Catch :class:`InspectorError` to
handle all of them at once (it is a `theseus.errors.TheseusError`), or the built-in base (``ValueError``, ``TypeError``,
...) where that reads better.
"""

from __future__ import annotations

from theseus.errors import TheseusError

__all__ = [
    "CaptureTraceError",
    "EmptyRecordingWarning",
    "InspectorError",
    "InspectorOptionError",
    "KeyCollisionError",
    "RecordingExistsError",
    "RecordingNotFoundError",
    "RecordingShapeError",
    "UnsupportedModelError",
]


class InspectorError(TheseusError):
    """Base class of every error raised by the forward recorder."""


class InspectorOptionError(InspectorError, ValueError):
    """An option of ``tail``/``capture``/``read_from_safetensors`` has an invalid value."""


class UnsupportedModelError(InspectorError, TypeError):
    """The model is neither a JAX pytree model, a Flax linen module nor a PyTorch module."""


class RecordingExistsError(InspectorError, FileExistsError):
    """The target folder holds files of an earlier recording and ``exist="error"`` was asked."""


class RecordingNotFoundError(InspectorError, FileNotFoundError):
    """A recording file or folder to read does not exist or holds no recording."""


class KeyCollisionError(InspectorError, ValueError):
    """Two different arrays would be stored under one key."""


class CaptureTraceError(InspectorError, RuntimeError):
    """A captured value belongs to an inner trace (scan, vmap) and cannot leave it."""


class EmptyRecordingWarning(UserWarning):
    """A recording ended without a single array; the message lists the available paths."""


#: The earlier name of InspectorOptionError (repeated calls of one module cannot be concatenated along axis 0), kept for old imports.
RecordingShapeError = InspectorOptionError
