"""A configuration path's one spelling: ``training/batch_size``, however it was written."""

from __future__ import annotations

import re

from theseus.config._errors import ConfigError

__all__ = ["normalize_path"]

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
