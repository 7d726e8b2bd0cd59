"""The records a node holds: scalar values, checkpoint entries and artifacts.

Values are scalars only (``int``, ``float``, ``str``, ``bool``, ``None``). SQLite
has no boolean and turns NaN into NULL, so each value is stored with a kind tag
that restores ``True``/``False`` and ``nan`` exactly on the way back.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from theseus.store._errors import ValueTypeError
from theseus.store._node import Node

__all__ = ["Artifact", "Checkpoint", "Scalar", "decode_value", "encode_meta", "encode_value"]

Scalar = int | float | str | bool | None

KIND_PLAIN = "v"
KIND_BOOL = "b"
KIND_NAN = "n"
# A PostgreSQL store's -0.0 (jsonb numbers have no sign of zero; ``_dialect``).
KIND_NEGATIVE_ZERO = "z"


def encode_value(key: str, value: object) -> tuple[Scalar, str]:
    """Return ``(stored, kind)`` for one scalar value.

    Args:
        key: the value's key, named in the error.
        value: the value to store.

    Returns:
        The SQLite-storable form and its kind tag.

    Raises:
        ValueTypeError: if ``value`` is not a scalar (or an int beyond 64 bits).
    """
    if isinstance(value, bool):
        return int(value), KIND_BOOL
    if isinstance(value, float) and math.isnan(value):
        return None, KIND_NAN
    if value is None or isinstance(value, str | float):
        return value, KIND_PLAIN
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise ValueTypeError(
                f"Value {key!r} is the int {value}, which does not fit in 64 bits. "
                "Log it as a float or a string."
            )
        return value, KIND_PLAIN
    # NumPy and JAX scalars: accept zero-dimensional numbers through .item().
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        return encode_value(key, item())
    raise ValueTypeError(
        f"Value {key!r} must be a scalar (int, float, str, bool or None); got "
        f"{type(value).__module__}.{type(value).__qualname__}. Reduce arrays to a number "
        "first (e.g. float(x.mean())), or store structured data as an artifact with put()."
    )


def decode_value(stored: Scalar, kind: str) -> Scalar:
    """Invert :func:`encode_value`."""
    if kind == KIND_BOOL:
        return bool(stored)
    if kind == KIND_NAN:
        return math.nan
    if kind == KIND_NEGATIVE_ZERO:
        return -0.0
    return stored


def encode_meta(meta: Mapping[str, Any] | None) -> str:
    """Return checkpoint metadata as JSON text.

    Raises:
        ValueTypeError: if ``meta`` is not a JSON-serializable mapping.
    """
    if meta is None:
        return "{}"
    if not isinstance(meta, Mapping):
        raise ValueTypeError(f"Checkpoint meta must be a mapping; got {type(meta).__name__}.")
    try:
        return json.dumps(dict(meta), sort_keys=True, allow_nan=True)
    except TypeError as err:
        raise ValueTypeError(
            f"Checkpoint meta must be JSON-serializable (dicts, lists, str, numbers, bools, "
            f"None): {err}. Convert arrays with .tolist() or store them as an artifact."
        ) from err


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """An index entry for a checkpoint directory that was complete when recorded.

    Attributes:
        node: the node the checkpoint belongs to.
        path: the checkpoint directory (absolute).
        step: the training step (defaults to the node's seq).
        meta: any JSON metadata given at record time.
        created: the UNIX time the entry was recorded.
    """

    node: Node
    path: str
    step: int
    meta: dict[str, Any]
    created: float


@dataclasses.dataclass(frozen=True)
class Artifact:
    """One version of a named artifact on a node.

    The bytes are read from the blob folder on first access of :attr:`content`
    and checked against :attr:`hash`.

    Attributes:
        node: the node the artifact belongs to.
        name: the artifact's name (unique per node; a rewrite adds a version).
        filename: the file name the bytes had (e.g. ``activations.pdf``).
        hash: the SHA-256 of the bytes, in hex.
        size: the number of bytes.
        created: the UNIX time the version was recorded.
        version: 1 for the first write of ``name`` on ``node``, then 2, 3, ...
    """

    node: Node
    name: str
    filename: str
    hash: str
    size: int
    created: float
    version: int
    _load: Callable[[str, int, bytes | None], bytes] = dataclasses.field(repr=False, compare=False)
    _inline: bytes | None = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def from_row(
        cls,
        node: Node,
        row: tuple[Any, ...],
        load: Callable[[str, int, bytes | None], bytes],
        inline: bytes | None = None,
    ) -> Artifact:
        """Build from a row starting ``(name, filename, hash, size, created, version)``.

        The fields come from rows the store validated on write, so this skips the
        frozen dataclass's per-field ``__setattr__`` (``get()`` builds many of these).
        ``inline`` is the bytes if the query already fetched them (verified on access).
        """
        artifact = object.__new__(cls)
        artifact.__dict__.update(
            node=node,
            name=row[0],
            filename=row[1],
            hash=row[2],
            size=row[3],
            created=row[4],
            version=row[5],
            _load=load,
            _inline=inline,
        )
        return artifact

    @functools.cached_property
    def content(self) -> bytes:
        """The exact bytes (read once, verified against the hash).

        Raises:
            MissingBlobError: if the blob file is gone.
            CorruptStoreError: if the blob's bytes do not match the recorded hash.
        """
        return self._load(self.hash, self.size, self._inline)


def artifact_bytes(name: object, filename: object, content: object) -> bytes:
    """The bytes of an artifact, after checking its name, file name and content.

    Raises:
        ValueTypeError: ``name``/``filename`` are not non-empty strings, ``filename``
            has a folder in it, or ``content`` is not bytes-like.
    """
    for what, text in (("name", name), ("filename", filename)):
        if not isinstance(text, str) or not text or "\x00" in text:
            raise ValueTypeError(f"An artifact {what} must be a non-empty string; got {text!r}.")
    assert isinstance(filename, str)
    if "/" in filename or "\\" in filename:
        raise ValueTypeError(
            f"An artifact filename is a bare file name; got {filename!r}. Pass "
            f"{os.path.basename(filename)!r}."
        )
    if not isinstance(content, bytes | bytearray | memoryview):
        raise ValueTypeError(
            f"Artifact {name!r}: content must be bytes; got {type(content).__name__}. "
            "Encode text with .encode() or serialize the object first."
        )
    return bytes(content)
