"""The on-disk format of a prepared dataset, and reading batches from it.

A prepared dataset is a folder `ROOT/data/<name>/` with `train.bin` and `val.bin`
(flat token memmaps), `train.docs.npy` and `val.docs.npy` (the start offset of every
document) and `header.json` (tokenizer, dtype, token counts, the tokens' digest,
provenance). The header is written last, through a rename, so a folder with a header is
always complete: a crash during preparation leaves a folder that reads as "not
prepared", never a torn dataset.

A root's runs read its prepared data again when they resume or are analyzed, so a
dataset is never replaced by other tokens unless asked (`replacing()`, the command's
`--replace`); preparing the same tokens again writes nothing.

Batches are a pure function of `(seed, step, slice)`: the same step reads the same
rows after a restart, and every host computes the same global plan and keeps its own rows.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import shlex
from collections.abc import Iterator
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
    "replacing",
    "setting_changes",
    "short_digest",
    "write_prepared",
]

Split = Literal["train", "val"]
FORMAT_VERSION = 1
_SPLITS: tuple[Split, ...] = ("train", "val")


class DataNotPreparedError(TheseusError, FileNotFoundError):
    """A dataset was used before `theseus data prepare` wrote it into the root."""


_REPLACING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "theseus_data_replacing", default=False
)


@contextlib.contextmanager
def replacing() -> Iterator[None]:
    """Within the block, preparing a dataset may replace other tokens prepared before.

    Outside it, `write_prepared` refuses to: the runs of a root were trained on its
    prepared tokens and read them again when they resume or are analyzed (memorization
    replays their batches, `theseus eval` scores on them). `theseus data prepare
    ... --replace` prepares inside this block.
    """
    token = _REPLACING.set(True)
    try:
        yield
    finally:
        _REPLACING.reset(token)


def _digest(parts: Iterator[bytes | memoryview]) -> str:
    """`sha256:HEX` of the train tokens' bytes, then the validation tokens'."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return f"sha256:{h.hexdigest()}"


def _file_chunks(folder: Path) -> Iterator[bytes]:
    for split in _SPLITS:
        with open(folder / f"{split}.bin", "rb") as handle:
            while chunk := handle.read(1 << 24):
                yield chunk


def _held(folder: Path) -> dict[str, Any] | None:
    """The header of the complete dataset of this format in `folder`, else None."""
    try:
        header = json.loads((folder / "header.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict) or header.get("format") != FORMAT_VERSION:
        return None  # unreadable by this version: preparing again is what its error asks
    return header


def short_digest(digest: str | None) -> str:
    """The first 12 hex digits of a header's `sha256:...` digest ("unknown" for none)."""
    return digest.removeprefix("sha256:")[:12] if digest else "unknown"


def setting_changes(before: dict[str, Any], after: dict[str, Any], limit: int = 4) -> list[str]:
    """What differs between the settings of two headers (or records of one): the token
    counts, the tokenizer and the dataset's own `meta` (flattened with dots, e.g.
    `language.seed`), each as `KEY OLD -> NEW`, at most `limit` of them."""

    def flat(header: dict[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = {"tokenizer": header.get("tokenizer")}
        found.update({f"count.{k}": v for k, v in (header.get("count") or {}).items()})
        stack = [("", header.get("meta") or {})]
        while stack:
            prefix, tree = stack.pop()
            for key, value in tree.items():
                if isinstance(value, dict):
                    stack.append((f"{prefix}{key}.", value))
                else:
                    found[f"{prefix}{key}"] = value
        return found

    def shown(value: Any) -> str:
        if value is None:
            return "none"
        if isinstance(value, float):
            return f"{value:.4g}"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return str(value)

    a, b = flat(before), flat(after)
    keys = [*a, *(k for k in b if k not in a)]
    pairs = [(k, shown(a.get(k)), shown(b.get(k))) for k in keys]
    # a value derived from the others (a float that differs past its shown digits) is
    # left out where it reads the same
    return [f"{k} {old} -> {new}" for k, old, new in pairs if old != new][:limit]


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
        directory: the dataset folder (created if needed). Where it already holds these
            very tokens nothing is written; other tokens are replaced only inside
            `replacing()` (their header goes first, so a crash midway leaves a folder that
            reads as not prepared).
        splits: `{"train": ids[n], "val": ids[m]}` in the tokenizer's id space.
        tokenizer: the tokenizer that produced the ids (recorded in the header).
        meta: extra provenance stored in the header (source, generator settings, ...).

    Returns:
        The dataset folder.

    Raises:
        DataError: an id beyond the tokenizer's vocabulary, or the folder holds other
            tokens and this is not inside `replacing()`.
    """
    folder = Path(directory)
    tokens: dict[str, np.ndarray] = {}
    for split in _SPLITS:
        tokens[split] = np.ascontiguousarray(splits[split], dtype=tokenizer.dtype)
        if tokens[split].size and int(tokens[split].max()) >= tokenizer.vocab_size:
            raise DataError(
                f"{split} ids go up to {int(tokens[split].max())}, beyond the "
                f"{tokenizer.name} tokenizer's vocabulary of {tokenizer.vocab_size}"
            )
    digest = _digest(tokens[split].data.cast("B") for split in _SPLITS)
    counts: dict[str, int] = {split: int(tokens[split].size) for split in _SPLITS}
    held = _held(folder)
    if held is not None:
        same = held.get("tokenizer") == tokenizer.name and held.get("dtype") == tokenizer.dtype.name
        if same and not held.get("digest"):  # prepared before headers kept the digest
            try:
                held["digest"] = _digest(_file_chunks(folder))
            except OSError:
                held["digest"] = None  # a token file gone: not these tokens
        if same and held["digest"] == digest:
            return folder  # these very tokens are prepared: nothing to write
        if not _REPLACING.get():
            these = {"tokenizer": tokenizer.name, "count": counts, "meta": meta or {}}
            changes = setting_changes(held, these) or ["the same settings, other tokens"]
            raise DataError(
                f"{folder} already holds other prepared tokens (sha256 "
                f"{short_digest(held.get('digest'))} there, {short_digest(digest)} these: "
                f"{'; '.join(changes)}); the runs of this root read them again when they "
                "resume or are analyzed. Prepare into another root, or replace them on "
                "purpose with theseus data prepare ... --replace (in Python, inside `with "
                "theseus.data.replacing():`)"
            )
    folder.mkdir(parents=True, exist_ok=True)
    header_path = folder / "header.json"
    header_path.unlink(missing_ok=True)  # the folder is incomplete until the header is back
    for split in _SPLITS:
        write_atomic(folder / f"{split}.bin", tokens[split].tobytes())
        with open(folder / f".{split}.docs.tmp", "wb") as handle:
            np.save(handle, _doc_starts(tokens[split], tokenizer.eot))
        os.replace(folder / f".{split}.docs.tmp", folder / f"{split}.docs.npy")
    header = {
        "format": FORMAT_VERSION,
        "tokenizer": tokenizer.name,
        "dtype": tokenizer.dtype.name,
        "vocab_size": tokenizer.vocab_size,
        "count": counts,
        "digest": digest,
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
