"""The on-disk format of a prepared dataset, and reading batches from it.

A prepared dataset is a folder `ROOT/data/<name>/` with `train.bin` and `val.bin`
(flat token memmaps), `train.docs.npy` and `val.docs.npy` (the start offset of every
document) and `header.json` (tokenizer, dtype, token counts, provenance). The header is
written last, through a rename, so a folder with a header is always complete: a crash
during preparation leaves a folder that reads as "not prepared", never a torn dataset.

Batches are a pure function of `(seed, step, slice)`: the same step reads the same
rows after a restart, and every host computes the same global plan and keeps its own rows.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from theseus.config import write_atomic
from theseus.data._errors import DataError
from theseus.data.tokenizer import Tokenizer, get_tokenizer
from theseus.errors import TheseusError

__all__ = [
    "DataNotPreparedError",
    "PreparedData",
    "Split",
    "dataset_dir",
    "write_prepared",
]

Split = Literal["train", "val"]
FORMAT_VERSION = 1
_SPLITS: tuple[Split, ...] = ("train", "val")


class DataNotPreparedError(TheseusError, FileNotFoundError):
    """A dataset was used before `theseus data prepare` wrote it into the root."""


def dataset_dir(root: str | os.PathLike[str], name: str) -> Path:
    """The folder that holds dataset `name` under a Theseus root."""
    return Path(root) / "data" / name


def _doc_starts(tokens: np.ndarray, eot: int) -> np.ndarray:
    """Offsets where documents start: 0 and every position after an end-of-text."""
    ends = np.flatnonzero(tokens == eot) + 1
    starts = np.concatenate([[0], ends[ends < tokens.size]])
    return starts.astype(np.int64)


def write_prepared(
    directory: str | os.PathLike[str],
    splits: dict[str, np.ndarray],
    *,
    tokenizer: Tokenizer,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write token streams for `train` and `val` and then the header that completes them.

    Args:
        directory: the dataset folder (created if needed; an older header is replaced
            only after the new token files are complete).
        splits: `{"train": ids[n], "val": ids[m]}` in the tokenizer's id space.
        tokenizer: the tokenizer that produced the ids (recorded in the header).
        meta: extra provenance stored in the header (source, generator settings, ...).

    Returns:
        The dataset folder.
    """
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    header_path = folder / "header.json"
    header_path.unlink(missing_ok=True)  # the folder is incomplete until the header is back
    counts = {}
    for split in _SPLITS:
        tokens = np.ascontiguousarray(splits[split], dtype=tokenizer.dtype)
        if tokens.size and int(tokens.max()) >= tokenizer.vocab_size:
            raise DataError(
                f"{split} ids go up to {int(tokens.max())}, beyond the "
                f"{tokenizer.name} tokenizer's vocabulary of {tokenizer.vocab_size}"
            )
        write_atomic(folder / f"{split}.bin", tokens.tobytes())
        with open(folder / f".{split}.docs.tmp", "wb") as handle:
            np.save(handle, _doc_starts(tokens, tokenizer.eot))
        os.replace(folder / f".{split}.docs.tmp", folder / f"{split}.docs.npy")
        counts[split] = int(tokens.size)
    header = {
        "format": FORMAT_VERSION,
        "tokenizer": tokenizer.name,
        "dtype": tokenizer.dtype.name,
        "vocab_size": tokenizer.vocab_size,
        "count": counts,
        "meta": meta or {},
    }
    write_atomic(header_path, json.dumps(header, indent=2, sort_keys=True).encode())
    return folder


@dataclass(frozen=True)
class PreparedData:
    """A prepared dataset opened for reading (token memmaps plus document offsets)."""

    name: str
    directory: Path
    header: dict[str, Any]

    @classmethod
    def open(cls, root: str | os.PathLike[str], name: str, prepare_args: str = "") -> PreparedData:
        """Open dataset `name` under `root`.

        `prepare_args` are the options the dataset needs, shown in the command that the
        "not prepared" error suggests (e.g. `--source DIR`).

        Raises:
            DataNotPreparedError: the dataset folder or its header is missing; the
                message gives the command that prepares it.
        """
        folder = dataset_dir(root, name)
        header_path = folder / "header.json"
        if not header_path.is_file():
            raise DataNotPreparedError(
                f"dataset {name!r} is not prepared under {Path(root)} (expected "
                f"{header_path}). Prepare it first:\n"
                f"    theseus data prepare {name} --root {shlex.quote(str(root))}"
                + (f" {prepare_args}" if prepare_args else "")
            )
        header = json.loads(header_path.read_text())
        if header.get("format") != FORMAT_VERSION:
            raise DataNotPreparedError(
                f"{header_path} has format {header.get('format')!r}, this version reads "
                f"format {FORMAT_VERSION}; prepare it again with "
                f"`theseus data prepare {name} --root {shlex.quote(str(root))}`"
            )
        return cls(name=name, directory=folder, header=header)

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer recorded in the header (a BPE one is read from the same root)."""
        return get_tokenizer(self.header["tokenizer"], root=self.directory.parent.parent)

    def tokens(self, split: Split) -> np.ndarray:
        """The flat token stream of `split` as a read-only memmap `[count]`."""
        count = int(self.header["count"][split])
        if count == 0:
            return np.zeros((0,), dtype=self.header["dtype"])
        return np.memmap(
            self.directory / f"{split}.bin", dtype=self.header["dtype"], mode="r", shape=(count,)
        )

    def doc_starts(self, split: Split) -> np.ndarray:
        """Start offset of every document in `split` `[n_docs]`."""
        return np.load(self.directory / f"{split}.docs.npy")
