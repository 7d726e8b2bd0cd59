"""The language-model loss computed chunk by chunk, never holding float32 `[batch, seq, vocab]`.

`chunked_cross_entropy` takes the final hidden states `h [batch, seq, n_embd]` and the
unembedding matrix and returns what `cross_entropy(logits, targets, mask)` of
`theseus.model.models` returns for `logits = h @ unembedding`: the mean over counted
targets and their count. When the tokens exceed one chunk, the positions are cut into
chunks of every row and `per` positions and `lax.scan` runs over the chunks. Under
differentiation (a `jax.custom_vjp`) each chunk's pass makes its logits once and at once
their gradient, `softmax - one_hot`, and its two products: the gradient with respect to
the chunk's `h` (kept, `[batch, per, n_embd]`) and with respect to the unembedding
(summed over chunks in float32); the backward only scales what the forward kept by the
loss's cotangent. So the backward recomputes no logits: three products with the
unembedding in all, as the plain loss's autodiff makes. Without differentiation (the
validation step) the scan makes only the logits. At most one chunk's logits
`[batch, per, vocab]` (and their gradient) exist at a time; rows stay whole, so under
data parallelism each device holds its rows' share of a chunk. A batch that fits in one
chunk takes the plain computation, operation for operation `cross_entropy`'s. Forward-
mode differentiation (`jax.jvp`) of a chunked loss is not supported (a custom_vjp).

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

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax.linen.dtypes import promote_dtype

from theseus.model._errors import ModelInputError

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


#: The earlier name of ModelInputError (arrays of the wrong shape for the loss, or a
#: negative chunk size), kept for old imports: no caller told the two apart.
LossInputError = ModelInputError


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
        raise ModelInputError(
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
    """The vocabulary size; raises `ModelInputError` for shapes that do not fit together."""
    if h.ndim != 3 or targets.shape != h.shape[:2]:
        raise ModelInputError(
            f"expected h [batch, seq, n_embd] and targets [batch, seq], got h "
            f"{list(h.shape)} and targets {list(targets.shape)}; pass the final hidden "
            "states and one target id per position"
        )
    width = h.shape[-1]
    want = "[vocab, n_embd] (the tied embedding)" if tied else "[n_embd, vocab] (lm_head)"
    vocab = unembedding.shape[0 if tied else -1] if unembedding.ndim == 2 else 0
    if unembedding.ndim != 2 or unembedding.shape[1 if tied else 0] != width:
        raise ModelInputError(
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
        ModelInputError: shapes that do not fit together, or `chunk < 0`.
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

    chunks = -(-length // per)
    total = _fused_total(h, unembedding, labels, valid, tied, dtype, chunks, per)
    return total / jnp.maximum(count, 1), count


def _logits_and_grad(
    h: jax.Array,
    unembedding: jax.Array,
    labels: jax.Array,
    valid: jax.Array,
    tied: bool,
    dtype: Any,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One chunk: its summed loss, and the gradients of that sum with respect to the chunk's
    `h [batch, per, n_embd]` (in `h`'s dtype) and to the unembedding (float32).

    The logits' gradient is `softmax - one_hot(label)` where counted (0 elsewhere), cast to
    the logits' dtype as autodiff's cast would; both products then take it as one operand.
    """
    h_cast, matrix = promote_dtype(h, unembedding, dtype=dtype)
    logits = unembed(h_cast, matrix, tied=tied, dtype=None)  # [batch, per, vocab]
    wide = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(wide, axis=-1)
    picked = jnp.take_along_axis(wide, labels[..., None], axis=-1)[..., 0]
    total = jnp.where(valid, lse - picked, 0.0).sum()
    # softmax - one_hot where counted, as one elementwise chain (nothing of [batch, per,
    # vocab] is made but the result, in the logits' dtype)
    probs = jnp.exp(wide - lse[..., None])
    hit = jnp.arange(wide.shape[-1]) == labels[..., None]
    d_logits = jnp.where(valid[..., None], jnp.where(hit, probs - 1.0, probs), 0.0)
    d_logits = d_logits.astype(logits.dtype)
    if tied:  # logits = h @ E.T: dh = d @ E, dE = d.T @ h
        d_h = jnp.dot(d_logits, matrix)
        d_matrix = jnp.einsum("bpv,bpc->vc", d_logits, h_cast, preferred_element_type=jnp.float32)
    else:  # logits = h @ K: dh = d @ K.T, dK = h.T @ d
        d_h = jnp.dot(d_logits, matrix.T)
        d_matrix = jnp.einsum("bpc,bpv->cv", h_cast, d_logits, preferred_element_type=jnp.float32)
    return total, d_h.astype(h.dtype), d_matrix


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _fused_total(
    h: jax.Array,
    unembedding: jax.Array,
    labels: jax.Array,
    valid: jax.Array,
    tied: bool,
    dtype: Any,
    chunks: int,
    per: int,
) -> jax.Array:
    """The summed loss over `chunks` chunks of `per` positions (a scan; no gradient kept)."""
    xs = tuple(_chunked(x, chunks, per) for x in (h, labels, valid))

    def body(carry: jax.Array, x: tuple[jax.Array, ...]) -> tuple[jax.Array, None]:
        h_chunk, labels_chunk, valid_chunk = x
        logits = unembed(h_chunk, unembedding, tied=tied, dtype=dtype)
        return carry + _total(logits, labels_chunk, valid_chunk), None

    total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), xs)
    return total


def _fused_forward(
    h: jax.Array,
    unembedding: jax.Array,
    labels: jax.Array,
    valid: jax.Array,
    tied: bool,
    dtype: Any,
    chunks: int,
    per: int,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """The summed loss and, chunk by chunk, its gradients: each chunk's logits are made once
    and dropped (nothing is recomputed in the backward, which only scales)."""
    xs = tuple(_chunked(x, chunks, per) for x in (h, labels, valid))
    width = unembedding.shape

    def body(
        carry: tuple[jax.Array, jax.Array], x: tuple[jax.Array, ...]
    ) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
        total, d_matrix = carry
        h_chunk, labels_chunk, valid_chunk = x
        chunk_total, d_h, d_chunk = _logits_and_grad(
            h_chunk, unembedding, labels_chunk, valid_chunk, tied, dtype
        )
        return (total + chunk_total, d_matrix + d_chunk), d_h

    start = (jnp.zeros((), jnp.float32), jnp.zeros(width, jnp.float32))
    (total, d_matrix), d_hs = jax.lax.scan(body, start, xs)  # d_hs [chunks, batch, per, n_embd]
    d_h = jnp.moveaxis(d_hs, 0, 1).reshape(h.shape[0], chunks * per, h.shape[-1])
    return total, (d_h[:, : h.shape[1]], d_matrix.astype(unembedding.dtype))


def _fused_backward(
    tied: bool,
    dtype: Any,
    chunks: int,
    per: int,
    saved: tuple[jax.Array, jax.Array],
    g: jax.Array,
) -> tuple[jax.Array, jax.Array, None, None]:
    """The saved gradients times the cotangent of the summed loss."""
    d_h, d_matrix = saved
    return (g * d_h).astype(d_h.dtype), (g * d_matrix).astype(d_matrix.dtype), None, None


_fused_total.defvjp(_fused_forward, _fused_backward)
