"""Weights streamed from a checked folder straight into a trainer's parameter layout.

Tensors are mapped one at a time from their shard (in file order, each its own pages:
see `_safetensors`), made into the parameter (transposed, concatenated or regrouped)
and copied once, converted to the parameter's dtype, into a new 64-byte-aligned host
array (a transposed view is copied tile by tile, which keeps both sides in cache). The
array is placed with the sharding the trainer's state layout gives it: on one device
with `jax.device_put` (a CPU device takes an aligned array as its buffer, no second
copy), on several with `jax.make_array_from_callback` (each device gets only its slice;
on several hosts each host places its own). A parameter's mapping and host copy are
dropped before the next, so host memory beyond the model's own arrays stays near one
parameter's size (on a CPU the "device" arrays are host memory too).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from theseus.model.hf._config import HFFolderError
from theseus.model.hf._folder import HFFolder
from theseus.model.hf._safetensors import map_tensor

__all__ = ["load_params", "load_state"]


def _key(path: tuple[Any, ...]) -> str:
    return "/".join(str(getattr(part, "key", part)) for part in path)


def _slicer(host: np.ndarray) -> Callable[[Any], np.ndarray]:
    """`index -> host[index]`: each device's slice of one parameter."""

    def part(index: Any) -> np.ndarray:
        return host[index]

    return part


_ALIGN = 64  # bytes: what XLA's CPU client needs to use a host buffer as its own
_TILE = 64  # rows and columns of one tile of a transposing copy


def _aligned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialized C-ordered array whose data starts on an `_ALIGN` boundary."""
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(size + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start : start + size].view(dtype).reshape(shape)


def _host(made: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`made` (any strides, any float dtype) copied into a new aligned array of `dtype`."""
    out = _aligned(made.shape, np.dtype(dtype))
    if made.ndim != 2 or made.flags.c_contiguous:
        np.copyto(out, made, casting="unsafe")
        return out
    rows, cols = made.shape  # a transposed view: tile by tile, both sides stay in cache
    for i in range(0, rows, _TILE):
        for j in range(0, cols, _TILE):
            out[i : i + _TILE, j : j + _TILE] = made[i : i + _TILE, j : j + _TILE]
    return out


def _place(host: np.ndarray, sharding: Any) -> jax.Array:
    """`host` as an array laid out by `sharding` (None: the default device)."""
    if sharding is None or len(sharding.device_set) == 1:
        return jax.device_put(host, sharding)
    return jax.make_array_from_callback(host.shape, sharding, _slicer(host))


def load_params(folder: HFFolder, abstract: Any) -> Any:
    """The folder's weights as the parameter tree `abstract` describes, placed.

    Args:
        folder: a folder `read_hf` checked.
        abstract: the parameters as `jax.ShapeDtypeStruct`s with shardings (a
            `StateLayout`'s `abstract.params`); a leaf without a sharding goes to the
            default device.

    Raises:
        HFFolderError: the model's tree and the folder's differ (the first parameter
            missing, extra or of another shape is named): the configuration does not
            match the weights.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    wanted = {_key(path): leaf for path, leaf in leaves}
    for name in wanted:
        if name not in folder.leaves:
            raise HFFolderError(
                f"the model has parameter {name}, which {folder.path} has no tensor for; "
                "leave the architecture as the import sets it"
            )
    for name in folder.leaves:
        if name not in wanted:
            raise HFFolderError(
                f"{folder.path} has a tensor for parameter {name}, which the model has not; "
                "leave the architecture as the import sets it"
            )

    def first(name: str) -> tuple[str, int]:
        info = folder.tensors[next(iter(folder.leaves[name].sources))]
        return str(info.file), info.start

    placed: dict[str, jax.Array] = {}
    for name in sorted(wanted, key=first):  # shard by shard, each in byte order
        leaf, spec = folder.leaves[name], wanted[name]
        parts = [map_tensor(folder.tensors[source]) for source in leaf.sources]
        host = _host(leaf.make(parts), spec.dtype)
        del parts  # unmaps the tensors' pages
        if host.shape != tuple(spec.shape):
            raise HFFolderError(
                f"parameter {name} comes out {list(host.shape)} from {folder.path}, but the "
                f"model needs {list(spec.shape)}; leave the architecture as the import sets it"
            )
        placed[name] = _place(host, getattr(spec, "sharding", None))
        del host
    return jax.tree_util.tree_unflatten(treedef, [placed[_key(path)] for path, _ in leaves])


def load_state(target: Any, folder: HFFolder) -> Any:
    """A train state at step 0 holding the folder's weights, laid out as `target`, with
    no optimizer state (`training.state.weights_state`).

    An import saves the weights alone: Adam's moments are zeros before any training, and
    writing them would triple the checkpoint (and a suite's every revision); a resume or
    branch of the imported node starts its optimizer fresh.

    Args:
        target: the trainer's `StateLayout`.
        folder: a folder `read_hf` checked.
    """
    from theseus.training.state import weights_state

    return weights_state(target, load_params(folder, target.abstract.params))
