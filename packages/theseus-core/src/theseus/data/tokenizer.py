"""Tokenizers: the byte-level default, and BPE tokenizers kept under a root.

`ByteTokenizer` (name `bytes`) needs nothing: ids 0..255 are the bytes of UTF-8 text,
special tokens follow them. A BPE tokenizer (brought in by `theseus import gpt2` or
`theseus import hf`) lives in `ROOT/tokenizers/<name>/tokenizer.json`, a copy the root
owns, so a lineage and the datasets prepared for it decode the same way after the
source folder is gone; a model whose end-of-text token is not `<|endoftext|>` (Llama's
`<|end_of_text|>`, Pythia's...) has it named in `special.json` beside it. Nothing is
ever downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from theseus.config import write_atomic
from theseus.data._errors import DataError

__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "Tokenizer",
    "TokenizerError",
    "get_tokenizer",
    "install_tokenizer",
    "tokenizer_dir",
    "tokenizer_name",
]

#: The end-of-text token a BPE tokenizer has unless its `special.json` names another.
END_OF_TEXT = "<|endoftext|>"
_SPECIAL = "special.json"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class TokenizerError(DataError):
    """A tokenizer name or token id that this installation cannot handle."""


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes as tokens, plus an end-of-text and a padding token.

    Example:
        >>> tok = ByteTokenizer()
        >>> ids = tok.encode("hé")
        >>> ids.tolist()
        [104, 195, 169]
        >>> tok.decode(ids)
        'hé'
        >>> tok.vocab_size
        258
    """

    name: str = "bytes"

    @property
    def eot(self) -> int:
        """Id of the end-of-text token that separates documents."""
        return 256

    @property
    def pad(self) -> int:
        """Id of the padding token (never a training target)."""
        return 257

    @property
    def vocab_size(self) -> int:
        """Number of distinct ids: 256 bytes and two special tokens."""
        return 258

    @property
    def dtype(self) -> np.dtype:
        """The smallest unsigned dtype that holds every id."""
        return np.dtype(np.uint16)

    def encode(self, text: str, *, eot: bool = False, special: bool = True) -> np.ndarray:
        """Encode text to ids `[n]`, appending end-of-text when `eot` is true (`special`:
        no start-of-text to add here)."""
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(self.dtype)
        if eot:
            ids = np.append(ids, np.asarray(self.eot, dtype=self.dtype))
        return ids

    def encode_batch(self, texts: Iterable[str]) -> np.ndarray:
        """Encode documents into one stream, each followed by end-of-text."""
        parts = [self.encode(text, eot=True) for text in texts]
        if not parts:
            return np.zeros((0,), dtype=self.dtype)
        return np.concatenate(parts)

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Decode ids back to text; special tokens are dropped, bad UTF-8 is replaced.

        Raises:
            TokenizerError: an id is negative or not below `vocab_size`.
        """
        array = _in_vocabulary(ids, self.vocab_size, "the byte tokenizer's")
        data = array[array < 256].astype(np.uint8).tobytes()
        return data.decode("utf-8", errors="replace")


def _in_vocabulary(ids: Iterable[int] | np.ndarray, vocab_size: int, whose: str) -> np.ndarray:
    """`ids` as a flat int64 array, every one in `[0, vocab_size)`.

    Raises:
        TokenizerError: the first id outside it, naming `whose` vocabulary.
    """
    array = np.asarray(ids, dtype=np.int64).reshape(-1)
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        bad = array[(array < 0) | (array >= vocab_size)][0]
        raise TokenizerError(
            f"token id {int(bad)} is outside {whose} vocabulary [0, {vocab_size}); decode "
            "ids produced by this tokenizer"
        )
    return array


class Tokenizer(Protocol):
    """What datasets, trainers and generation use of a tokenizer."""

    @property
    def name(self) -> str: ...
    @property
    def eot(self) -> int: ...
    @property
    def pad(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def dtype(self) -> np.dtype: ...
    def encode(self, text: str, *, eot: bool = False, special: bool = True) -> np.ndarray: ...
    def encode_batch(self, texts: Iterable[str]) -> np.ndarray: ...
    def decode(self, ids: Iterable[int] | np.ndarray) -> str: ...


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise TokenizerError(
            'BPE tokenizers need the `tokenizers` package: pip install "theseus-core[hf]" '
            '(or "theseus-core[gpt2]")'
        ) from None
    return tokenizers


@dataclass(frozen=True)
class BPETokenizer:
    """A Hugging Face `tokenizer.json` tokenizer, e.g. GPT-2's, Pythia's or Llama 3's.

    `encode` applies the tokenizer's own post-processor, as transformers does: a
    start-of-text token its `TemplateProcessing` adds (Llama 3's `<|begin_of_text|>`)
    starts every encoded text; special tokens written in the text are taken as text.
    `decode` drops special tokens. Padding reuses end-of-text: padded positions are
    masked by the batch, not recognized by id.
    """

    name: str
    json: str = field(repr=False)
    eot_token: str = END_OF_TEXT
    _backend: Any = field(init=False, repr=False, compare=False)
    _eot: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        backend = parse_tokenizer(self.json, self.name, eot=self.eot_token)
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "_eot", backend.token_to_id(self.eot_token))

    @property
    def eot(self) -> int:
        """Id of the end-of-text token (`eot_token`), which separates documents."""
        return int(self._eot)

    @property
    def pad(self) -> int:
        """Id written at padded positions (end-of-text; the batch masks them)."""
        return int(self._eot)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    @property
    def dtype(self) -> np.dtype:
        """The smallest unsigned dtype that holds every id."""
        return np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)

    def encode(self, text: str, *, eot: bool = False, special: bool = True) -> np.ndarray:
        """Encode text to ids `[n]`, appending end-of-text when `eot` is true; without
        `special`, the post-processor's start-of-text is left out (an evaluation
        harness scores text pieces that way)."""
        ids = self._backend.encode(text, add_special_tokens=special).ids
        if eot:
            ids = [*ids, self.eot]
        return np.asarray(ids, dtype=self.dtype)

    def encode_batch(self, texts: Iterable[str]) -> np.ndarray:
        """Encode documents into one stream, each followed by end-of-text."""
        texts = list(texts)
        if not texts:
            return np.zeros((0,), dtype=self.dtype)
        encoded = self._backend.encode_batch(texts)
        return np.concatenate([np.asarray([*e.ids, self.eot], dtype=self.dtype) for e in encoded])

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """Decode ids back to text; special tokens are dropped.

        Raises:
            TokenizerError: an id is negative or not below `vocab_size`.
        """
        array = _in_vocabulary(ids, self.vocab_size, f"tokenizer {self.name!r}'s")
        return str(self._backend.decode(array.tolist(), skip_special_tokens=True))


def parse_tokenizer(text: str, where: str, eot: str | None = END_OF_TEXT) -> Any:
    """A `tokenizers.Tokenizer` from `tokenizer.json` text that has the token `eot`.

    Args:
        eot: the end-of-text token it must have; None checks for none.

    Raises:
        TokenizerError: not a tokenizer file, or no end-of-text token (`where` names it).
    """
    tokenizers = _tokenizers()
    try:
        backend = tokenizers.Tokenizer.from_str(text)
    except Exception as error:  # the Rust parser's own message says where
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise TokenizerError(f"{where} is not a readable tokenizer.json ({first})") from None
    if eot is not None and backend.token_to_id(eot) is None:
        raise TokenizerError(f"{where} has no {eot} token; Theseus separates documents with it")
    return backend


def tokenizer_dir(root: str | os.PathLike[str], name: str) -> Path:
    """The folder that holds tokenizer `name` under a Theseus root."""
    return Path(root) / "tokenizers" / name


def tokenizer_name(text: str, prefix: str, eot: str = END_OF_TEXT) -> str:
    """The name `install_tokenizer` keeps `tokenizer.json` text under: prefix and hash
    (of the text, and of the end-of-text token where it is not `<|endoftext|>`)."""
    content = text if eot == END_OF_TEXT else f"{text}\0{eot}"
    return f"{prefix}-{hashlib.sha256(content.encode()).hexdigest()[:12]}"


def install_tokenizer(
    root: str | os.PathLike[str], text: str, prefix: str, eot: str = END_OF_TEXT
) -> str:
    """Copy `tokenizer.json` text into the root, named by its content; returns the name.

    The name is `<prefix>-<first 12 hex digits of its SHA-256>`: the same tokenizer
    imported twice is kept once, and two different ones never share a name. An
    existing copy is never rewritten. An end-of-text token other than `<|endoftext|>`
    is written to `special.json` beside it (before `tokenizer.json`, so a copy that
    has its `tokenizer.json` is whole).

    Raises:
        TokenizerError: `text` is not a usable tokenizer, or the root's copy under that
            name differs (a damaged root).
    """
    parse_tokenizer(text, f"the {prefix} tokenizer", eot=eot)
    name = tokenizer_name(text, prefix, eot)
    folder = tokenizer_dir(root, name)
    path = folder / "tokenizer.json"
    if path.is_file():
        if path.read_text(encoding="utf-8") != text:
            raise TokenizerError(
                f"{path} differs from the tokenizer named {name!r} after its content; the "
                "root is damaged: move that folder aside and import again"
            )
        return name
    folder.mkdir(parents=True, exist_ok=True)
    if eot != END_OF_TEXT:
        write_atomic(folder / _SPECIAL, json.dumps({"eot": eot}))
    write_atomic(path, text)
    return name


def get_tokenizer(name: str = "bytes", root: str | os.PathLike[str] | None = None) -> Tokenizer:
    """The tokenizer called `name`: `bytes`, or one kept under `ROOT/tokenizers/`.

    Raises:
        TokenizerError: no tokenizer of that name (the message lists the root's).
    """
    if name == "bytes":
        return ByteTokenizer()
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise TokenizerError(
            f"tokenizer name {name!r} is not a folder name under ROOT/tokenizers; use "
            "'bytes' or the name `theseus import gpt2` printed"
        )
    if root is None:
        raise TokenizerError(
            f"tokenizer {name!r} is kept under a root (ROOT/tokenizers/{name}); this call "
            "has no root to look in"
        )
    path = tokenizer_dir(root, name) / "tokenizer.json"
    if not path.is_file():
        kept = sorted(p.parent.name for p in (Path(root) / "tokenizers").glob("*/tokenizer.json"))
        raise TokenizerError(
            f"no tokenizer {name!r} under {Path(root)} (expected {path}); known here: "
            f"{', '.join(['bytes', *kept])}"
        )
    special = path.parent / _SPECIAL
    eot = END_OF_TEXT
    if special.is_file():
        try:
            eot = str(json.loads(special.read_text(encoding="utf-8"))["eot"])
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
            raise TokenizerError(
                f"{special} is not a JSON object with an eot token; the root is damaged: "
                "move that folder aside and import again"
            ) from None
    return BPETokenizer(name, path.read_text(encoding="utf-8"), eot)
