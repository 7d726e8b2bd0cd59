"""The host-side cache of one recording: key order, concatenation, file roll-over.

Each open recorder owns one :class:`RecordingStore`; JAX callbacks and PyTorch
hooks hold a reference to their own recorder's store, so two recorders open at
once never share a cache. Arrays are kept per key in call order; when the
cached bytes would pass ``max_size_mb`` the cache is written to the next file of
the pattern and a new cache starts.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import (
    InspectorOptionError,
    KeyCollisionError,
    RecordingExistsError,
)
from ._paths import KeyMap
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
        key_map: ordered ``(pattern, replacement)`` renames applied to every key.

    Raises:
        InspectorOptionError: invalid ``max_size_mb``, ``stack``, ``exist`` or pattern.
        RecordingExistsError: ``folder`` is a file, holds ``.safetensors`` files
            the pattern does not name, or holds a recording and ``exist="error"``.
    """

    def __init__(
        self,
        folder: Path,
        filename_pattern: str,
        max_size_mb: float,
        stack: str = "concat",
        exist: str = "overwrite",
        key_map: Sequence[tuple[str, str]] = (),
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
        self._rank: dict[str, int] = {}
        self._runs: dict[str, list[list[tuple[int, Any]]]] = {}
        self._run_sites: dict[str, set[int]] = {}
        self._written: dict[str, int] = {}
        self._tails: dict[str, tuple[tuple[int, ...], Any]] = {}
        self._bytes = 0
        self.errors: list[str] = []
        self.collisions: list[str] = []
        self._rename = KeyMap(key_map)
        self.files: list[Path] = []
        if self.folder.exists() and not self.folder.is_dir():
            raise RecordingExistsError(
                f"path {str(self.folder)!r} is a file, but tail() writes a folder of "
                f"{filename_pattern!r} files there; remove the file or pass a folder path."
            )
        if self.folder.is_dir():
            regex = file_regex(filename_pattern)
            foreign = sorted(
                p.name
                for p in self.folder.glob("*.safetensors")
                if p.is_file() and not regex.match(p.name)
            )
            if foreign:
                raise RecordingExistsError(
                    f"{str(self.folder)!r} holds .safetensors files that {filename_pattern!r} "
                    f"does not name ({', '.join(foreign)}); reading the folder would merge them "
                    "with this recording. Remove them, or record into another folder."
                )
        if exist == "error" and self.stale_files(0):
            raise RecordingExistsError(
                f"{str(self.folder)!r} already holds a recording "
                f"({', '.join(p.name for p in self.stale_files(0))}); pass exist='overwrite' "
                "to replace it, or record into another folder."
            )

    @property
    def keys(self) -> list[str]:
        """Every key recorded so far, in order of first call."""
        return sorted(self._rank, key=self._rank.__getitem__)

    def add(self, key: str, array: Any, site: int) -> None:
        """Add one call's array for ``key``; may write a file first (roll-over).

        Args:
            key: the record key.
            array: the value (NumPy array or PyTorch tensor).
            site: the call site's number, taken in program order when the call
                was traced (or run eagerly). Keys are ordered by their smallest
                site; the calls of one key that one program run delivers are
                ordered by site too, whatever order the host callbacks arrive in.
        """
        self.add_calls((key,), (array,), (site,))

    def add_calls(self, keys: Sequence[str], arrays: Sequence[Any], sites: Sequence[int]) -> None:
        """:meth:`add` for several ``(key, array, site)`` at once (one callback's worth)."""
        with self._lock:
            for key, array, site in zip(keys, arrays, sites, strict=True):
                self._add(key, array, site)

    def _add(self, key: str, array: Any, site: int) -> None:
        nbytes = math.prod(array.shape) * array.dtype.itemsize
        if self._rename:
            try:
                key = self._rename(key)
            except KeyCollisionError as error:
                if str(error) not in self.collisions:
                    self.collisions.append(str(error))
                return
        if self.stack == "concat" and not self._consistent(key, array):
            return
        rank = self._rank.get(key)
        if rank is None or site < rank:
            self._rank[key] = site
        if self._runs and self._bytes + nbytes > self.max_bytes:
            self._write()
        runs = self._runs.get(key)
        sites = self._run_sites.get(key)
        if runs is None or sites is None:
            runs = self._runs[key] = []
            sites = self._run_sites[key] = set()
        if not runs or site in sites:  # a site seen again starts the next program run
            runs.append([])
            sites.clear()
        runs[-1].append((site, array))
        sites.add(site)
        self._bytes += nbytes

    def _consistent(self, key: str, array: Any) -> bool:
        tail = (tuple(array.shape[1:]), array.dtype)
        first = self._tails.setdefault(key, tail)
        if first == tail:
            return True
        self.errors.append(
            f"{key}: a call gave shape {tuple(array.shape)} {tail[1]} after earlier calls with "
            f"trailing shape {first[0]} {first[1]}"
        )
        return False

    def _write(self) -> None:
        arrays: dict[str, Any] = {}
        for key in sorted(self._runs, key=self._rank.__getitem__):
            calls = [a for run in self._runs[key] for _, a in sorted(run, key=lambda c: c[0])]
            if self.stack == "concat":
                arrays[key] = _concat(calls)
                continue
            done = self._written.get(key, 0)
            arrays.update({f"{key}#{done + i}": a for i, a in enumerate(calls)})
            self._written[key] = done + len(calls)
        self.folder.mkdir(parents=True, exist_ok=True)
        filename = self.folder / format_filename(self.pattern, len(self.files))
        write_file(filename, arrays)
        self.files.append(filename)
        self._runs.clear()
        self._run_sites.clear()
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
            KeyCollisionError: ``key_map`` sent two keys to one name (the second
                key's arrays were dropped).
            InspectorOptionError: some repeated calls could not be concatenated
                (their other arrays were written).
        """
        with self._lock:
            if self._runs:
                self._write()
            for stale in self.stale_files(len(self.files)):
                stale.unlink()
        if self.collisions:
            raise KeyCollisionError(" ".join(self.collisions))
        if self.errors:
            raise InspectorOptionError(
                "repeated calls cannot be concatenated along axis 0: "
                + "; ".join(self.errors)
                + ". Record with stack='separate' to keep each call as key#i."
            )
        return list(self.files)
