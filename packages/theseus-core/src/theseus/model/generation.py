"""Sampling from a GPT with a key-value cache: one prefill, then one compiled step a token.

A batch of prompts of different lengths is left-padded to one length, so every row
writes its next token into the same cache slot. Row `b`'s real tokens start at slot
`start[b]`; its token at slot `s` is at rotary position `s - start[b]` and attends
only to slots `start[b] .. s`, so each row computes exactly what it would alone (see
`SelfAttention`).

Compilation: the prefill is compiled once per (batch, prompt bucket), the prompt
length rounded up to a power of two (at least 8, at most what the context leaves);
the decode step, which also picks the next token, once per batch size and sampling
mode (greedy, top-k, nucleus), over a cache of `block_size` slots, and reused for every
token of every prompt. The caches are donated to the step, so decoding updates them in
place, and the new tokens stay on the device until the end (unless `on_token` streams
them), so the host never waits for a step.

Weights: a model with a 16-bit activation dtype decodes from a copy of its float32
matrices in that dtype (`decoding_params`): each matmul casts them so anyway, so the
tokens are the same, and a step at a small batch, which reads every weight once a
token, reads half the bytes. The copy is skipped where it would not fit on the device.

Sampling: temperature 0 is greedy (argmax). Otherwise the logits are divided by the
temperature, cut to the `top_k` largest and to the smallest set whose probability
reaches `top_p` (never fewer than the most likely token), and each prompt draws from a stream of its own (`prompt_keys`): the
key folded with a digest of the prompt's token ids and with how many equal prompts
come before it in the list; its token `n` is drawn with `fold_in(stream, n)`. So a
prompt's tokens depend on the key, the prompt and the settings only: the same alone
as in any batch, at any position and under any padding (a repeated prompt gets a
fresh stream each time it repeats).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from theseus.errors import TheseusError

__all__ = ["GenerationError", "decoding_params", "generate", "prompt_bucket", "prompt_keys"]

logger = logging.getLogger(__name__)


class GenerationError(TheseusError, ValueError):
    """Generation settings or prompts that cannot be honoured."""


def prompt_bucket(longest: int, room: int) -> int:
    """The padded prompt length: `longest` rounded up to a power of two (>= 8), <= `room`."""
    bucket = max(8, 1 << max(0, math.ceil(math.log2(max(longest, 1)))))
    return max(longest, min(bucket, room))


def prompt_keys(key: jax.Array, prompts: Sequence[Sequence[int]]) -> jax.Array:
    """Each prompt's own sampling stream: `[len(prompts)]` keys, one a prompt.

    Prompt `p` gets `fold_in(fold_in(key, digest(p)), k)`, where `digest(p)` is the
    first 31 bits of the BLAKE2b digest of its token ids (as little-endian int64) and
    `k` counts the prompts equal to `p` before it in `prompts`. The stream depends on
    the key and the prompt, not on the batch it is in, its row or its padding.

    Args:
        key: the sampling key.
        prompts: token ids, one list per prompt.

    Returns:
        The keys, stacked (one compiled `_pick` serves every batch of this size).
    """
    seen: dict[bytes, int] = {}
    digests, repeats = [], []
    for prompt in prompts:
        ids = np.asarray(prompt, np.int64).astype("<i8").tobytes()
        digest = int.from_bytes(hashlib.blake2b(ids, digest_size=4).digest(), "little")
        repeats.append(seen.get(ids, 0))
        seen[ids] = repeats[-1] + 1
        digests.append(digest & 0x7FFFFFFF)
    return _fold_twice(key, np.asarray(digests, np.int32), np.asarray(repeats, np.int32))


@jax.jit
def _fold_twice(key: jax.Array, digests: jax.Array, repeats: jax.Array) -> jax.Array:
    """`fold_in(fold_in(key, digest), repeat)` for each pair, in one call (folding prompt
    by prompt dispatched two operations each: a batch of 64 prompts took 0.3 s)."""
    return jax.vmap(lambda d, r: jax.random.fold_in(jax.random.fold_in(key, d), r))(
        digests, repeats
    )


@functools.partial(jax.jit, static_argnums=(0, 4))
def _prefill(model: Any, params: Any, tokens: jax.Array, start: jax.Array, slots: int) -> Any:
    cache = model.empty_cache(tokens.shape[0], slots, start)
    logits, cache = model.apply({"params": params}, tokens, cache=cache)
    return logits[:, -1], cache


@functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
def _step(model: Any, params: Any, cache: Any, token: jax.Array) -> Any:
    logits, cache = model.apply({"params": params}, token[:, None], cache=cache)
    return logits[:, 0], cache


@functools.lru_cache(maxsize=32)
def _decoder(model: Any, greedy: bool, top_k: int | None, nucleus: bool) -> Any:
    """The compiled decode step for `model` and a sampling mode: `_step`, then `_pick`.

    `step(params, cache, token, keys, n, temperature, top_p, allowed)` returns the next
    token (`[batch]` int32, drawn as token `n`), the cache (donated) and `n + 1`, so a
    loop passes arrays only: nothing is hashed or sent from the host per token.
    """

    @functools.partial(jax.jit, donate_argnums=1)
    def step(
        params: Any,
        cache: Any,
        token: jax.Array,
        keys: jax.Array,
        n: jax.Array,
        temperature: jax.Array,
        top_p: jax.Array,
        allowed: jax.Array,
    ) -> tuple[jax.Array, Any, jax.Array]:
        logits, cache = _step(model, params, cache, token)
        picked = _pick(
            logits, keys, n, temperature, top_p, allowed,
            greedy=greedy, top_k=top_k, nucleus=nucleus,
        )  # fmt: skip
        return picked, cache, n + 1

    return step


@functools.partial(jax.jit, static_argnames=("greedy", "top_k", "nucleus"))
def _pick(
    logits: jax.Array,
    keys: jax.Array,
    n: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    allowed: jax.Array,
    *,
    greedy: bool,
    top_k: int | None,
    nucleus: bool,
) -> jax.Array:
    """The next token of each row (`[batch]` int32) from its logits `[batch, vocab]`.

    Row `b` draws its token `n` with `fold_in(keys[b], n)`, one row at a time (`vmap`),
    so its draw does not depend on the other rows. Only ids below `allowed` are drawn
    (a traced bound: no program per value).
    """
    logits = logits.astype(jnp.float32)
    logits = jnp.where(jnp.arange(logits.shape[-1]) < allowed, logits, -jnp.inf)
    if greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / temperature
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if nucleus:
        ordered = jnp.sort(logits, axis=-1)[:, ::-1]
        before = jnp.cumsum(jax.nn.softmax(ordered, axis=-1), axis=-1) - jax.nn.softmax(
            ordered, axis=-1
        )  # probability of the tokens ranked above each one
        # the most likely token always stays (a top_p below float32's range rounds to 0)
        keep = (before < top_p) | (jnp.arange(ordered.shape[-1]) == 0)
        kept = jnp.where(keep, ordered, jnp.inf).min(axis=-1, keepdims=True)
        logits = jnp.where(logits < kept, -jnp.inf, logits)

    def draw(key: jax.Array, row: jax.Array) -> jax.Array:
        return jax.random.categorical(jax.random.fold_in(key, n), row)

    return jax.vmap(draw)(keys, logits).astype(jnp.int32)


def _check(
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    vocab: int,
    block_size: int,
) -> None:
    if isinstance(prompts, str | bytes) or not len(prompts):
        raise GenerationError(
            f"prompts must be a non-empty list of token-id lists; got {prompts!r}. Pass "
            "[[id, ...], ...] (a trainer's generate() also takes strings)."
        )
    for prompt in prompts:
        ids = np.asarray(prompt)
        if ids.ndim != 1 or not len(ids) or not np.issubdtype(ids.dtype, np.integer):
            raise GenerationError(
                f"each prompt must be a non-empty list of token ids; got {prompt!r}"
            )
        if ids.min() < 0 or ids.max() >= vocab:
            raise GenerationError(
                f"prompt token ids must lie in [0, {vocab}) (architecture/vocab_size); got "
                f"ids from {int(ids.min())} to {int(ids.max())}"
            )
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 1
    ):
        raise GenerationError(f"max_new_tokens must be a positive int; got {max_new_tokens!r}")
    longest = max(len(p) for p in prompts)
    if longest >= block_size:
        raise GenerationError(
            f"the longest prompt is {longest} tokens and the model's context "
            f"(architecture/block_size) is {block_size}, which leaves no room for a new "
            f"token; keep the prompt under {block_size} tokens (its last {block_size - 1}, say)"
        )
    if longest + max_new_tokens > block_size:
        raise GenerationError(
            f"the longest prompt ({longest} tokens) plus max_new_tokens ({max_new_tokens}) "
            f"exceeds the model's context, architecture/block_size = {block_size}; shorten "
            f"the prompt or ask for at most {block_size - longest} new tokens"
        )
    if not temperature >= 0:
        raise GenerationError(f"temperature must be >= 0 (0: greedy); got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise GenerationError(f"top_k must be a positive int or None; got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise GenerationError(f"top_p must be in (0, 1] or None; got {top_p!r}")


def _device_free(device: Any) -> int | None:
    """`device`'s free memory; None where it does not say (a CPU)."""
    stats = device.memory_stats()
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def _free_bytes(leaf: jax.Array) -> int | None:
    """Free memory on the first device holding `leaf`, the least over the processes (so
    that every host decides alike and compiles the same decode); None where the device
    does not say."""
    free = _device_free(leaf.addressable_shards[0].device)
    if free is None:
        return None
    if jax.process_count() > 1:  # in MiB: JAX gathers int32 unless x64 is on
        from jax.experimental import multihost_utils

        mib = multihost_utils.process_allgather(np.asarray([free >> 20], np.int32))
        free = int(np.min(mib)) << 20
    return free


def _dtype(leaf: Any) -> np.dtype:
    return np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.result_type(leaf)


@functools.lru_cache(maxsize=64)
def _cast_dtypes(model: Any, tree: Any, avals: tuple[Any, ...]) -> tuple[Any, ...]:
    """For each leaf of a tree with these shapes and dtypes: the dtype
    `model.decoding_params` gives it, None where it stays (one trace per tree)."""
    shapes = jax.eval_shape(
        model.decoding_params,
        jax.tree.unflatten(tree, [jax.ShapeDtypeStruct(s, d) for s, d in avals]),
    )
    return tuple(
        None if t.dtype == d else t.dtype
        for (_, d), t in zip(avals, jax.tree.leaves(shapes), strict=True)
    )


def decoding_params(model: Any, params: Any) -> Any:
    """`params` as `generate` decodes with them: `model.decoding_params(params)` (a
    `GPT`: its float32 matrices in a 16-bit activation dtype, the same logits bit for
    bit from half the bytes), where the model has it and the copy fits; else `params`.

    The copy fits when a device's free memory is at least twice the part of it that
    device holds (the cache and the activations need room too); where the device does
    not report its memory (a CPU), it is made. Params already so cast are returned as
    they are, without a copy, so a caller decoding many batches can cast once.
    """
    cast = getattr(model, "decoding_params", None)
    if cast is None:
        return params
    leaves, tree = jax.tree.flatten(params)
    dtypes = _cast_dtypes(model, tree, tuple((np.shape(a), _dtype(a)) for a in leaves))
    changed = [(a, t) for a, t in zip(leaves, dtypes, strict=True) if t is not None]
    if not changed:
        return params
    if all(isinstance(a, jax.Array) for a, _ in changed):
        extra = sum(a.addressable_shards[0].data.size * np.dtype(t).itemsize for a, t in changed)
        free = _free_bytes(changed[0][0])
        if free is not None and free < 2 * extra:
            if "memory" not in _SAID:
                _SAID.add("memory")
                logger.warning(
                    "generate: decoding from the float32 weights: their %.2f GiB copy in the "
                    "activation dtype would leave too little of the %.2f GiB free",
                    extra / 2**30,
                    free / 2**30,
                )
            return params
    return cast(params)


_SAID: set[str] = set()  # what generate has said once


def _slots(asked: int | None, needed: int, block_size: int) -> int:
    """The cache's positions: `asked`, checked to lie in `[needed, block_size]`, or the context."""
    if asked is None:
        return block_size
    if isinstance(asked, bool) or not isinstance(asked, int) or not needed <= asked <= block_size:
        raise GenerationError(
            f"cache_slots must be an int from {needed} (the longest prompt plus "
            f"max_new_tokens) to {block_size} (architecture/block_size); got {asked!r}. "
            "Leave it out to cache the whole context."
        )
    return asked


def generate(
    model: Any,
    params: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    key: jax.Array | None = None,
    on_token: Callable[[np.ndarray], None] | None = None,
    vocab: int | None = None,
    cache_slots: int | None = None,
) -> list[list[int]]:
    """Continue each prompt by `max_new_tokens` tokens.

    Args:
        model: a GPT (any module whose call takes `cache=` and has `empty_cache`, as `GPT`).
        params: its parameters (`state.params`).
        prompts: token ids, one list per prompt; lengths may differ.
        max_new_tokens: tokens to add to each prompt.
        temperature: 0 is greedy; higher flattens the distribution.
        top_k: sample only among the `top_k` most likely tokens.
        top_p: sample only among the most likely tokens whose probability reaches `top_p`.
        key: the sampling key (default `jax.random.key(0)`); unused when greedy. Each
            prompt samples from its own stream of it (`prompt_keys`), so a prompt's
            tokens are the same alone as in any batch, at any position.
        on_token: called with each step's new tokens (`[batch]` NumPy ints) as soon as
            they are known, to stream them.
        vocab: draw only ids below it: the tokenizer's vocabulary, where the model's
            embedding is padded beyond it (GPT-NeoX's 50304 rows for Pythia's 50277
            tokens); default every id of the model.
        cache_slots: positions the key-value cache holds, at least the longest prompt
            plus `max_new_tokens`; default the model's context (`block_size`), so one
            compiled step serves every prompt and length. A caller whose prompts and
            lengths are fixed can ask for fewer: the cache's memory and each step's
            attention scale with it (32 + 32 tokens of a model whose context is 2,048).

    Returns:
        The new tokens of each prompt (the prompt itself not included).

    Raises:
        GenerationError: bad prompts or settings, or a prompt too long for the context.
    """
    cfg = model.config
    _check(prompts, max_new_tokens, temperature, top_k, top_p, cfg.vocab_size, cfg.block_size)
    batch, longest = len(prompts), max(len(p) for p in prompts)
    slots = _slots(cache_slots, longest + max_new_tokens, cfg.block_size)
    width = prompt_bucket(longest, slots - max_new_tokens)
    tokens = np.zeros((batch, width), np.int32)
    start = np.zeros(batch, np.int32)
    for row, prompt in enumerate(prompts):
        start[row] = width - len(prompt)
        tokens[row, start[row] :] = np.asarray(prompt)
    start_j = jnp.asarray(start)
    params = decoding_params(model, params)
    logits, caches = _prefill(model, params, jnp.asarray(tokens), start_j, slots)
    keys = prompt_keys(jax.random.key(0) if key is None else key, prompts)
    pick = functools.partial(
        _pick,
        temperature=jnp.float32(max(temperature, 1e-6)),
        top_p=jnp.float32(1.0 if top_p is None else top_p),
        allowed=jnp.int32(cfg.vocab_size if vocab is None else min(vocab, cfg.vocab_size)),
        greedy=temperature == 0,
        top_k=None if top_k is None else min(top_k, cfg.vocab_size, vocab or cfg.vocab_size),
        nucleus=top_p is not None and top_p < 1,
    )
    mode = tuple(pick.keywords[name] for name in ("greedy", "top_k", "nucleus"))
    sampling = tuple(pick.keywords[name] for name in ("temperature", "top_p", "allowed"))
    decode = _decoder(model, *mode)  # positional: one cache entry a mode
    token, n = pick(logits, keys, jnp.int32(0)), jnp.int32(1)
    new: list[jax.Array] = []
    for produced in range(1, max_new_tokens + 1):
        new.append(token)
        if on_token is not None:
            on_token(np.asarray(token))
        if produced < max_new_tokens:
            # The tokens stay on the device (no wait for the host) unless they stream.
            token, caches, n = decode(params, caches, token, keys, n, *sampling)
    return np.asarray(jnp.stack(new, axis=1)).tolist()
