"""Exceptions of the configuration system: each says what was expected, what arrived, the fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from theseus.errors import TheseusError


class ConfigError(TheseusError, ValueError):
    """Base of every configuration error (a ``ValueError``)."""


class UnknownKeyError(ConfigError, KeyError, AttributeError):
    """A configuration path that no declared class knows.

    It is a ``KeyError`` (``tree["a/b"]``) and an ``AttributeError``
    (``tree.a.b``) as well, so ``in``/``getattr``-style probing behaves as usual.
    """

    def __str__(self) -> str:  # KeyError would quote the message.
        return str(self.args[0]) if self.args else ""


class ConfigTypeError(ConfigError, TypeError):
    """A value that cannot be coerced to the declared type of its path."""


class ConfigRangeError(ConfigError):
    """A number outside its setting's declared range, or settings that disagree (a rule)."""


def suggest(key: str, known: Iterable[str], n: int = 3) -> str:
    """Return a sentence naming the closest known keys, or an empty string.

    Args:
        key: the key that was not found.
        known: the valid keys.
        n: how many suggestions to make at most.

    Returns:
        ``" Did you mean 'a/b' or 'a/c'?"`` or ``""`` when nothing is close.
    """
    known = list(known)
    close = difflib.get_close_matches(key, known, n=n, cutoff=0.5)
    if not close:
        leaf = key.rsplit("/", 1)[-1]
        close = [k for k in known if k.rsplit("/", 1)[-1] == leaf][:n]
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"


def class_name(cls: type) -> str:
    """A class's readable name for messages (its qualified name, without ``<locals>``)."""
    return cls.__qualname__.rsplit("<locals>.", 1)[-1]


#: The earlier name of ConfigError (two declarers of one path disagree (type, default, or leaf versus section)), kept for old imports.
ConflictError = ConfigError

#: The earlier name of ConfigError (a required setting (declared without a default) has no value), kept for old imports.
MissingValueError = ConfigError
