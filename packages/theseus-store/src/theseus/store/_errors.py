"""The exceptions of theseus-store: one base class, one subclass per way a caller reacts.

Every error says what was expected, what arrived and how to fix it, and names
the file involved when there is one. Each subclasses a built-in exception as
well, so callers that catch ``KeyError`` or ``TypeError`` keep working.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from theseus.errors import TheseusError

__all__ = [
    "AmbiguousNodeError",
    "BlobHashError",
    "CheckpointNotFoundError",
    "CorruptStoreError",
    "InvalidNodeError",
    "MissingBlobError",
    "NotAStoreError",
    "StoreBusyError",
    "StoreError",
    "StorePermissionError",
    "UnknownKeyError",
    "UnknownNodeError",
    "UnknownQueryKeyError",
    "ValueTypeError",
]


class StoreError(TheseusError, RuntimeError):
    """Base class of every error raised by theseus-store (a `theseus.errors.TheseusError`)."""


class NotAStoreError(StoreError):
    """The root exists but is not a store (a non-empty folder without the marker, or a file)."""


class CorruptStoreError(StoreError):
    """The database or a blob is damaged: the store cannot give a correct answer."""


class MissingBlobError(CorruptStoreError, FileNotFoundError):
    """A row names a blob that is not there (also a ``FileNotFoundError``)."""


class StorePermissionError(StoreError, PermissionError):
    """The store's files cannot be created or written."""


class StoreBusyError(StoreError, TimeoutError):
    """Another process held the write lock for longer than the store's patience."""


class InvalidNodeError(StoreError, ValueError):
    """A node's name, nonce or seq, or its serialized form, is malformed."""


class ValueTypeError(StoreError, TypeError):
    """A value, metadata or query operand is not of an accepted type."""


class QueryError(StoreError, ValueError):
    """A query that cannot mean anything: an unknown operator, a value of the wrong kind."""


class UnknownQueryKeyError(StoreError, KeyError):
    """A query names a value key that no node has; the message lists close names."""

    def __init__(self, key: str, known: Iterable[str], what: str = "value key") -> None:
        known = sorted(set(known))
        close = difflib.get_close_matches(key, known, n=5, cutoff=0.5)
        if close:
            hint = f"Did you mean {', '.join(repr(k) for k in close)}?"
        elif known:
            shown = ", ".join(repr(k) for k in known[:10])
            more = f" (and {len(known) - 10} more)" if len(known) > 10 else ""
            hint = f"Known keys: {shown}{more}."
        else:
            hint = "No node has recorded any values yet."
        self.key = key
        self.close = close
        super().__init__(f"No node has the {what} {key!r}. {hint}")

    def __str__(self) -> str:
        """Return the message itself (KeyError would print its repr)."""
        return str(self.args[0])


class UnknownNodeError(StoreError, KeyError):
    """A node was addressed directly (get, show, lineage) but the store never recorded it."""

    def __str__(self) -> str:
        """Return the message itself (KeyError would print its repr)."""
        return str(self.args[0])


class CheckpointNotFoundError(StoreError, FileNotFoundError):
    """``checkpoint()`` was given a path that does not exist (yet)."""


#: The earlier name of CorruptStoreError (a blob's bytes do not hash to the name the row records), kept for old imports.
BlobHashError = CorruptStoreError

#: The earlier name of InvalidNodeError (a run name alone was given, and the run has several lineages), kept for old imports.
AmbiguousNodeError = InvalidNodeError

#: The earlier name of UnknownQueryKeyError, kept for old imports (`theseus.config.UnknownKeyError`
#: is the configuration's: an unknown setting).
UnknownKeyError = UnknownQueryKeyError
