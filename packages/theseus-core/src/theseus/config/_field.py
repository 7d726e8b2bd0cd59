"""``field(path, ...)``: a dataclass field that also says where it lives in the configuration tree."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from theseus.config._errors import ConfigError

PATH_KEY = "theseus.path"
HELP_KEY = "theseus.help"
RESERVED = frozenset({"job"})

_SEGMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def normalize_path(key: str) -> str:
    """Return ``key`` in canonical form: segments joined by ``/``.

    ``"training.batch_size"`` and ``"training/batch_size"`` name the same setting.

    Args:
        key: a path written with ``/`` or ``.`` separators.

    Returns:
        The path with ``/`` separators.

    Raises:
        ConfigError: a segment is empty or is not an identifier.
    """
    if not isinstance(key, str):
        raise ConfigError(
            f"A configuration path must be a string like 'training/batch_size'; "
            f"got {key!r} ({type(key).__name__})."
        )
    parts = key.replace(".", "/").split("/")
    for part in parts:
        if not _SEGMENT.match(part):
            raise ConfigError(
                f"Configuration path {key!r} has an invalid segment {part!r}: each segment "
                "must be an identifier (letters, digits, underscores; not starting with a "
                "digit), separated by '/' or '.', e.g. 'training/batch_size'."
            )
    return "/".join(parts)


def field(
    path: str,
    *,
    default: Any = dataclasses.MISSING,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    help: str = "",
) -> Any:
    """Declare a dataclass field and the path of its setting in the configuration tree.

    Every class that declares the same path reads the same value. A field with
    neither ``default`` nor ``default_factory`` is required; it is keyword-only
    so it may follow fields that have defaults. On a field whose type is a
    dataclass, ``path`` is a prefix for the nested dataclass's own paths.

    Args:
        path: where the setting lives, ``"training/batch_size"`` (``.`` works too).
        default: the default value.
        default_factory: a zero-argument callable making the default (lists, dicts).
        help: a one-line description, written as a comment by ``dump``.

    Returns:
        A ``dataclasses.Field`` carrying the path in its metadata.

    Raises:
        ConfigError: both defaults given, an invalid path, or a reserved first segment.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Training:
        ...     batch_size: int = field("training/batch_size", default=8)
        >>> Training().batch_size
        8
    """
    canonical = normalize_path(path)
    if canonical.split("/")[0] in RESERVED:
        raise ConfigError(
            f"Configuration path {path!r} starts with the reserved segment "
            f"{canonical.split('/')[0]!r} (the saved YAML names its job there); "
            "choose another first segment, e.g. 'training/...'."
        )
    if default is not dataclasses.MISSING and default_factory is not dataclasses.MISSING:
        raise ConfigError(
            f"field({path!r}) got both default= and default_factory=; give one of them "
            "(default_factory for mutable values such as lists)."
        )
    metadata = {PATH_KEY: canonical, HELP_KEY: help}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    if default is not dataclasses.MISSING:
        return dataclasses.field(default=default, metadata=metadata)
    return dataclasses.field(metadata=metadata, kw_only=True)
