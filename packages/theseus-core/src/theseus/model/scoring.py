"""How likely a continuation is under a GPT: the loglikelihoods evaluations ask for.

`loglikelihoods(model, params, pairs)` scores `(context, continuation)` token pairs: the
continuation's total log-probability given the context, and whether greedy decoding
from the context would produce it exactly. A pair longer than the context window keeps
its last `block_size + 1` tokens (the left of the context is cut, as evaluation
harnesses do), so every continuation token is predicted from the tokens just before
it. `rolling_windows` splits a document longer than the window into such pairs, each
token predicted once (a document's loglikelihood is the sum of its windows').

Compilation: pairs are sorted by length and packed into batches of `batch_size` rows,
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


@functools.partial(jax.jit, static_argnums=0)
def _score(
    model: Any, params: Any, tokens: jax.Array, targets: jax.Array, weights: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Per row of `[batch, width]` ids: the summed log-probability of `targets` where
    `weights` is 1, and whether each of those targets is the argmax."""
    logits, _ = model.apply({"params": params}, tokens)
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    logprobs = picked - jax.nn.logsumexp(logits, axis=-1)
    total = jnp.sum(jnp.where(weights > 0, logprobs, 0.0), axis=-1)
    hits = (jnp.argmax(logits, axis=-1) == targets) | (weights == 0)
    return total, jnp.all(hits, axis=-1)


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
    order = sorted(range(len(windows)), key=lambda i: -len(windows[i]))  # longest first
    results: list[tuple[float, bool]] = [(0.0, False)] * len(windows)
    for first in range(0, len(order), batch_size):
        rows = order[first : first + batch_size]
        longest = max(len(windows[i]) - 1 for i in rows)
        if width is not None and not longest <= width <= block:
            raise ScoringError(
                f"width {width} must hold the longest pair ({longest} positions) and fit the "
                f"model's context ({block})"
            )
        padded = width if width is not None else _bucket(longest, block)
        tokens = np.zeros((batch_size, padded), np.int32)
        targets = np.zeros((batch_size, padded), np.int32)
        weights = np.zeros((batch_size, padded), np.float32)
        for row, index in enumerate(rows):
            window, scored = windows[index], lengths[index]
            n = len(window) - 1
            tokens[row, :n], targets[row, :n] = window[:-1], window[1:]
            weights[row, n - scored : n] = 1.0
        total, greedy = jax.device_get(
            _score(model, params, *_placed(params, tokens, targets, weights))
        )
        for row, index in enumerate(rows):
            results[index] = (float(total[row]), bool(greedy[row]))
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
