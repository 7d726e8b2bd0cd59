"""What the library's analyses read: repeated random tokens, validation batches, and how
often each token occurs in the training data.

- `repeated_tokens(ids, rows, length, seed)`: `rows` rows of `length` tokens drawn from
  `ids` followed by the same tokens again, as a batch `[rows, 2 * length]` (the same at
  every node and on every host: a function of the seed and the ids alone).
- `open_plan(...)`: the batch plan of the data the validation analyses read (the
  trainer's `DATASET`, or the dataset `library/dataset` names), checked against the
  model's tokenizer.
- `token_shares(plan, vocab)`: each token's share of the training data `[vocab]`, the
  datasets weighted by their sampling rates.
- `frequency_buckets(shares, buckets)`: each token's bucket `[vocab]` (0: the most
  frequent), every bucket holding an equal share of the training tokens.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from theseus.analysis._errors import AnalysisError
from theseus.data.batches import Batch, MixturePlan

__all__ = ["frequency_buckets", "open_plan", "repeated_tokens", "token_shares"]

_CHUNK = 1 << 24  # tokens counted at a time (a 64 MiB int32 window of the memmap)


def repeated_tokens(ids: np.ndarray, rows: int, length: int, seed: int) -> Batch:
    """`rows` rows of `length` tokens drawn uniformly from `ids`, then repeated.

    Returns:
        `x [rows, 2 * length]` int32, `y` the next token (`-1` at the last position),
        `padding_mask` all true. Row `r`'s token at `length + i` equals the one at `i`.
    """
    rng = np.random.default_rng([seed, 47])
    half = np.asarray(ids, np.int32)[rng.integers(0, len(ids), size=(rows, length))]
    x = np.concatenate([half, half], axis=1)
    y = np.concatenate([x[:, 1:], np.full((rows, 1), -1, np.int32)], axis=1)
    return {"x": x, "y": y, "padding_mask": np.ones_like(x, dtype=bool)}


def open_plan(
    declaration: Any,
    root: str | os.PathLike[str],
    seed: int,
    tokenizer: str | None,
    owner: str,
) -> MixturePlan:
    """The batch plan of `declaration` (a trainer's `DATASET` or a dataset class).

    Raises:
        AnalysisError: `declaration` is `[]` (a trainer that batches itself), or a
            dataset was prepared with another tokenizer than the model's.
        DataNotPreparedError: a dataset is not prepared under `root` (its message
            has the command).
    """
    from theseus.training.flywheel.strategy import plan

    opened = plan(declaration, root, seed, tokenizer)
    if opened is None:
        raise AnalysisError(
            f"{owner} reads validation data, but the trainer declares DATASET = [] (it "
            "batches itself); name a prepared dataset with library/dataset=NAME"
        )
    for source in opened.sources:
        used = source.header["tokenizer"]
        if tokenizer is not None and used != tokenizer:
            raise AnalysisError(
                f"{owner}: dataset {source.name!r} was prepared with tokenizer {used!r}, but "
                f"the model reads {tokenizer!r} ids; prepare data with the model's tokenizer "
                f"(theseus data prepare text --root ROOT --source DIR --tokenizer {tokenizer}) "
                "and name it with library/dataset=text"
            )
    return opened


def token_shares(plan: MixturePlan, vocab: int) -> np.ndarray:
    """Each token id's share of the training data the plan samples, `[vocab]` float64.

    A dataset's counts are its `train` split's (`np.bincount`, a window at a time), as
    shares of that split, weighted by the dataset's sampling rate; the shares sum to 1
    (ids the data never uses have 0).
    """
    shares = np.zeros(vocab, np.float64)
    for source, rate in zip(plan.sources, plan.rates, strict=True):
        tokens = source.tokens("train")
        counts = np.zeros(vocab, np.int64)
        for start in range(0, tokens.size, _CHUNK):
            window = np.asarray(tokens[start : start + _CHUNK])
            counts += np.bincount(window, minlength=vocab)[:vocab]
        total = counts.sum()
        if total:
            shares += rate * counts / total
    return shares


def frequency_buckets(shares: np.ndarray, buckets: int) -> np.ndarray:
    """Each token's frequency bucket `[vocab]` int32: 0 the most frequent.

    Token types are ordered by share (ties by id) and cut where the running share
    passes `1/buckets`, `2/buckets`, ...: bucket `b` holds the types whose preceding
    share lies in `[b/buckets, (b+1)/buckets)`, so each holds about an equal share of
    the training tokens. Types the data never uses are in the last bucket.
    """
    order = np.lexsort((np.arange(shares.size), -shares))
    before = np.cumsum(shares[order]) - shares[order]  # the share of the types before each
    total = shares.sum()
    where = np.floor(before / total * buckets) if total > 0 else np.zeros(shares.size)
    bucket = np.minimum(where.astype(np.int64), buckets - 1)
    bucket[shares[order] == 0] = buckets - 1
    out = np.empty(shares.size, np.int32)
    out[order] = bucket
    return out
