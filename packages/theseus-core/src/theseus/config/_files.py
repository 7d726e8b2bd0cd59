"""A file written whole or not at all: what `dump` and the data and tokenizer writers use."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, content: str | bytes) -> None:
    """Write `content` (text as UTF-8) to `path` through a temporary file beside it, synced,
    then renamed over it: a crash or a full disk leaves the old file whole (or no file),
    never a part of one, and the temporary file is removed."""
    data = content.encode() if isinstance(content, str) else content
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
