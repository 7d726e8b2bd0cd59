"""Cheap evaluations in tandem with training: multiple choice and bits per byte.

Both read a local JSON Lines file once, tokenize it once, and at every validation score
it with `theseus.model.scoring.loglikelihoods` on the trainer's live parameters (no
copy), padded to the file's longest row each time (one compiled program for the run):

* `MultipleChoice` (`eval/multiple_choice/acc`, `acc_norm`): rows `{"query": ...,
  "choices": [...], "gold": INDEX}`; each choice is scored as the continuation of the
  query (joined by `delimiter`, a space by default), as lm-evaluation-harness scores a
  `multiple_choice` task: `acc` picks the choice with the highest loglikelihood,
  `acc_norm` the highest per character of the choice.
* `BitsPerByte` (`eval/held_out/bits_per_byte`): rows `{"text": ...}`, each document
  scored whole in rolling windows (as the harness's `loglikelihood_rolling`), the
  negative loglikelihood summed over documents divided by their UTF-8 bytes and ln 2.

List them in a trainer's `EVALUATION` and set the file
(`evaluation/multiple_choice/file`, `evaluation/held_out/file`); a relative path is
read from the directory the run was started in.
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from theseus.config import ConfigError, field
from theseus.training.evaluation import Evaluation

if TYPE_CHECKING:
    from theseus.training.base import BaseTrainer

__all__ = [
    "BitsPerByte",
    "BitsPerByteConfig",
    "MultipleChoice",
    "MultipleChoiceConfig",
    "encode_pair",
]


@dataclass(frozen=True)
class MultipleChoiceConfig:
    """Settings of the tandem multiple-choice evaluation."""

    file: str = field(
        "evaluation/multiple_choice/file",
        default="",
        help="JSON Lines of {query, choices, gold} to score at every validation",
    )
    delimiter: str = field(
        "evaluation/multiple_choice/delimiter",
        default=" ",
        help="joins the query and each choice",
    )
    limit: int = field(
        "evaluation/multiple_choice/limit", default=0, ge=0, help="rows at most (0: all)"
    )
    batch_size: int = field(
        "evaluation/multiple_choice/batch_size", default=32, ge=1, help="rows per compiled call"
    )


@dataclass(frozen=True)
class BitsPerByteConfig:
    """Settings of the tandem bits-per-byte evaluation."""

    file: str = field(
        "evaluation/held_out/file",
        default="",
        help="JSON Lines of {text} documents to score at every validation",
    )
    limit: int = field(
        "evaluation/held_out/limit", default=0, ge=0, help="documents at most (0: all)"
    )
    batch_size: int = field(
        "evaluation/held_out/batch_size", default=32, ge=1, help="windows per compiled call"
    )


def encode_pair(
    encode: Any, context: str, continuation: str, eot: int
) -> tuple[list[int], list[int]]:
    """Token ids of `(context, continuation)` as lm-evaluation-harness makes them: the
    context's trailing spaces move to the continuation, the continuation is what the
    whole text adds to the context's ids, and an empty context is the end-of-text id."""
    if not context:
        return [eot], [int(i) for i in encode(continuation)]
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = [int(i) for i in encode(context + continuation)]
    head = [int(i) for i in encode(context)]
    return head, whole[len(head) :]


def _rows(path: str, keys: tuple[str, ...], owner: str, limit: int) -> list[dict[str, Any]]:
    """The rows of a JSON Lines file, each holding `keys`, or a one-line error."""
    if not path:
        raise ConfigError(
            f"{owner} needs a file: set {owner}/file to a JSON Lines file of "
            f"{{{', '.join(keys)}}} rows"
        )
    where = Path(path).expanduser().absolute()
    if not where.is_file():
        raise ConfigError(
            f"{owner}/file = {path!r}: no such file ({where}); give a JSON Lines file"
        )
    rows = []
    with open(where, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ConfigError(f"{where}:{number} is not JSON ({error.msg})") from None
            missing = [k for k in keys if not isinstance(row, dict) or k not in row]
            if missing:
                raise ConfigError(
                    f"{where}:{number} has no {', '.join(missing)}; each row needs "
                    f"{', '.join(keys)}"
                )
            rows.append(row)
            if limit and len(rows) == limit:
                break
    if not rows:
        raise ConfigError(f"{where} holds no rows; give at least one")
    return rows


@functools.lru_cache(maxsize=16)
def _choice_pairs(
    path: str, stamp: tuple[int, int], tokenizer: Any, delimiter: str, limit: int
) -> tuple[list[tuple[list[int], list[int]]], list[int], list[int], list[int]]:
    """Every (query, choice) pair's ids, each question's first pair, its choices' count
    and gold index, and each choice's length in characters (read once per file state)."""
    del stamp  # part of the cache key: a changed file is read again
    owner = "evaluation/multiple_choice"
    pairs: list[tuple[list[int], list[int]]] = []
    firsts: list[int] = []
    golds: list[int] = []
    lengths: list[int] = []
    for number, row in enumerate(_rows(path, ("query", "choices", "gold"), owner, limit), 1):
        choices, gold = row["choices"], row["gold"]
        if not isinstance(choices, list) or not choices or not isinstance(gold, int):
            raise ConfigError(f"{path}:{number}: choices must be a list and gold an index")
        if not 0 <= gold < len(choices):
            raise ConfigError(
                f"{path}:{number}: gold {gold} is not an index of {len(choices)} choices"
            )
        firsts.append(len(pairs))
        golds.append(gold)
        for choice in choices:
            pairs.append(
                encode_pair(
                    tokenizer.encode_plain,
                    str(row["query"]),
                    delimiter + str(choice),
                    tokenizer.eot,
                )
            )
            lengths.append(len(delimiter + str(choice)))
    firsts.append(len(pairs))
    return pairs, firsts, golds, lengths


class _Plain:
    """A tokenizer's `encode` without its special start tokens (hashable for the cache)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.eot = tokenizer, int(tokenizer.eot)

    def encode_plain(self, text: str) -> Any:
        return self.tokenizer.encode(text, special=False)

    def __hash__(self) -> int:
        return hash(self.tokenizer.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Plain) and other.tokenizer.name == self.tokenizer.name


def _width(pairs: list[tuple[list[int], list[int]]], trainer: BaseTrainer) -> int:
    """The positions the longest pair fills (what the model reads of it, at most the block)."""
    block = int(trainer.model.config.block_size)
    return min(block, max(len(a) + len(b) for a, b in pairs) - 1)


def _stamp(path: str) -> tuple[int, int]:
    try:
        status = os.stat(Path(path).expanduser())
    except OSError:
        return (0, 0)
    return status.st_mtime_ns, status.st_size


class MultipleChoice(Evaluation):
    """Multiple choice from a local file at every validation (see the module docstring)."""

    NAME = "multiple_choice"
    CONFIG = MultipleChoiceConfig

    def evaluate(self, trainer: BaseTrainer) -> dict[str, float]:
        from theseus.model.scoring import loglikelihoods

        cfg = trainer.configure(MultipleChoiceConfig)
        pairs, firsts, golds, lengths = _choice_pairs(
            cfg.file, _stamp(cfg.file), _Plain(trainer.tokenizer), cfg.delimiter, cfg.limit
        )
        scores = np.asarray(
            [
                s
                for s, _ in loglikelihoods(
                    trainer.model,
                    trainer.state.params,
                    pairs,
                    batch_size=cfg.batch_size,
                    width=_width(pairs, trainer),
                )
            ]
        )
        per_char = scores / np.maximum(np.asarray(lengths, np.float64), 1.0)
        right = right_norm = 0
        for index, gold in enumerate(golds):
            first, end = firsts[index], firsts[index + 1]
            right += int(np.argmax(scores[first:end])) == gold
            right_norm += int(np.argmax(per_char[first:end])) == gold
        return {"acc": right / len(golds), "acc_norm": right_norm / len(golds)}


@functools.lru_cache(maxsize=16)
def _windows(
    path: str, stamp: tuple[int, int], tokenizer: Any, block: int, limit: int
) -> tuple[list[tuple[list[int], list[int]]], int]:
    """Every document's rolling windows and the documents' UTF-8 bytes."""
    from theseus.model.scoring import rolling_windows

    del stamp
    rows = _rows(path, ("text",), "evaluation/held_out", limit)
    windows, size = [], 0
    for row in rows:
        text = str(row["text"])
        ids = [int(i) for i in tokenizer.encode_plain(text)]
        if ids:
            windows.extend(rolling_windows(ids, tokenizer.eot, block))
            size += len(text.encode())
    return windows, size


class BitsPerByte(Evaluation):
    """Bits per byte of local documents at every validation (see the module docstring)."""

    NAME = "held_out"
    CONFIG = BitsPerByteConfig

    def evaluate(self, trainer: BaseTrainer) -> dict[str, float]:
        from theseus.model.scoring import loglikelihoods

        cfg = trainer.configure(BitsPerByteConfig)
        block = int(trainer.model.config.block_size)
        windows, size = _windows(
            cfg.file, _stamp(cfg.file), _Plain(trainer.tokenizer), block, cfg.limit
        )
        total = sum(
            s
            for s, _ in loglikelihoods(
                trainer.model,
                trainer.state.params,
                windows,
                batch_size=cfg.batch_size,
                width=_width(windows, trainer),
            )
        )
        return {"bits_per_byte": -total / max(size, 1) / math.log(2)}
