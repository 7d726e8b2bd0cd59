"""The language-model loss computed chunk by chunk, never holding float32 `[batch, seq, vocab]`.

`chunked_cross_entropy` takes the final hidden states `h [batch, seq, n_embd]` and the
unembedding matrix and returns what `cross_entropy(logits, targets, mask)` of
`theseus.model.models` returns for `logits = h @ unembedding`: the mean over counted
targets and their count. When the tokens exceed one chunk, the positions are cut into
chunks of every row and `per` positions; `lax.scan` runs over the chunks, and each
chunk's body is under `jax.checkpoint`, so the forward keeps only the chunk's inputs
(slices of `h`) and the backward recomputes the chunk's logits. At most one chunk's
logits `[batch, per, vocab]` (and their gradient) exist at a time; rows stay whole, so
under data parallelism each device holds its rows' share of a chunk. A batch that fits
in one chunk takes the plain computation, operation for operation `cross_entropy`'s.

`GPT.__call__` computes its loss here, from `ln_f`'s output and the unembedding weights
(not from the logits it returns): a caller that drops the logits (the trainer's
`train_step` and `val_step`) lets XLA remove them. Chunk size: `training/loss_chunk`.

Example:
    >>> import jax.numpy as jnp
    >>> from theseus.model import cross_entropy
    >>> h = jnp.ones((2, 5, 4)) / 4
    >>> embedding = jnp.eye(8, 4)  # tied: [vocab, n_embd]
    >>> targets = jnp.array([[0, 1, 2, 3, -1], [4, 5, 6, 7, 0]])
    >>> loss, count = chunked_cross_entropy(  # 3 chunks of 2 positions of both rows
    ...     h, embedding, targets, tied=True, dtype=jnp.float32, chunk=4
    ... )
    >>> plain, _ = cross_entropy(h @ embedding.T, targets)
    >>> round(float(loss), 4), int(count), bool(abs(loss - plain) < 1e-6)
    (2.0733, 9, True)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax.linen.dtypes import promote_dtype

from theseus.errors import TheseusError

__all__ = [
    "LOGITS_PER_CHUNK",
    "LossInputError",
    "chunk_length",
    "chunked_cross_entropy",
    "unembed",
]

#: The default chunk (`training/loss_chunk = 0`) holds at most this many logits: 256 MiB
#: in float32 (for GPT-2's vocabulary of 50,257 padded to 50,304: 1,334 tokens).
LOGITS_PER_CHUNK = 2**26


class LossInputError(TheseusError, ValueError):
    """Arrays of the wrong shape for the loss, or a negative chunk size."""


def unembed(h: jax.Array, unembedding: jax.Array, *, tied: bool, dtype: Any) -> jax.Array:
    """Logits `[..., vocab]` of `h [..., n_embd]`, as the model's output head computes them.

    Both arrays are cast to `dtype` first (flax's `promote_dtype`; `None` promotes).
    Tied, `unembedding` is the embedding `[vocab, n_embd]` and the logits are
    `h @ unembedding.T` (`nn.Embed.attend`); untied, it is `lm_head`'s kernel
    `[n_embd, vocab]` and they are `h @ unembedding` (`nn.Dense` without bias).
    """
    h, unembedding = promote_dtype(h, unembedding, dtype=dtype)
    if tied:
        return jnp.dot(h, unembedding.T)
    return jax.lax.dot_general(h, unembedding, (((h.ndim - 1,), (0,)), ((), ())))


def chunk_length(rows: int, length: int, vocab: int, chunk: int = 0) -> int:
    """Positions per chunk: `length` when `rows x length` tokens fit in one chunk.

    A chunk is every row at `per` consecutive positions (rows stay whole, so a batch
    split over devices by rows stays split). `chunk` is the most tokens a chunk may hold
    (`rows x per`; one position of every row when the rows alone are more); 0 means as
    many as keep its logits within `LOGITS_PER_CHUNK`. The positions are shared out
    evenly: `per = ceil(length / chunks)`, so the last chunk's padding is less than
    `chunks` positions.

    Example:
        >>> chunk_length(4, 1024, 50_304)  # 1,334 tokens: 333 positions, 4 chunks of 256
        256
        >>> chunk_length(4, 13, 258, chunk=16), chunk_length(4, 13, 258)
        (4, 13)
    """
    if chunk < 0:
        raise LossInputError(
            f"expected a loss chunk of >= 0 tokens, got {chunk}; use 0 for chunks of "
            f"{LOGITS_PER_CHUNK} logits or a positive number of tokens"
        )
    tokens = chunk or max(1, LOGITS_PER_CHUNK // vocab)
    per = max(1, tokens // max(rows, 1))
    if per >= length:
        return length
    chunks = -(-length // per)
    return -(-length // chunks)


def _check(h: jax.Array, unembedding: jax.Array, targets: jax.Array, tied: bool) -> int:
    """The vocabulary size; raises `LossInputError` for shapes that do not fit together."""
    if h.ndim != 3 or targets.shape != h.shape[:2]:
        raise LossInputError(
            f"expected h [batch, seq, n_embd] and targets [batch, seq], got h "
            f"{list(h.shape)} and targets {list(targets.shape)}; pass the final hidden "
            "states and one target id per position"
        )
    width = h.shape[-1]
    want = "[vocab, n_embd] (the tied embedding)" if tied else "[n_embd, vocab] (lm_head)"
    vocab = unembedding.shape[0 if tied else -1] if unembedding.ndim == 2 else 0
    if unembedding.ndim != 2 or unembedding.shape[1 if tied else 0] != width:
        raise LossInputError(
            f"expected the unembedding {want} with n_embd = {width}, got "
            f"{list(unembedding.shape)}; pass tied={not tied} if the matrix is the other one"
        )
    return int(vocab)


def _total(logits: jax.Array, labels: jax.Array, valid: jax.Array) -> jax.Array:
    """The summed cross-entropy (float32 nats) of `logits [..., vocab]` where `valid`."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    return jnp.where(valid, losses, 0.0).sum()


def _chunked(x: jax.Array, chunks: int, per: int) -> jax.Array:
    """`x [batch, seq, ...]` zero-padded to `chunks x per` positions: `[chunks, batch, per, ...]`."""
    pad = [(0, 0), (0, chunks * per - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
    x = jnp.pad(x, pad)
    return jnp.moveaxis(x.reshape(x.shape[0], chunks, per, *x.shape[2:]), 1, 0)


def chunked_cross_entropy(
    h: jax.Array,
    unembedding: jax.Array,
    targets: jax.Array,
    mask: jax.Array | None = None,
    *,
    tied: bool,
    dtype: Any,
    chunk: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """Mean cross-entropy of `unembed(h, unembedding)` over targets that are not `-1`.

    The same numbers as `cross_entropy(unembed(h, ...), targets, mask)`, computed
    without the float32 logits of the whole batch (module docstring).

    Args:
        h: final hidden states `[batch, seq, n_embd]`.
        unembedding: tied, the embedding `[vocab, n_embd]`; else the kernel
            `[n_embd, vocab]`.
        targets: `[batch, seq]` int; `-1` is not counted.
        mask: `[batch, seq]`, counted only where true (optional).
        tied: which matrix `unembedding` is.
        dtype: the activation dtype both are cast to before the product.
        chunk: most tokens per chunk (see `chunk_length`); 0: `LOGITS_PER_CHUNK` logits.

    Returns:
        `(mean_loss, count)`: float32 nats over counted positions (0 when none), and how
        many counted.

    Raises:
        LossInputError: shapes that do not fit together, or `chunk < 0`.
    """
    vocab = _check(h, unembedding, targets, tied)
    rows, length = targets.shape
    valid = targets >= 0
    if mask is not None:
        valid = valid & mask.astype(bool)
    labels = jnp.where(valid, targets, 0)
    count = valid.sum()
    per = chunk_length(rows, length, vocab, chunk)
    if per == length:
        total = _total(unembed(h, unembedding, tied=tied, dtype=dtype), labels, valid)
        return total / jnp.maximum(count, 1), count

    def chunk_total(matrix: jax.Array, xs: tuple[jax.Array, ...]) -> jax.Array:
        h_chunk, labels_chunk, valid_chunk = xs  # [batch, per, n_embd], [batch, per] x 2
        logits = unembed(h_chunk, matrix, tied=tied, dtype=dtype)
        return _total(logits, labels_chunk, valid_chunk)

    recomputed = jax.checkpoint(chunk_total, prevent_cse=False)  # keeps only its inputs
    chunks = -(-length // per)
    xs = tuple(_chunked(x, chunks, per) for x in (h, labels, valid))
    _, totals = jax.lax.scan(lambda carry, x: (carry, recomputed(unembedding, x)), None, xs)
    return totals.sum() / jnp.maximum(count, 1), count
