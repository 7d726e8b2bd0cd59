"""Reading recordings back: one file or a whole folder, in the recorded key order."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import InspectorOptionError, RecordingNotFoundError
from ._paths import PATH_SEP

__all__ = ["read_from_safetensors", "read_metadata", "recording_files", "unflatten_dict"]

_FRAMEWORKS = {
    "numpy": "numpy",
    "np": "numpy",
    "jax": "flax",
    "flax": "flax",
    "torch": "pt",
    "pt": "pt",
}


def _natural(path: Path) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def recording_files(path: str | Path) -> list[Path]:
    """The safetensors files of a recording, in file order.

    Args:
        path: one ``.safetensors`` file, or a folder written by ``tail``.

    Returns:
        ``[path]`` for a file; the folder's ``*.safetensors`` files in natural order
        (``activations-002`` before ``activations-010``) for a folder.

    Raises:
        RecordingNotFoundError: nothing exists at ``path``, or the folder holds no file.
    """
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise RecordingNotFoundError(
            f"no recording at {str(path)!r}: expected a .safetensors file or a folder written "
            "by tail(); check the path (tail writes a folder, default .clouseau/)."
        )
    files = sorted((p for p in path.glob("*.safetensors") if p.is_file()), key=_natural)
    if not files:
        raise RecordingNotFoundError(
            f"the folder {str(path)!r} holds no .safetensors file; record into it with tail() first."
        )
    return files


def read_metadata(filename: str | Path) -> dict[str, str]:
    """The metadata of one safetensors file (``{"0": first_key, ...}`` for recordings)."""
    from safetensors import safe_open

    with safe_open(str(filename), framework="numpy") as handle:
        return dict(handle.metadata() or {})


def _ordered_keys(metadata: dict[str, str], present: list[str]) -> list[str]:
    order = sorted(((int(k), v) for k, v in metadata.items() if k.isdigit()), key=lambda kv: kv[0])
    keys = [key for _, key in order if key in present]
    return keys + sorted(set(present) - set(keys))


def _concatenate(parts: list[Any], framework: str) -> Any:
    if len(parts) == 1:
        return parts[0]
    if framework == "pt":
        import torch

        return torch.cat([torch.atleast_1d(p) for p in parts])
    if framework == "flax":
        import jax.numpy as jnp

        return jnp.concatenate([jnp.atleast_1d(p) for p in parts])
    return np.concatenate([np.atleast_1d(p) for p in parts])


def read_from_safetensors(
    filename: str | Path,
    framework: str = "numpy",
    device: Any = None,
    key_pattern: str = ".*",
) -> dict[str, Any]:
    """Read a recording back, keys in the order of their first call.

    Args:
        filename: one file, or the folder ``tail`` wrote; the files of a folder are
            merged, and a key present in several files (a recording that rolled
            over ``max_size_mb``) is concatenated along axis 0 in file order.
        framework: ``"numpy"``, ``"jax"`` or ``"torch"`` (the array type returned).
        device: where to place the arrays (a PyTorch device string or a JAX device);
            ``None`` keeps the default.
        key_pattern: a regular expression; only keys where it matches
            (``re.search``) are read.

    Returns:
        ``{key: array}`` in recorded order.

    Raises:
        InspectorOptionError: unknown framework or invalid key_pattern.
        RecordingNotFoundError: nothing to read at ``filename``.
    """
    from safetensors import safe_open

    if framework not in _FRAMEWORKS:
        raise InspectorOptionError(
            f"framework must be one of {sorted(_FRAMEWORKS)}, got {framework!r}."
        )
    try:
        matcher = re.compile(key_pattern)
    except re.error as error:
        raise InspectorOptionError(
            f"key_pattern {key_pattern!r} is not a valid regular expression ({error}); "
            "escape literal dots and brackets, e.g. 'blocks\\.0\\.'."
        ) from None
    backend = _FRAMEWORKS[framework]
    torch_device = device if backend == "pt" and device is not None else "cpu"
    parts: dict[str, list[Any]] = {}
    for file in recording_files(filename):
        with safe_open(str(file), framework=backend, device=torch_device) as handle:
            keys = _ordered_keys(dict(handle.metadata() or {}), list(handle.keys()))
            for key in keys:
                if matcher.search(key):
                    parts.setdefault(key, []).append(handle.get_tensor(key))
    data = {key: _concatenate(values, backend) for key, values in parts.items()}
    if backend == "flax" and device is not None:
        import jax

        data = {key: jax.device_put(value, device) for key, value in data.items()}
    return data


def unflatten_dict(flat: dict[str, Any], sep: str = PATH_SEP) -> dict[str, Any]:
    """Nest dotted keys: ``{"a.b": x}`` becomes ``{"a": {"b": x}}``.

    A key that is both an array and the parent of others (an output and the
    inputs of the same call) keeps its array under ``"(value)"``.

    Args:
        flat: dotted key to value.
        sep: the separator.

    Returns:
        The nested dictionary.
    """
    result: dict[str, Any] = {}
    for key, value in flat.items():
        node = result
        *parents, last = key.split(sep)
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                child = node[part] = {"(value)": child}
            node = child
        if isinstance(node.get(last), dict):
            node[last]["(value)"] = value
        else:
            node[last] = value
    return result


def magnify(
    filename: str | Path = Path(".clouseau") / "activations-000.safetensors",
    framework: str = "numpy",
    device: Any = None,
) -> None:
    """Visualize a recording as a tree of arrays with treescope.

    In a notebook the tree is displayed interactively; in a terminal its text
    rendering is printed.

    Args:
        filename: a recording file or folder.
        framework: array type to load, as for :func:`read_from_safetensors`.
        device: where to load the arrays.
    """
    import treescope

    tree = unflatten_dict(read_from_safetensors(filename, framework=framework, device=device))
    with treescope.active_autovisualizer.set_scoped(treescope.ArrayAutovisualizer()):
        ipython = sys.modules.get("IPython")
        if ipython is not None and ipython.get_ipython() is not None:
            treescope.display(tree)
        else:
            print(treescope.render_to_text(tree))
