"""The forward recorder: record a model's forward pass to safetensors, show it, diff it.

``tail(model, path)`` records every module's output (or inputs) of a JAX pytree
model (registered dataclass, Equinox, Flax NNX), a Flax linen module or a PyTorch
module while it runs, and writes them to ``path/activations-000.safetensors``.
``capture(model)`` returns the same values from inside a jitted program instead;
``jit(fun)`` compiles a function of recorded models so that their values leave the
program as outputs rather than by host callback.
``read_from_safetensors`` and ``magnify`` read a recording back; the command line
(``theseus inspect show|diff`` or ``python -m theseus.analysis.inspector``) prints
statistics of one recording or compares two.
"""

from ._capture import capture, save_recording
from ._compare import KeyComparison, compare_recordings, key_statistics, remap_keys
from ._errors import (
    CaptureTraceError,
    EmptyRecordingWarning,
    InspectorError,
    InspectorOptionError,
    KeyCollisionError,
    RecordingExistsError,
    RecordingNotFoundError,
    RecordingShapeError,
    UnsupportedModelError,
)
from ._jit import jit
from ._paths import ModulePath
from ._read import magnify, read_from_safetensors, recording_files, unflatten_dict
from ._recorder import DEFAULT_PATH, is_jax_model, is_torch_model, tail

__all__ = [
    "DEFAULT_PATH",
    "CaptureTraceError",
    "EmptyRecordingWarning",
    "InspectorError",
    "InspectorOptionError",
    "KeyCollisionError",
    "KeyComparison",
    "ModulePath",
    "RecordingExistsError",
    "RecordingNotFoundError",
    "RecordingShapeError",
    "UnsupportedModelError",
    "capture",
    "compare_recordings",
    "is_jax_model",
    "is_torch_model",
    "jit",
    "key_statistics",
    "magnify",
    "read_from_safetensors",
    "recording_files",
    "remap_keys",
    "save_recording",
    "tail",
    "unflatten_dict",
]
