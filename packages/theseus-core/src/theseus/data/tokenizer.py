"""The byte-level tokenizer: offline, deterministic, and the default everywhere.

Token ids 0..255 are the bytes of UTF-8 text; special tokens follow them. Nothing is
downloaded, so a prepared dataset can always be decoded again on any machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from theseus.data._errors import DataError

__all__ = ["ByteTokenizer", "TokenizerError", "get_tokenizer"]


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

    def encode(self, text: str, *, eot: bool = False) -> np.ndarray:
        """Encode text to ids `[n]`, appending end-of-text when `eot` is true."""
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
        array = np.asarray(ids, dtype=np.int64).reshape(-1)
        if array.size and (array.min() < 0 or array.max() >= self.vocab_size):
            bad = array[(array < 0) | (array >= self.vocab_size)][0]
            raise TokenizerError(
                f"token id {int(bad)} is outside the byte tokenizer's vocabulary "
                f"[0, {self.vocab_size}); decode ids produced by this tokenizer"
            )
        data = array[array < 256].astype(np.uint8).tobytes()
        return data.decode("utf-8", errors="replace")


_TOKENIZERS = {"bytes": ByteTokenizer}


def get_tokenizer(name: str = "bytes") -> ByteTokenizer:
    """Return the tokenizer registered under `name`.

    Raises:
        TokenizerError: no tokenizer of that name; the message lists the known ones.
    """
    try:
        return _TOKENIZERS[name]()
    except KeyError:
        raise TokenizerError(
            f"unknown tokenizer {name!r}; known tokenizers: {sorted(_TOKENIZERS)}. "
            "Theseus only ships offline tokenizers."
        ) from None
