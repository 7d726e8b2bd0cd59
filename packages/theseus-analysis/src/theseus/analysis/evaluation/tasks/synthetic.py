"""The documents of the synthetic-language tasks, made from the language's definition.

lm-evaluation-harness calls these (`custom_dataset: !function synthetic.choices` in the
task YAML) with the task's metadata: the language's settings (`alphabet`, `order`,
`concentration`, `smoothing`, `mean_doc_len`, `seed`; `MarkovLanguage`'s defaults, the
ones `theseus demo` trains on, when absent; `theseus eval` passes the root's own).
Nothing is read from disk or the network: the same settings give the same documents.

* `choices`: multiple choice. Each document is a stretch of the language and four
  continuations of a few letters; the right one is the continuation the language makes
  most likely (found by enumerating every continuation of that length under the
  transition table), and each wrong one is at least `margin` times less likely. A model
  that knows the language picks the right one every time; chance is one in four.
* `documents`: perplexity. Held-out documents of the language (a seed training and
  validation data never use), scored whole with rolling windows.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np

from theseus.data.synthetic import MarkovLanguage
from theseus.data.tokenizer import ByteTokenizer

__all__ = ["choices", "documents", "language"]

LETTERS = "abcdefghijklmnopqrstuvwxyz"
CHOICE_SEED = 4  # training samples with seed 1, validation 2, `documents` 3
DOCUMENT_SEED = 3


def language(settings: dict[str, Any]) -> MarkovLanguage:
    """The language the metadata names (its defaults where a setting is absent)."""
    fields = {f.name: f.type for f in dataclasses.fields(MarkovLanguage)}
    chosen = {}
    for name in fields:
        if name in settings:
            default = getattr(MarkovLanguage, name)
            chosen[name] = type(default)(settings[name])
    return MarkovLanguage(**chosen)


def _datasets(rows: list[dict[str, Any]]) -> Any:
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def choice_rows(
    lang: MarkovLanguage,
    count: int = 200,
    context: int = 32,
    length: int = 3,
    options: int = 4,
    margin: float = 10.0,
) -> list[dict[str, Any]]:
    """`count` multiple-choice rows: `query` (letters), `choices`, `gold` (an index)."""
    a, table = lang.alphabet, lang.transitions
    rng = np.random.default_rng([lang.seed, CHOICE_SEED])
    every = np.asarray(list(itertools.product(range(a), repeat=length)))  # [a**length, length]
    stationary = np.cumsum(lang.stationary)
    stationary[-1] = 1.0
    rows: list[dict[str, Any]] = []
    while len(rows) < count:
        state = int(np.searchsorted(stationary, rng.random(), side="right"))
        letters = []
        for _ in range(context):
            symbol = int(rng.choice(a, p=table[state]))
            letters.append(LETTERS[symbol])
            state = int(lang._successor(np.asarray(state), np.asarray(symbol)))
        states = np.full(len(every), state)
        likely = np.ones(len(every))
        for column in every.T:
            likely *= table[states, column]
            states = lang._successor(states, column)
        best = int(np.argmax(likely))
        unlikely = np.flatnonzero(likely * margin <= likely[best])
        if len(unlikely) < options - 1:
            continue  # a context whose continuations are too alike to ask about
        wrong = rng.choice(unlikely, size=options - 1, replace=False)
        gold = int(rng.integers(options))
        picked = [int(i) for i in wrong]
        picked.insert(gold, best)
        rows.append(
            {
                "query": "".join(letters),
                "choices": ["".join(LETTERS[s] for s in every[i]) for i in picked],
                "gold": gold,
            }
        )
    return rows


def document_rows(lang: MarkovLanguage, count: int = 40) -> list[dict[str, Any]]:
    """`count` held-out documents of the language: `text`."""
    tokenizer = ByteTokenizer()
    stream = lang.sample_tokens(count * lang.mean_doc_len * 4, seed=DOCUMENT_SEED)
    ends = np.flatnonzero(stream == tokenizer.eot)
    texts, start = [], 0
    for end in ends[:count]:
        texts.append(bytes(stream[start:end].astype(np.uint8)).decode("ascii"))
        start = end + 1
    return [{"text": text} for text in texts if text]


def choices(**metadata: Any) -> Any:
    """The multiple-choice task's dataset (a `datasets.DatasetDict` with a `test` split)."""
    return _datasets(choice_rows(language(metadata)))


def documents(**metadata: Any) -> Any:
    """The perplexity task's dataset (a `datasets.DatasetDict` with a `test` split)."""
    return _datasets(document_rows(language(metadata)))
