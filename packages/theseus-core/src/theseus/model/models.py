"""The decoder language model: token embedding, blocks, final norm, unembedding.

Module paths are stable and readable, the same for every family: `wte`, `wpe`
(learned positions only), `blocks_0` ... `blocks_{n-1}` (each with `ln_1`, `attn`,
`ln_2`, `mlp`), `ln_f`, and `lm_head` when embeddings are not tied. Every parameter
carries logical axis names (`vocab`, `embed`, `heads`, `mlp`) so it can be sharded by
`nn.logical_axis_rules`.

One configurable block covers the families: `architecture/residual` is `sequential`
(pre-norm: GPT-2, Llama, Qwen2), `parallel` (GPT-NeoX: attention and MLP read the same
input through their own norms) or `post_norm` (OLMo-2: each sublayer's output is
normalized before it joins the residual stream); `architecture/norm` is LayerNorm or
RMSNorm. The defaults are a modern small GPT (rotary positions, no biases, LayerNorm,
sequential); GPT-2 is the same module with `positions = learned`, `bias = true` and its
own sizes (see `theseus.model.gpt2`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from theseus.config import Tree, UnknownKeyError, configure
from theseus.config._errors import suggest
from theseus.config._field import PATH_KEY
from theseus.model._errors import ModelInputError
from theseus.model.attention.base import KVCache, SelfAttention, segment_positions
from theseus.model.component import Component, resolve_dtype
from theseus.model.config import AttentionConfig, GPTConfig, MLPConfig, ModelConfig
from theseus.model.loss import chunked_cross_entropy
from theseus.model.mlp import MLP
from theseus.model.norms import make_norm

__all__ = [
    "GPT",
    "MLP",
    "AttentionConfig",
    "Block",
    "GPTConfig",
    "MLPConfig",
    "ModelConfig",
    "ModelInputError",
    "cross_entropy",
]


@functools.partial(jax.jit, static_argnums=1)
def _cast_matrices(params: Any, dtype: Any) -> Any:
    """Each float32 leaf of two or more dimensions in `dtype`; the others as they are."""
    return jax.tree.map(
        lambda a: a.astype(dtype) if a.ndim >= 2 and a.dtype == jnp.float32 else a, params
    )


def _norm(cfg: ModelConfig, name: str) -> nn.Module:
    bias = cfg.bias if cfg.norm_bias is None else cfg.norm_bias
    return make_norm(
        cfg.norm,
        eps=cfg.norm_eps,
        bias=bias,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        name=name,
    )


def _embedding(cfg: ModelConfig, rows: int, std: float, axis: str) -> nn.Embed:
    """`rows` embeddings of width `n_embd`, initialized normal(`std`), rows along `axis`."""
    return nn.Embed(
        rows,
        cfg.n_embd,
        embedding_init=nn.with_logical_partitioning(nn.initializers.normal(std), (axis, "embed")),
        dtype=resolve_dtype(cfg.dtype),
        param_dtype=resolve_dtype(cfg.param_dtype),
    )


def _parts_read_config(module: Any) -> None:
    """`attention` and `mlp_config` name the configuration those parts read: the module's
    `config` unless given (earlier versions passed three)."""
    for part in ("attention", "mlp_config"):
        if getattr(module, part) is None:
            object.__setattr__(module, part, module.config)


def _attend(
    attn: SelfAttention,
    x: jax.Array,
    deterministic: bool,
    cache: KVCache | None,
    segments: jax.Array | None = None,
    prefixes: jax.Array | None = None,
) -> tuple[jax.Array, KVCache | None]:
    """`attn`'s output and cache; without a cache or segments the call is
    `attn(x, deterministic=...)`, as the debugger's and the analyses' hooks have always
    seen it."""
    if prefixes is not None:
        out = attn(x, deterministic=deterministic, segments=segments, prefixes=prefixes)
        return out, None
    if segments is not None:
        return attn(x, deterministic=deterministic, segments=segments), None
    if cache is None:
        return attn(x, deterministic=deterministic), None
    out, cache = attn(x, deterministic=deterministic, cache=cache)
    return out, cache


class Block(nn.Module, Component):
    """A transformer block; `architecture/residual` says how its parts join the stream.

    - `sequential`: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))` (pre-norm).
    - `parallel`: `x + attn(ln_1(x)) + mlp(ln_2(x))`.
    - `post_norm`: `x + ln_1(attn(x))`, then `x + ln_2(mlp(x))`.
    """

    CONFIG = ModelConfig
    config: ModelConfig
    # Earlier versions took three configurations; each defaults to `config`.
    attention: ModelConfig | None = None
    mlp_config: ModelConfig | None = None

    def __post_init__(self) -> None:
        _parts_read_config(self)
        super().__post_init__()

    @classmethod
    def components(cls) -> list[type[Component]]:
        return [SelfAttention, MLP]

    def setup(self) -> None:
        self.ln_1 = _norm(self.config, "ln_1")
        self.attn = SelfAttention(self.attention or self.config)
        self.ln_2 = _norm(self.config, "ln_2")
        self.mlp = MLP(self.mlp_config or self.config)

    def __call__(
        self,
        x: jax.Array,
        deterministic: bool = True,
        cache: KVCache | None = None,
        segments: jax.Array | None = None,
        prefixes: jax.Array | None = None,
    ) -> Any:
        """`x [batch, seq, n_embd]` through the block; with a cache (see `SelfAttention`),
        `(x, cache)` with the attention reading and writing it; with `segments` (and
        `prefixes`), the attention stays within each packed sequence (and its prefix)."""
        residual = self.config.residual
        if residual == "post_norm":
            attended, cache = _attend(self.attn, x, deterministic, cache, segments, prefixes)
            x = x + self.ln_1(attended)
            x = x + self.ln_2(self.mlp(x, deterministic=deterministic))
        else:
            attended, cache = _attend(
                self.attn, self.ln_1(x), deterministic, cache, segments, prefixes
            )
            if residual == "parallel":
                x = x + attended + self.mlp(self.ln_2(x), deterministic=deterministic)
            else:
                x = x + attended
                x = x + self.mlp(self.ln_2(x), deterministic=deterministic)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        return x if cache is None else (x, cache)


# `training/remat = block`: each block's `__call__` under `jax.checkpoint`, so the backward
# recomputes the block from its input instead of keeping its activations. A subclass of
# `Block` with the same fields, so `blocks_0/attn` ... and the parameter tree are those
# of `Block` (a checkpoint restores under either setting). `deterministic` (argument 2,
# counting `self`) is static: it is Python control flow inside the block.
_RematBlock = nn.remat(Block, static_argnums=(2,))


def cross_entropy(
    logits: jax.Array, targets: jax.Array, mask: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """Mean cross-entropy over targets that are not `-1` (and, if given, where `mask` is true).

    Returns:
        `(mean_loss, count)`: the mean in nats over counted positions and how many counted.
    """
    valid = targets >= 0
    if mask is not None:
        valid = valid & mask.astype(bool)
    losses = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), jnp.where(valid, targets, 0)
    )
    count = valid.sum()
    total = jnp.where(valid, losses, 0.0).sum()
    return total / jnp.maximum(count, 1), count


class GPT(nn.Module, Component):
    """A GPT: `x [batch, seq] int -> logits [batch, seq, vocab_size]` (and the loss given `y`)."""

    CONFIG = ModelConfig
    config: ModelConfig
    # Earlier versions took three configurations; each defaults to `config`.
    attention: ModelConfig | None = None
    mlp_config: ModelConfig | None = None

    def __post_init__(self) -> None:
        _parts_read_config(self)
        super().__post_init__()

    @classmethod
    def components(cls) -> list[type[Component]]:
        return [Block]

    @classmethod
    def build(cls, **settings: Any) -> GPT:
        """Construct the model; each setting is given once and reaches every component.

        Without settings: from the active configuration (see `theseus.config.using`),
        as a trainer does. With settings (a field name such as `n_embd=64`, or a key
        such as `architecture/n_embd`): one fresh `ModelConfig` with those values
        (type-checked) and the defaults.

        Example:
            >>> GPT.build(n_layers=2, n_embd=64, n_head=2, block_size=32).config.n_embd
            64

        Raises:
            UnknownKeyError: a setting `ModelConfig` does not declare (with the closest
                names).
            ConfigTypeError: a value of the wrong type.
            ConfigRangeError: a value out of its range, or settings that do not fit
                together (`n_head` not divisible by `n_kv_head`, ...).
        """
        if not settings:
            return cls(configure(ModelConfig))
        keys = {f.name: f.metadata[PATH_KEY] for f in dataclasses.fields(ModelConfig)}
        tree = Tree.of(ModelConfig)
        for name, value in settings.items():
            key = keys.get(name, name)
            if key not in keys.values():
                raise UnknownKeyError(
                    f"GPT.build() got the setting {name!r}, which ModelConfig does not "
                    f"declare.{suggest(name, keys)} Settings: {', '.join(sorted(keys))}."
                )
            tree.set(key, value)
        tree.check()
        return cls(configure(ModelConfig, tree))

    def setup(self) -> None:
        cfg = self.config
        self.wte = _embedding(cfg, cfg.vocab_size, 0.02, "vocab")
        if cfg.positions == "learned":
            self.wpe = _embedding(cfg, cfg.block_size, 0.01, "length")
        self.drop = nn.Dropout(cfg.dropout)
        block = _RematBlock if cfg.remat == "block" else Block
        self.blocks = [block(cfg, self.attention, self.mlp_config) for _ in range(cfg.n_layers)]
        self.ln_f = _norm(cfg, "ln_f")
        if not cfg.tie_embeddings:
            self.lm_head = nn.Dense(
                cfg.vocab_size,
                use_bias=False,
                kernel_init=nn.with_logical_partitioning(
                    nn.initializers.normal(0.02), ("embed", "vocab")
                ),
                dtype=resolve_dtype(cfg.dtype),
                param_dtype=resolve_dtype(cfg.param_dtype),
            )

    def __call__(
        self,
        x: jax.Array,
        y: jax.Array | None = None,
        padding_mask: jax.Array | None = None,
        deterministic: bool = True,
        cache: tuple[KVCache, ...] | None = None,
        segments: jax.Array | None = None,
        prefixes: jax.Array | None = None,
    ) -> tuple[jax.Array, Any]:
        """Run the model.

        Args:
            x: token ids `[batch, seq]`, `seq <= block_size`.
            y: target ids `[batch, seq]` (`-1` is ignored), or None for no loss.
            padding_mask: `[batch, seq]`, true where `x` is a real token.
            deterministic: disable dropout.
            cache: None, or one `KVCache` per block (`empty_cache`): then `x` holds the
                tokens at the cache's slots `length ..` (a left-padded prompt at length 0,
                then one token per row and step; see `SelfAttention`), and the call is
                deterministic and computes no loss.
            segments: None, or (without a cache) `[batch, seq]` ids of the sequences each
                row packs, each a run of one id (padding may be one more): each token
                reads only its own sequence, whose positions start at 0, so each
                sequence's logits are those of its own forward.
            prefixes: None, or with `segments` `[batch, seq]`: the id of the segment each
                token's segment continues (its own id where none): segments after one
                shared prefix (a question's choices after its context) each read it
                whole and not each other, their positions going on from its end.

        Returns:
            `(logits [batch, seq, vocab_size], loss or None)`; with a cache,
            `(logits, cache)` with every layer's keys and values written.
        """
        if x.shape[-1] > self.config.block_size:
            raise ModelInputError(
                f"sequence length {x.shape[-1]} exceeds architecture/block_size "
                f"{self.config.block_size}"
            )
        if prefixes is not None and (segments is None or prefixes.shape != x.shape):
            raise ModelInputError(
                "prefixes must be [batch, seq] like the tokens, with segments; got "
                f"{tuple(prefixes.shape)} for tokens {tuple(x.shape)}"
                + ("" if segments is not None else " and no segments")
            )
        if segments is not None and (cache is not None or segments.shape != x.shape):
            raise ModelInputError(
                "segments must be [batch, seq] like the tokens, without a cache; got "
                f"{tuple(segments.shape)} for tokens {tuple(x.shape)}"
                + (" and a cache" if cache is not None else "")
            )
        h = self.wte(x)
        if self.config.positions == "learned":
            if segments is not None:
                h = h + self.wpe(segment_positions(segments, prefixes))
            elif cache is None:
                h = h + self.wpe(jnp.arange(x.shape[-1]))[None]
            else:  # as SelfAttention places a cached row's tokens
                first = cache[0]
                slots = jnp.arange(x.shape[-1], dtype=jnp.int32) + first.length
                h = h + self.wpe(jnp.maximum(slots[None, :] - first.start[:, None], 0))
        h = self.drop(h, deterministic=deterministic)
        h = nn.with_logical_constraint(h, ("batch", "length", "embed"))
        if segments is not None:
            for block in self.blocks:
                h = block(h, deterministic, None, segments, prefixes)
        elif cache is None:
            for block in self.blocks:
                h = block(h, deterministic)  # positional: static under nn.remat
        else:
            written = []
            for block, layer in zip(self.blocks, cache, strict=True):
                h, layer = block(h, True, layer)
                written.append(layer)
            cache = tuple(written)
        h = self.ln_f(h)
        logits = self._head(h)
        tied = self.config.tie_embeddings
        if cache is not None:
            return logits, cache
        if y is None:
            return logits, None
        # The loss reads `h` and the unembedding weights, chunk by chunk (theseus.model.loss):
        # for a caller that drops `logits` (train_step, val_step) XLA removes them.
        if tied:
            unembedding = self.wte.embedding
        else:
            unembedding = nn.unbox(self.lm_head.variables["params"]["kernel"])
        loss, _ = chunked_cross_entropy(
            h,
            unembedding,
            y,
            padding_mask,
            tied=tied,
            dtype=resolve_dtype(self.config.dtype),
            chunk=self.config.loss_chunk,
        )
        return logits, loss

    def unembed(self, h: jax.Array) -> jax.Array:
        """The final norm and the unembedding: a residual stream `h [batch, seq, n_embd]`
        -> logits `[batch, seq, vocab_size]`.

        What `__call__` applies after the last block; the logit lens reads every layer's
        residual stream through it (`model.apply(variables, h, method="unembed")`).
        """
        return self._head(self.ln_f(h))

    def _head(self, h: jax.Array) -> jax.Array:
        """`ln_f`'s output `[batch, seq, n_embd]` -> logits: the tied embedding's
        transpose (`wte.attend`) or `lm_head`."""
        return self.wte.attend(h) if self.config.tie_embeddings else self.lm_head(h)

    def decoding_params(self, params: Any) -> Any:
        """`params` as a decode step reads them: with a 16-bit activation dtype
        (`architecture/dtype/activation`), each float32 matrix (the kernels and
        embeddings) in that dtype; the rest, and every parameter of a float32 model, as
        they are.

        Every matmul and embedding lookup casts those matrices to the activation dtype
        anyway, so the logits are the same bit for bit (tested for every family), while a
        decode step, which at a small batch reads each weight once a token, reads half the
        bytes. The vectors (norm scales, biases) stay: a norm scales in float32.
        """
        dtype = resolve_dtype(self.config.dtype)
        if jnp.dtype(dtype).itemsize != 2:
            return params
        return _cast_matrices(params, dtype)

    def empty_cache(
        self, batch: int, slots: int, start: jax.Array | None = None
    ) -> tuple[KVCache, ...]:
        """A zero `KVCache` per block for `batch` rows of `slots` positions (`start`: each
        row's first real slot, `[batch]`; None: 0)."""
        return tuple(
            KVCache.empty(self.attention or self.config, batch, slots, start)
            for _ in range(self.config.n_layers)
        )
