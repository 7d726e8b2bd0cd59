"""The one form in which the store keeps and compares file system paths.

A root or a checkpoint can be spelled many ways: through a symlink, relative to
the working folder (``../runs``), with a trailing slash, ``a/./b`` or
``a/x/../b``. Every path the store records or compares goes through
:func:`canonical_path` first, so two spellings of one folder are one path and a
registered checkpoint never looks foreign when a run is resumed through another
spelling of its root.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["canonical_path"]


def canonical_path(path: str | os.PathLike[str]) -> Path:
    """Return ``path`` absolute, with ``~`` expanded and every symlink, ``.`` and ``..`` resolved.

    Missing trailing parts are allowed (``Path.resolve(strict=False)``): they are
    kept as spelled after the longest existing prefix has been resolved.

    Example:
        >>> canonical_path("/tmp/a/./x/../b/") == canonical_path("/tmp/a/b")
        True
    """
    return Path(path).expanduser().resolve()
