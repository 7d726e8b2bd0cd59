"""How likely a continuation is under a GPT: the loglikelihoods evaluations ask for.

`loglikelihoods(model, params, pairs)` scores `(context, continuation)` token pairs: the
continuation's total log-probability given the context, and whether greedy decoding
from the context would produce it exactly. A pair longer than the context window keeps
its last `block_size + 1` tokens (the left of the context is cut, as evaluation
harnesses do), so every continuation token is predicted from the tokens just before
it. `rolling_windows` splits a document longer than the window into such pairs, each
token predicted once (a document's loglikelihood is the sum of its windows').

Pairs that read the same tokens (the context and all but the continuation's last
token), such as the one-token answers of a multiple-choice question, share one row of
one forward: the row gives the log-probability of its own next tokens and of up to
`SHARED` candidates for the token after it.

Compilation: rows are sorted by length and packed into batches of `batch_size` rows,
right-padded to the length rounded up to a power of two (at least `MIN_BUCKET`, at
most `block_size`), so a task compiles one program per length bucket, not one per
request.
Right padding leaves each row's real positions exactly as they are alone (attention is
causal and positions start at 0); padded positions weigh 0.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from theseus.errors import TheseusError
from theseus.model.generation import prompt_bucket

__all__ = ["ScoringError", "loglikelihoods", "rolling_windows"]


class ScoringError(TheseusError, ValueError):
    """Pairs or settings that cannot be scored."""


#: the most continuations that share one row (pairs whose tokens differ only in the last
#: continuation token: the choices of a multiple-choice question of one-token answers);
#: a larger group takes more rows
SHARED = 8


@functools.partial(jax.jit, static_argnums=0)
def _score(
    model: Any, params: Any, tokens: jax.Array, last: jax.Array, choices: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """One forward of `tokens [batch, width]`; per row:

    - `[batch, width]` the log-probability, at each position `j`, of the row's next
      token `tokens[j + 1]`, and whether it is the argmax there;
    - `[batch, SHARED]` at position `last`, the log-probability of each of `choices`
      (the candidates for the token after the row's last), and whether it is the argmax.
    """
    logits, _ = model.apply({"params": params}, tokens)
    wide = logits.astype(jnp.float32)
    norm = jax.nn.logsumexp(wide, axis=-1)  # [batch, width]
    following = jnp.concatenate([tokens[:, 1:], tokens[:, :1]], axis=1)  # the last: unused
    picked = jnp.take_along_axis(wide, following[..., None], axis=-1)[..., 0] - norm
    hits = jnp.argmax(wide, axis=-1) == following
    rows = jnp.arange(tokens.shape[0])
    at_last = wide[rows, last]  # [batch, vocab]
    chosen = jnp.take_along_axis(at_last, choices, axis=-1) - norm[rows, last][:, None]
    best = jnp.argmax(at_last, axis=-1)[:, None] == choices
    return picked, hits, chosen, best


#: the narrowest bucket: short rows cost little padded, and every program compiled costs
#: a fixed time (about 0.3 s for a small GPT on a CPU) that a task's rows must repay
MIN_BUCKET = 32


def _bucket(longest: int, block: int) -> int:
    """The padded width of a batch whose longest row fills `longest` positions."""
    return prompt_bucket(max(longest, min(MIN_BUCKET, block)), block)


def _placed(params: Any, *arrays: np.ndarray) -> list[jax.Array]:
    """`arrays` replicated over the devices of `params`' mesh (every process of a cluster
    holds the same rows), or on the default device when `params` have no mesh."""
    sharding = getattr(jax.tree.leaves(params)[0], "sharding", None)
    if isinstance(sharding, NamedSharding):
        replicated = NamedSharding(sharding.mesh, PartitionSpec())
        return [jax.device_put(array, replicated) for array in arrays]
    return [jnp.asarray(array) for array in arrays]


def _window(context: Sequence[int], continuation: Sequence[int], block: int) -> list[int]:
    """The tokens of one pair the model reads and predicts: at most `block + 1`."""
    if not continuation:
        raise ScoringError("a continuation to score has no tokens; give at least one")
    if not context:
        raise ScoringError(
            "a continuation's context has no tokens; give at least one (evaluation "
            "harnesses put the end-of-text token before a continuation without context)"
        )
    if len(continuation) > block:
        raise ScoringError(
            f"a continuation of {len(continuation)} tokens is longer than the model's "
            f"context, architecture/block_size = {block}; score it in windows "
            "(rolling_windows)"
        )
    return [*context, *continuation][-(block + 1) :]


def loglikelihoods(
    model: Any,
    params: Any,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    batch_size: int = 8,
    width: int | None = None,
) -> list[tuple[float, bool]]:
    """Each continuation's log-probability given its context, and whether it is greedy.

    Args:
        model: a GPT (its `config.block_size` is the window).
        params: its parameters (`state.params`, laid out as the trainer lays them out).
        pairs: `(context, continuation)` token ids; neither may be empty.
        batch_size: rows per compiled call (the last batch is padded with empty rows).
        width: pad every batch to this many positions instead of its length bucket (one
            program for a fixed set of pairs scored again and again; at least the
            longest pair's, at most `block_size`).

    Returns:
        `(loglikelihood, is_greedy)` per pair, in the order given.

    Raises:
        ScoringError: an empty context or continuation, a continuation longer than the
            window, or a batch size below 1.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ScoringError(f"batch_size must be a positive int; got {batch_size!r}")
    block = int(model.config.block_size)
    windows = [_window(context, continuation, block) for context, continuation in pairs]
    lengths = [len(continuation) for _, continuation in pairs]
    # Pairs that read the same tokens share one row: only their last target differs.
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, window in enumerate(windows):
        groups.setdefault(tuple(window[:-1]), []).append(index)
    shared = [
        (read, members[first : first + SHARED])
        for read, members in groups.items()
        for first in range(0, len(members), SHARED)
    ]
    shared.sort(key=lambda row: -len(row[0]))  # longest first
    pending = []
    for first in range(0, len(shared), batch_size):
        batch = shared[first : first + batch_size]
        longest = len(batch[0][0])
        if width is not None and not longest <= width <= block:
            raise ScoringError(
                f"width {width} must hold the longest pair ({longest} positions) and fit the "
                f"model's context ({block})"
            )
        padded = width if width is not None else _bucket(longest, block)
        tokens = np.zeros((batch_size, padded), np.int32)
        last = np.zeros(batch_size, np.int32)
        choices = np.zeros((batch_size, SHARED), np.int32)
        for row, (read, members) in enumerate(batch):
            tokens[row, : len(read)] = read
            last[row] = len(read) - 1
            choices[row, : len(members)] = [windows[i][-1] for i in members]
        # Dispatched without waiting: the host packs the next batch while this one runs.
        pending.append((batch, _score(model, params, *_placed(params, tokens, last, choices))))
    results: list[tuple[float, bool]] = [(0.0, False)] * len(windows)
    for batch, outputs in pending:
        picked, hits, chosen, best = jax.device_get(outputs)
        for row, (read, members) in enumerate(batch):
            n = len(read)
            for slot, index in enumerate(members):
                start = n - lengths[index]  # the first position whose target is scored
                total = float(np.sum(picked[row, start : n - 1], dtype=np.float64))
                greedy = bool(hits[row, start : n - 1].all()) and bool(best[row, slot])
                results[index] = (total + float(chosen[row, slot]), greedy)
    return results


def rolling_windows(
    tokens: Sequence[int], prefix: int, block: int
) -> list[tuple[list[int], list[int]]]:
    """A document's `(context, continuation)` pairs: every token predicted exactly once.

    The first window predicts the first `block` tokens from `prefix` (the end-of-text
    token) and the tokens before each; every later window predicts the next `block`
    tokens (fewer at the end), each from the `block` tokens before it. The pairs are
    the ones lm-evaluation-harness's models score for `loglikelihood_rolling` (its
    rolling windows with a context of one token, made disjoint).

    Args:
        tokens: the document's token ids.
        prefix: the token the first one is predicted from.
        block: the model's context, `architecture/block_size`.
    """
    if block < 1:
        raise ScoringError(f"block must be a positive int; got {block!r}")
    tokens = list(tokens)
    pairs: list[tuple[list[int], list[int]]] = []
    done = 0
    while done < len(tokens):
        end = min(len(tokens), done + block)
        if done == 0:  # everything before each token, from the prefix on
            pairs.append(([prefix], tokens[:end]))
        else:  # the window reads block tokens ending just before the last one predicted
            read = tokens[max(0, end - block - 1) : end - 1]
            pairs.append((read[: len(read) - (end - done - 1)], tokens[done:end]))
        done = end
    return pairs
