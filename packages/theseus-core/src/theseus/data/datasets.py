"""Built-in datasets: the offline synthetic language, FineWeb-style records, local text.

Each dataset is prepared once into `ROOT/data/<NAME>/` (see `theseus.data.prepared`)
with `theseus data prepare NAME --root ROOT [--option value ...]` or `cls.prepare(root, ...)`.
Nothing is ever downloaded: FineWeb reads parquet or jsonl files the user points at.
"""

from __future__ import annotations

import abc
import json
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from theseus.config import ConfigError, ConfigRangeError, Range
from theseus.data.prepared import PreparedData, dataset_dir, write_prepared
from theseus.data.synthetic import MarkovLanguage
from theseus.data.tokenizer import get_tokenizer
from theseus.errors import TheseusError
from theseus.registry import dataset

__all__ = ["Dataset", "FineWeb", "LocalDocuments", "SourceError", "Synthetic", "TextFiles"]


class SourceError(TheseusError, FileNotFoundError):
    """The files a dataset is prepared from are missing or unreadable."""


#: The numeric options of the built-in datasets: the range each admits and its default.
OPTIONS: dict[str, tuple[type, Range, int | float]] = {
    "tokens": (int, Range(ge=1), 2_000_000),
    "val_tokens": (int, Range(ge=1), 100_000),
    "alphabet": (int, Range(ge=2, le=26), 16),
    "order": (int, Range(ge=1, le=4), 2),
    "concentration": (float, Range(gt=0), 0.2),
    "mean_doc_len": (int, Range(ge=2), 512),
    "seed": (int, Range(ge=0, le=2**63 - 1), 0),
    "val_fraction": (float, Range(ge=0, le=0.5), 0.05),
}


def _option(dataset: str, options: dict[str, Any], name: str, default: Any = None) -> Any:
    """The numeric option `name` (given as text or a number), checked against its range.

    Raises:
        ConfigError: the value is not a number of the option's kind.
        ConfigRangeError: it is outside the option's range (`OPTIONS`).
    """
    kind, declared, fallback = OPTIONS[name]
    default = fallback if default is None else default
    value = options.get(name, default)
    flag = f"--{name.replace('_', '-')}"
    what = "an integer" if kind is int else "a finite number"
    example = f"`theseus data prepare {dataset} --root ROOT {flag} {default}`"
    try:
        if isinstance(value, bool):  # `--tokens` written as a flag, with no value
            raise ValueError(value)
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        number = kind(value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{flag} of {dataset} expects {what}; got {value!r}. Pass e.g. {example}."
        ) from None
    if not declared.admits(number):
        raise ConfigRangeError(
            f"{flag} of {dataset} must be {what} {declared.describe()}; got {value!r}. Pass a "
            f"value in that range or leave it out for the default, e.g. {example}."
        )
    return number


def _progress(total: int, description: str) -> Any:
    """A progress bar on a terminal; silent when output is redirected."""
    from rich.progress import Progress

    progress = Progress(disable=not sys.stderr.isatty(), transient=True)
    task = progress.add_task(description, total=total)
    return progress, task


class Dataset(abc.ABC):
    """Interface of prepared datasets: a `NAME` (its folder) and a `prepare` class method."""

    NAME: ClassVar[str]
    PREPARE_ARGS: ClassVar[str] = ""  # required options, shown in "not prepared" errors
    TOKENIZER_OPTION: ClassVar[bool] = False  # whether `prepare` takes `--tokenizer NAME`

    @classmethod
    @abc.abstractmethod
    def prepare(cls, root: str | os.PathLike[str], **options: Any) -> Path:
        """Write the prepared files under `root`; returns the dataset folder."""

    @classmethod
    def open(cls, root: str | os.PathLike[str], tokenizer: str | None = None) -> PreparedData:
        """Open the prepared files (raises `DataNotPreparedError` with the command to run).

        Args:
            root: the root the dataset was prepared under.
            tokenizer: the tokenizer the model reads (`architecture/tokenizer`); when it
                is not the default `bytes` and `prepare` takes `--tokenizer`, the command
                in the "not prepared" error names it, so the data is prepared in the
                model's ids.
        """
        args = cls.PREPARE_ARGS
        if cls.TOKENIZER_OPTION and tokenizer not in (None, "bytes"):
            args = f"{args} --tokenizer {shlex.quote(str(tokenizer))}".strip()
        return PreparedData.open(root, cls.NAME, prepare_args=args)


def _split(docs: list[np.ndarray], val_fraction: float) -> dict[str, np.ndarray]:
    """Hold out whole documents: every k-th document goes to validation."""
    if not docs:
        return {"train": np.zeros((0,), np.uint16), "val": np.zeros((0,), np.uint16)}
    every = max(2, round(1 / val_fraction)) if val_fraction > 0 else len(docs) + 1
    val = [d for i, d in enumerate(docs) if i % every == every - 1]
    train = [d for i, d in enumerate(docs) if i % every != every - 1]
    return {
        "train": np.concatenate(train) if train else np.zeros((0,), np.uint16),
        "val": np.concatenate(val) if val else np.zeros((0,), np.uint16),
    }


@dataset("synthetic")
class Synthetic(Dataset):
    """A Markov-chain language with a known entropy bound (see `MarkovLanguage`).

    Options (all optional): `tokens` (training tokens, default 2,000,000), `val_tokens`
    (default 100,000), `alphabet`, `order`, `concentration`, `mean_doc_len`, `seed`.
    The language's settings are kept in the header, so `entropy_bound(root)` is exact.
    """

    NAME = "synthetic"

    @classmethod
    def prepare(cls, root: str | os.PathLike[str], **options: Any) -> Path:
        known = {
            "tokens",
            "val_tokens",
            "alphabet",
            "order",
            "concentration",
            "mean_doc_len",
            "seed",
        }
        _check_options(cls.NAME, options, known)
        number = {name: _option(cls.NAME, options, name) for name in sorted(known)}
        tokens, val_tokens = number.pop("tokens"), number.pop("val_tokens")
        language = MarkovLanguage(**number)
        splits = {
            "train": language.sample_tokens(tokens, seed=1),
            "val": language.sample_tokens(val_tokens, seed=2),
        }
        meta = {
            "source": "synthetic",
            "language": {
                "alphabet": language.alphabet,
                "order": language.order,
                "concentration": language.concentration,
                "smoothing": language.smoothing,
                "mean_doc_len": language.mean_doc_len,
                "seed": language.seed,
            },
            "entropy_bound": language.entropy_bound(),
        }
        return write_prepared(
            dataset_dir(root, cls.NAME), splits, tokenizer=get_tokenizer(), meta=meta
        )

    @classmethod
    def language(cls, root: str | os.PathLike[str]) -> MarkovLanguage:
        """The language the prepared files were sampled from."""
        return MarkovLanguage(**cls.open(root).header["meta"]["language"])

    @classmethod
    def entropy_bound(cls, root: str | os.PathLike[str]) -> float:
        """The lowest loss per token (nats) any model can reach on the prepared data."""
        return cls.language(root).entropy_bound()


def _records(path: Path) -> Iterator[str]:
    """The `text` field of each record of a parquet or jsonl file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = (
            pq.read_table(path, columns=["text"]) if "text" in pq.read_schema(path).names else None
        )
        if table is None:
            raise SourceError(f"{path} has no 'text' column; FineWeb records need a text field")
        yield from (str(text) for text in table.column("text").to_pylist() if text is not None)
        return
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise SourceError(f"{path}:{number} is not valid JSON ({error.msg})") from None
            if not isinstance(record, dict) or "text" not in record:
                raise SourceError(
                    f"{path}:{number} has no 'text' field; each line needs {{\"text\": ...}}"
                )
            yield str(record["text"])


def _check_options(name: str, options: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(options) - known)
    if unknown:
        flags = ", ".join(f"--{k.replace('_', '-')}" for k in unknown)
        valid = ", ".join(f"--{k.replace('_', '-')}" for k in sorted(known))
        raise ConfigError(f"{name} has no option {flags}; its options are {valid}")


def _source_files(source: Any, suffixes: tuple[str, ...], name: str) -> list[Path]:
    if source is None:
        raise SourceError(
            f"{name} is prepared from local files: pass --source DIR "
            f"(a folder of {' or '.join(suffixes)} files); nothing is downloaded"
        )
    folder = Path(source)
    files = (
        [folder]
        if folder.is_file()
        else sorted(p for p in folder.rglob("*") if p.suffix in suffixes)
    )
    if not files:
        raise SourceError(f"no {' or '.join(suffixes)} files under {folder} to prepare {name} from")
    return files


def _prepare_documents(
    cls: type[Dataset],
    root: str | os.PathLike[str],
    files: list[Path],
    reader: Any,
    val_fraction: float,
    tokenizer_name: str = "bytes",
) -> Path:
    tokenizer = get_tokenizer(tokenizer_name, root=root)
    docs: list[np.ndarray] = []
    progress, task = _progress(len(files), f"tokenizing {cls.NAME}")
    with progress:
        for path in files:
            docs.extend(tokenizer.encode(text, eot=True) for text in reader(path))
            progress.advance(task)
    splits = _split(docs, val_fraction)
    if not splits["train"].size or (val_fraction > 0 and not splits["val"].size):
        every = max(2, round(1 / val_fraction)) if val_fraction > 0 else 0
        raise SourceError(
            f"{cls.NAME}: {len(docs)} document(s) under {', '.join(map(str, files[:3]))}"
            f"{' ...' if len(files) > 3 else ''} leave "
            f"{'no validation' if splits['train'].size else 'no training'} text with "
            f"--val-fraction {val_fraction:g} (whole documents are held out, one in "
            f"{every or 'none'}); give at least {max(every, 2)} documents (files, or jsonl lines) "
            "or a larger --val-fraction"
        )
    meta = {"source": [str(p) for p in files], "documents": len(docs), "val_fraction": val_fraction}
    return write_prepared(dataset_dir(root, cls.NAME), splits, tokenizer=tokenizer, meta=meta)


class LocalDocuments(Dataset):
    """Interface of datasets prepared from a user's local files (`--source DIR`).

    Subclasses set `NAME`, `SUFFIXES` (the file endings read), `VAL_FRACTION` (whole
    documents held out) and implement `documents(path)`, the texts of one file.
    `--tokenizer NAME` tokenizes with a tokenizer kept under the root (the name
    `theseus import gpt2` printed) instead of bytes.
    """

    PREPARE_ARGS = "--source DIR"
    TOKENIZER_OPTION = True
    SUFFIXES: ClassVar[tuple[str, ...]]
    VAL_FRACTION: ClassVar[float]

    @staticmethod
    @abc.abstractmethod
    def documents(path: Path) -> Iterator[str]:
        """The documents of one source file."""

    @classmethod
    def prepare(cls, root: str | os.PathLike[str], **options: Any) -> Path:
        _check_options(cls.NAME, options, {"source", "val_fraction", "tokenizer"})
        files = _source_files(options.get("source"), cls.SUFFIXES, cls.NAME)
        val_fraction = _option(cls.NAME, options, "val_fraction", cls.VAL_FRACTION)
        tokenizer = str(options.get("tokenizer", "bytes"))
        return _prepare_documents(cls, root, files, cls.documents, val_fraction, tokenizer)


@dataset("fineweb")
class FineWeb(LocalDocuments):
    """FineWeb-style records (parquet or jsonl with a `text` field) from a local folder.

    Options: `source` (required: a folder or file), `val_fraction` (default 0.01; whole
    documents are held out), `tokenizer` (default `bytes`).
    """

    NAME = "fineweb"
    SUFFIXES = (".parquet", ".jsonl")
    VAL_FRACTION = 0.01

    @staticmethod
    def documents(path: Path) -> Iterator[str]:
        return _records(path)


@dataset("text")
class TextFiles(LocalDocuments):
    """A user's own corpus: every `.txt` file is one document, every `.jsonl` line one record.

    Options: `source` (required), `val_fraction` (default 0.05), `tokenizer` (default
    `bytes`).
    """

    NAME = "text"
    SUFFIXES = (".txt", ".jsonl")
    VAL_FRACTION = 0.05

    @staticmethod
    def documents(path: Path) -> Iterator[str]:
        if path.suffix == ".jsonl":
            yield from _records(path)
        else:
            yield path.read_text(encoding="utf-8", errors="replace")
