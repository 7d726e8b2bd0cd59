"""safetensors files read one tensor at a time: the header, then each tensor's own bytes.

A safetensors file is an 8-byte little-endian header length, a JSON header naming every
tensor's dtype, shape and byte range, then the raw data. `read_header` checks the
header against the file's size without reading any data; `map_tensor` maps exactly
one tensor's pages read-only (no copy: the values are the page cache's, and the
mapping goes when the last view of it does, so a shard's pages are never all held).
bfloat16 comes back as `ml_dtypes.bfloat16`.
"""

from __future__ import annotations

import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from theseus.errors import TheseusError

__all__ = ["DTYPES", "SafetensorsError", "TensorInfo", "map_tensor", "read_header"]

#: safetensors dtype names a checkpoint's floating-point weights may have.
DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}
_MAX_HEADER = 100 * 1024 * 1024


class SafetensorsError(TheseusError, ValueError):
    """A file that is not a readable safetensors file (the message says what is wrong)."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies: its file, dtype name, shape and absolute byte range."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    stop: int


def read_header(file: Path) -> dict[str, TensorInfo]:
    """Every tensor of `file` (`__metadata__` left out), checked against the file's size.

    Raises:
        SafetensorsError: a truncated file, a header that is not JSON, or a byte range
            outside the data or of the wrong length for its shape and dtype.
    """
    size = file.stat().st_size
    with open(file, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise SafetensorsError("shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > min(_MAX_HEADER, size - 8):
            raise SafetensorsError(f"its header length {length} runs past the file")
        try:
            header = json.loads(handle.read(length).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise SafetensorsError(f"its header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise SafetensorsError("its header is not a JSON object")
    base, tensors = 8 + length, {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = str(entry["dtype"]), tuple(int(n) for n in entry["shape"])
            start, stop = (int(n) for n in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"its header entry for {name} is malformed") from None
        if not 0 <= start <= stop or base + stop > size:
            raise SafetensorsError(f"{name}'s bytes [{start}, {stop}) run past the file")
        width = DTYPES[dtype].itemsize if dtype in DTYPES else None
        if width is not None and stop - start != width * int(np.prod(shape, dtype=np.int64)):
            raise SafetensorsError(f"{name} holds {stop - start} bytes, not its shape's")
        tensors[name] = TensorInfo(file, dtype, shape, base + start, base + stop)
    return tensors


def map_tensor(info: TensorInfo) -> np.ndarray:
    """One tensor's values as a read-only view of its file's pages (dtype as stored).

    Only the tensor's own pages are mapped, and they are unmapped when the returned
    array and every view of it are gone: drop them before mapping the next tensor.

    Raises:
        SafetensorsError: the file is shorter now than its header said.
    """
    dtype = DTYPES[info.dtype]
    if info.stop == info.start:  # nothing to map
        empty = np.empty(info.shape, dtype)
        empty.flags.writeable = False
        return empty
    offset = info.start - info.start % mmap.ALLOCATIONGRANULARITY
    with open(info.file, "rb") as handle:
        try:
            pages = mmap.mmap(
                handle.fileno(), info.stop - offset, access=mmap.ACCESS_READ, offset=offset
            )
        except ValueError:  # the file shrank since its header was read
            raise SafetensorsError(f"{info.file}: {info.dtype} data ended early") from None
    count = (info.stop - info.start) // dtype.itemsize
    return np.frombuffer(pages, dtype, count, info.start - offset).reshape(info.shape)
