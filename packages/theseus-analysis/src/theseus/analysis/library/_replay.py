"""The training sequences a node has seen, replayed exactly: which, and their tokens.

A node has seen the training batches at steps `first .. last` (`Seen`), `rows` sequences
each. `draw` picks `n` of those `(step, row)` pairs without replacement, from a stream of
`seed` and the range alone (so every host, and a later run, picks the same ones).
Their tokens come from one of two places:

- `plan_sequences`: the trainer's own data plan (`read_batch(step)`, the batch the update
  at that cursor read, exactly), each host filling in the rows it holds;
- `order_sequences`: a prepared dataset that holds the training sequences in the order
  they were trained on (an imported suite's data order): step `s`'s row `r` is the
  `order_length` tokens at `(s * rows + r) * order_length` of its `train` split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Seen", "draw", "order_sequences", "plan_sequences"]


@dataclass(frozen=True)
class Seen:
    """The training batches a node has seen.

    Attributes:
        first, last: the first and last step (inclusive); `last < first` when none.
        rows: sequences per step.
    """

    first: int
    last: int
    rows: int

    @property
    def steps(self) -> int:
        """How many steps were seen."""
        return max(0, self.last - self.first + 1)


def draw(seen: Seen, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`(steps [k], rows [k])` of `k = min(n, seen sequences)` distinct sequences, in
    step then row order, drawn from `numpy.random.default_rng([seed, first, last])`."""
    total = seen.steps * seen.rows
    if total == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rng = np.random.default_rng([seed, seen.first, max(seen.last, 0)])
    flat = np.sort(rng.choice(total, size=min(n, total), replace=False))
    return seen.first + flat // seen.rows, flat % seen.rows


def plan_sequences(
    read: Callable[[int], dict[str, np.ndarray]],
    steps: np.ndarray,
    rows: np.ndarray,
    length: int,
    per_host: int,
    host: int,
    gather: Callable[[Any], Any] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The first `length` tokens of each drawn row of the data plan, and whether all of
    them are real (not padding): `(tokens [k, length] int32, real [k] bool)`.

    Args:
        read: the host rows of the plan's training batch at a step (`read_batch`).
        steps, rows: the drawn sequences (global row indices).
        length: tokens kept of each row (at most the block size).
        per_host: rows each host reads; this host holds rows `host * per_host ..`.
        gather: on several hosts, stacks an array from every host on a new leading axis
            (`multihost_utils.process_allgather`); None on one.
    """
    k = steps.size
    tokens = np.zeros((k, length), np.int32)
    real = np.zeros(k, bool)
    held = np.zeros(k, bool)
    for step in np.unique(steps):
        batch: dict[str, np.ndarray] | None = None
        for index in np.flatnonzero(steps == step):
            local = int(rows[index]) - host * per_host
            if not 0 <= local < per_host:
                continue
            if batch is None:
                batch = read(int(step))
            tokens[index] = batch["x"][local, :length]
            real[index] = bool(batch["padding_mask"][local, :length].all())
            held[index] = True
    if gather is not None:  # each row from the host that holds it
        owner = np.argmax(np.asarray(gather(held)), axis=0)
        tokens = np.asarray(gather(tokens))[owner, np.arange(k)]
        real = np.asarray(gather(real))[owner, np.arange(k)]
    return tokens, real


def order_sequences(
    stream: np.ndarray,
    steps: np.ndarray,
    rows: np.ndarray,
    order_rows: int,
    order_length: int,
    length: int,
) -> np.ndarray:
    """The first `length` tokens of each drawn sequence of a data order `stream` (a
    prepared `train` split): `[k, length]` int32. The caller checks that the stream
    holds every sequence drawn (`(last + 1) * order_rows * order_length` tokens)."""
    starts = (steps.astype(np.int64) * order_rows + rows) * order_length
    index = starts[:, None] + np.arange(length)[None, :]
    return np.asarray(stream[index], dtype=np.int32)
