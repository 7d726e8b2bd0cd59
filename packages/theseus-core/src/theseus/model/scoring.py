"""How likely a continuation is under a GPT: the loglikelihoods evaluations ask for.

`loglikelihoods(model, params, pairs)` scores `(context, continuation)` token pairs: the
continuation's total log-probability given the context, and whether greedy decoding
from the context would produce it exactly. A pair longer than the context window keeps
its last `block_size + 1` tokens (the left of the context is cut, as evaluation
harnesses do), so every continuation token is predicted from the tokens just before
it. `rolling_windows` splits a document longer than the window into such pairs, each
token predicted once (a document's loglikelihood is the sum of its windows').

Pairs after the same context share it (the choices of a multiple-choice question): the
context is read once, a prefix, and each continuation but its last token follows it as
a branch that reads the prefix and itself, not the other branches (`GPT.__call__`'s
`prefixes`); the prefix's last position gives each pair's first continuation token's
log-probability (up to `SHARED` pairs a prefix), a branch its further tokens'. Where the
model's attention is a fused kernel, which serves packed segments but not shared
prefixes, only pairs of one-token continuations share their context.

Packing and compilation: these units (a prefix and its branches, or one pair's tokens)
are packed into rows of one width (best fit, longest first), several a row, each in its
own segments of the row (`GPT.__call__`'s `segments`: a unit attends only to itself,
its positions start at 0), so each pair's log-probabilities are those of its own
forward, and padding is what the packing leaves over. Rows go in batches of
`batch_size`. The width is a power of two (`_bucket`: at least `MIN_BUCKET`, at most
`block_size`) that holds the longest unit and is wide enough for the call's tokens to
fill one batch: a call of many short units (a multiple-choice task) packs them into rows
as wide as a document's windows, so one program of `[batch_size, block_size]` serves
both; a call of a few short units stays narrow. Every program compiled costs a fixed
time (about 0.3-0.6 s for a small GPT on a CPU), and a task compiles at most one per
call.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from theseus.errors import TheseusError
from theseus.model.attention.kernels import choose
from theseus.model.component import resolve_dtype
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
    model: Any,
    params: Any,
    tokens: jax.Array,
    segments: jax.Array,
    prefixes: jax.Array | None,
    targets: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """One forward of the packed rows `tokens [batch, width]` (`segments`, `prefixes`
    `[batch, width]`: see `GPT.__call__`); `[batch, width, SHARED]`: at each position
    `j`, the log-probability of each of `targets[:, j]` (the unit's next token, or at a
    prefix's last position each pair's first continuation token), and whether it is the
    argmax.
    """
    logits, _ = model.apply({"params": params}, tokens, segments=segments, prefixes=prefixes)
    wide = logits.astype(jnp.float32)
    norm = jax.nn.logsumexp(wide, axis=-1, keepdims=True)  # [batch, width, 1]
    picked = jnp.take_along_axis(wide, targets, axis=-1) - norm
    best = jnp.argmax(wide, axis=-1)[..., None] == targets
    return picked, best


#: the narrowest bucket: short rows cost little padded, and every program compiled costs
#: a fixed time (about 0.3 s for a small GPT on a CPU) that a task's rows must repay
MIN_BUCKET = 32


def _bucket(longest: int, block: int) -> int:
    """The padded width of a batch whose longest row fills `longest` positions."""
    return prompt_bucket(max(longest, min(MIN_BUCKET, block)), block)


def _pack(lengths: Sequence[int], width: int) -> list[list[int]]:
    """Rows of at most `width` positions holding the reads of `lengths` (indices into
    it), best fit, longest first: each read goes to the fullest row it fits in."""
    rows: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (free positions, row), sorted
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[index]
        at = bisect.bisect_left(room, (n, -1))
        if at < len(room):
            free, row = room.pop(at)
        else:
            free, row = width, len(rows)
            rows.append([])
        rows[row].append(index)
        if free > n:
            bisect.insort(room, (free - n, row))
    return rows


def _placed(params: Any, *arrays: np.ndarray) -> list[jax.Array | None]:
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


def _shares_prefixes(model: Any) -> bool:
    """Whether `model`'s attention reads shared prefixes as it is (the reference does; a
    fused kernel serves packed segments alone)."""
    config = model.config
    _, reason = choose(
        getattr(config, "attention", "auto"),
        q_len=int(config.block_size),
        kv_len=int(config.block_size),
        dtype=resolve_dtype(getattr(config, "dtype", "float32")),
        segmented=True,
        prefixed=True,
    )
    return reason is None


def _units(
    windows: Sequence[list[int]], lengths: Sequence[int], limit: int, share: bool
) -> list[tuple[list[int], list[int]]]:
    """`(prefix, members)` of at most `limit` positions each: pairs after one context
    (`windows[i][:-lengths[i]]`), up to `SHARED` of them, each member's branch
    (`windows[i][-lengths[i]:-1]`) after the prefix; without `share`, only pairs of
    one-token continuations (empty branches) share a prefix."""
    groups: dict[tuple[int, ...], list[int]] = {}
    units = []
    for index, (window, n) in enumerate(zip(windows, lengths, strict=True)):
        if share or n == 1:
            groups.setdefault(tuple(window[: len(window) - n]), []).append(index)
        else:
            units.append((window[: len(window) - n], [index]))
    for prefix, members in groups.items():
        unit: list[int] = []
        size = len(prefix)
        for index in members:
            branch = lengths[index] - 1
            if unit and (len(unit) == SHARED or size + branch > limit):
                units.append((list(prefix), unit))
                unit, size = [], len(prefix)
            unit.append(index)
            size += branch
        units.append((list(prefix), unit))
    return units


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
        width: pack rows of this many positions instead of the call's length bucket
            (one program for a fixed set of pairs scored again and again; at least the
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
    if not windows:
        return []
    lengths = [len(continuation) for _, continuation in pairs]
    longest = max(len(window) - 1 for window in windows)
    if width is not None and not longest <= width <= block:
        raise ScoringError(
            f"width {width} must hold the longest pair ({longest} positions) and fit the "
            f"model's context ({block})"
        )
    share = _shares_prefixes(model)
    units = _units(windows, lengths, width or block, share)
    sizes = [len(prefix) + sum(lengths[i] - 1 for i in members) for prefix, members in units]
    if width is None:
        width = _bucket(min(block, max(max(sizes), -(-sum(sizes) // batch_size))), block)
    rows = _pack(sizes, width)
    where: list[tuple[int, int]] = [(0, 0)] * len(units)  # (row, first position) of each unit
    pending = []
    for first in range(0, len(rows), batch_size):
        tokens = np.zeros((batch_size, width), np.int32)
        segments = np.zeros((batch_size, width), np.int32)  # 0: padding
        prefixes = np.zeros((batch_size, width), np.int32)
        targets = np.zeros((batch_size, width, SHARED), np.int32)
        for row, packed in enumerate(rows[first : first + batch_size]):
            at, segment = 0, 0
            for index in packed:
                prefix, members = units[index]
                where[index] = (first + row, at)
                segment += 1
                own = segment
                end = at + len(prefix)
                tokens[row, at:end] = prefix
                segments[row, at:end] = prefixes[row, at:end] = own
                targets[row, at : end - 1, 0] = prefix[1:]
                last = end - 1  # each pair's first target, in its slot
                for slot, pair in enumerate(members):
                    continuation = windows[pair][len(windows[pair]) - lengths[pair] :]
                    targets[row, last, slot] = continuation[0]
                    branch = continuation[:-1]
                    if branch:
                        if share:  # its own segment, reading the prefix
                            segment += 1
                        tokens[row, end : end + len(branch)] = branch
                        segments[row, end : end + len(branch)] = segment
                        prefixes[row, end : end + len(branch)] = own
                        targets[row, end : end + len(branch), 0] = continuation[1:]
                        end += len(branch)
                at = end
        placed = _placed(params, tokens, segments, prefixes, targets)
        if not share:  # one-token continuations alone share a context: no branch to read it
            placed[2] = None
        # Dispatched without waiting: the host packs the next batch while this one runs.
        pending.append(_score(model, params, *placed))
    fetched = jax.device_get(pending)
    picked = np.concatenate([p for p, _ in fetched])  # [rows (batches padded), width, SHARED]
    best = np.concatenate([b for _, b in fetched])
    results: list[tuple[float, bool]] = [(0.0, False)] * len(windows)
    for index, (prefix, members) in enumerate(units):
        row, at = where[index]
        last = at + len(prefix) - 1  # the prefix's last position: each pair's first target
        start = last + 1
        for slot, pair in enumerate(members):
            stop = start + lengths[pair] - 1  # the pair's branch: its further targets
            total = float(picked[row, last, slot]) + float(
                np.sum(picked[row, start:stop, 0], dtype=np.float64)
            )
            greedy = bool(best[row, last, slot]) and bool(best[row, start:stop, 0].all())
            results[pair] = (total, greedy)
            start = stop
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
