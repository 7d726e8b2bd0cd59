"""The host-side cache of one recording: key order, concatenation, file roll-over.

Each open recorder owns one :class:`RecordingStore`; JAX callbacks and PyTorch
hooks hold a reference to their own recorder's store, so two recorders open at
once never share a cache. Arrays are kept per key in call order; when the
cached bytes would pass ``max_size_mb`` the cache is written to the next file of
the pattern and a new cache starts.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import InspectorOptionError, RecordingExistsError, RecordingShapeError
from ._safetensors import file_regex, format_filename, write_file

__all__ = ["RecordingStore"]

STACKS = ("concat", "separate")
EXISTS = ("overwrite", "error")


def _concat(parts: list[Any]) -> Any:
    if len(parts) == 1:
        return parts[0]
    if type(parts[0]).__module__.startswith("torch"):
        import torch

        return torch.cat([torch.atleast_1d(p) for p in parts])
    return np.concatenate([np.atleast_1d(p) for p in parts])


class RecordingStore:
    """The cache of one recording and the files it becomes.

    Args:
        folder: where the files go (created when the first file is written).
        filename_pattern: names of the files, with one ``{idx}`` field.
        max_size_mb: the most cached megabytes (2**20 bytes) before a file is written.
        stack: ``"concat"`` joins repeated calls of a key along axis 0;
            ``"separate"`` stores call ``i`` as ``key#i``.
        exist: ``"overwrite"`` replaces the files of an earlier recording in
            ``folder`` (and removes any it does not rewrite); ``"error"`` refuses.

    Raises:
        InspectorOptionError: invalid ``max_size_mb``, ``stack``, ``exist`` or pattern.
        RecordingExistsError: ``folder`` is a file, or holds a recording and
            ``exist="error"``.
    """

    def __init__(
        self,
        folder: Path,
        filename_pattern: str,
        max_size_mb: float,
        stack: str = "concat",
        exist: str = "overwrite",
    ) -> None:
        if stack not in STACKS:
            raise InspectorOptionError(f"stack must be one of {STACKS}, got {stack!r}.")
        if exist not in EXISTS:
            raise InspectorOptionError(f"exist must be one of {EXISTS}, got {exist!r}.")
        if not max_size_mb > 0:
            raise InspectorOptionError(
                f"max_size_mb must be a positive number of megabytes, got {max_size_mb!r}."
            )
        format_filename(filename_pattern, 0)
        self.folder = Path(folder)
        self.pattern = filename_pattern
        self.max_bytes = float(max_size_mb) * 2**20
        self.stack = stack
        self._lock = threading.Lock()
        self._order: dict[str, int] = {}
        self._cache: dict[str, list[Any]] = {}
        self._calls: dict[str, int] = {}
        self._tails: dict[str, tuple[tuple[int, ...], str]] = {}
        self._bytes = 0
        self.errors: list[str] = []
        self.files: list[Path] = []
        if self.folder.exists() and not self.folder.is_dir():
            raise RecordingExistsError(
                f"path {str(self.folder)!r} is a file, but tail() writes a folder of "
                f"{filename_pattern!r} files there; remove the file or pass a folder path."
            )
        if exist == "error" and self.stale_files(0):
            raise RecordingExistsError(
                f"{str(self.folder)!r} already holds a recording "
                f"({', '.join(p.name for p in self.stale_files(0))}); pass exist='overwrite' "
                "to replace it, or record into another folder."
            )

    @property
    def keys(self) -> list[str]:
        """Every key declared so far, in order of first call."""
        return list(self._order)

    def declare(self, key: str) -> None:
        """Fix the position of ``key`` (called when a call is traced or run)."""
        with self._lock:
            self._order.setdefault(key, len(self._order))

    def add(self, key: str, array: Any) -> None:
        """Append one call's array for ``key``; may write a file first (roll-over)."""
        nbytes = int(np.prod(array.shape)) * array.dtype.itemsize
        with self._lock:
            self._order.setdefault(key, len(self._order))
            count = self._calls.get(key, 0)
            self._calls[key] = count + 1
            if self.stack == "separate":
                key = f"{key}#{count}"
            elif not self._consistent(key, array):
                return
            if self._cache and self._bytes + nbytes > self.max_bytes:
                self._write()
            self._cache.setdefault(key, []).append(array)
            self._bytes += nbytes

    def _consistent(self, key: str, array: Any) -> bool:
        tail = (tuple(array.shape[1:]), str(array.dtype))
        first = self._tails.setdefault(key, tail)
        if first == tail:
            return True
        self.errors.append(
            f"{key}: a call gave shape {tuple(array.shape)} {tail[1]} after earlier calls with "
            f"trailing shape {first[0]} {first[1]}"
        )
        return False

    def _position(self, key: str) -> tuple[int, int]:
        base, _, call = key.partition("#")
        return self._order.get(base, len(self._order)), int(call or 0)

    def _write(self) -> None:
        arrays = {k: _concat(self._cache[k]) for k in sorted(self._cache, key=self._position)}
        self.folder.mkdir(parents=True, exist_ok=True)
        filename = self.folder / format_filename(self.pattern, len(self.files))
        write_file(filename, arrays)
        self.files.append(filename)
        self._cache.clear()
        self._bytes = 0

    def stale_files(self, first: int) -> list[Path]:
        """Files of the pattern in the folder with index ``>= first``."""
        if not self.folder.is_dir():
            return []
        regex = file_regex(self.pattern)
        found = [(regex.match(p.name), p) for p in self.folder.iterdir()]
        return sorted(p for m, p in found if m and int(m.group(1)) >= first)

    def close(self) -> list[Path]:
        """Write what is cached, remove files left by an earlier recording, return the files.

        Raises:
            RecordingShapeError: some repeated calls could not be concatenated
                (their other arrays were written).
        """
        with self._lock:
            if self._cache:
                self._write()
            for stale in self.stale_files(len(self.files)):
                stale.unlink()
        if self.errors:
            raise RecordingShapeError(
                "repeated calls cannot be concatenated along axis 0: "
                + "; ".join(self.errors)
                + ". Record with stack='separate' to keep each call as key#i."
            )
        return list(self.files)
