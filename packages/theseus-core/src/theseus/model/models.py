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
from dataclasses import dataclass
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from theseus.config import Tree, UnknownKeyError, configure, field
from theseus.config._errors import suggest
from theseus.config._field import PATH_KEY
from theseus.errors import TheseusError
from theseus.model.attention.base import AttentionConfig, KVCache, SelfAttention
from theseus.model.component import Component, resolve_dtype
from theseus.model.loss import chunked_cross_entropy
from theseus.model.mlp import MLP, MLPConfig
from theseus.model.norms import make_norm

__all__ = ["GPT", "MLP", "Block", "GPTConfig", "MLPConfig", "ModelInputError", "cross_entropy"]


class ModelInputError(TheseusError, ValueError):
    """Tokens the model cannot take (a sequence longer than `architecture/block_size`)."""


@dataclass(frozen=True)
class GPTConfig:
    """Settings read by `GPT` itself."""

    n_layers: int = field("architecture/n_layers", default=4, ge=1, help="number of blocks")
    n_embd: int = field(
        "architecture/n_embd", default=128, ge=1, help="width of the residual stream"
    )
    block_size: int = field(
        "architecture/block_size", default=128, ge=1, help="context length in tokens"
    )
    vocab_size: int = field("architecture/vocab_size", default=258, ge=1, help="embedding rows")
    dropout: float = field(
        "architecture/dropout", default=0.0, ge=0, lt=1, help="dropout probability"
    )
    bias: bool = field("architecture/bias", default=False, help="biases in dense layers and norms")
    tie_embeddings: bool = field(
        "architecture/tie_embeddings", default=True, help="unembed with the embedding matrix"
    )
    positions: Literal["rotary", "learned"] = field(
        "architecture/positions",
        default="rotary",
        help="'rotary' rotates queries and keys; 'learned' adds a position embedding (GPT-2)",
    )
    norm: Literal["layernorm", "rmsnorm"] = field(
        "architecture/norm", default="layernorm", help="the kind of every norm of the model"
    )
    norm_eps: float = field(
        "architecture/norm_eps", default=1e-5, gt=0, help="epsilon of every layer norm"
    )
    norm_bias: bool | None = field(
        "architecture/norm_bias",
        default=None,
        help="a LayerNorm's bias (RMSNorm has none); None: architecture/bias",
    )
    residual: Literal["sequential", "parallel", "post_norm"] = field(
        "architecture/residual",
        default="sequential",
        help="'sequential': x + attn(ln_1(x)), then x + mlp(ln_2(x)); 'parallel': "
        "x + attn(ln_1(x)) + mlp(ln_2(x)) (GPT-NeoX); 'post_norm': x + ln_1(attn(x)), then "
        "x + ln_2(mlp(x)) (OLMo-2)",
    )
    tokenizer: str = field(
        "architecture/tokenizer",
        default="bytes",
        help="the tokenizer whose ids the model reads: 'bytes', or one under ROOT/tokenizers",
    )
    param_dtype: str = field("architecture/dtype/param", default="float32", help="parameter dtype")
    dtype: str = field("architecture/dtype/activation", default="float32", help="activation dtype")
    remat: Literal["none", "block"] = field(
        "training/remat",
        default="none",
        help="activation checkpointing: 'none' keeps every activation for the backward, "
        "'block' keeps only each block's input and recomputes the block in the backward",
    )
    loss_chunk: int = field(
        "training/loss_chunk",
        default=0,
        ge=0,
        help="most tokens (rows x positions) whose logits the loss computes at once; 0: as "
        "many as keep a chunk's float32 logits within 256 MiB (theseus.model.loss)",
    )


def _norm(cfg: GPTConfig, name: str) -> nn.Module:
    bias = cfg.bias if cfg.norm_bias is None else cfg.norm_bias
    return make_norm(
        cfg.norm,
        eps=cfg.norm_eps,
        bias=bias,
        dtype=cfg.dtype,
        param_dtype=cfg.param_dtype,
        name=name,
    )


def _embedding(cfg: GPTConfig, rows: int, std: float, axis: str) -> nn.Embed:
    """`rows` embeddings of width `n_embd`, initialized normal(`std`), rows along `axis`."""
    return nn.Embed(
        rows,
        cfg.n_embd,
        embedding_init=nn.with_logical_partitioning(nn.initializers.normal(std), (axis, "embed")),
        dtype=resolve_dtype(cfg.dtype),
        param_dtype=resolve_dtype(cfg.param_dtype),
    )


class Block(nn.Module, Component):
    """A transformer block; `architecture/residual` says how its parts join the stream.

    - `sequential`: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))` (pre-norm).
    - `parallel`: `x + attn(ln_1(x)) + mlp(ln_2(x))`.
    - `post_norm`: `x + ln_1(attn(x))`, then `x + ln_2(mlp(x))`.
    """

    CONFIG = GPTConfig
    config: GPTConfig
    attention: AttentionConfig
    mlp_config: MLPConfig

    @classmethod
    def components(cls) -> list[type[Component]]:
        return [SelfAttention, MLP]

    def setup(self) -> None:
        self.ln_1 = _norm(self.config, "ln_1")
        self.attn = SelfAttention(self.attention)
        self.ln_2 = _norm(self.config, "ln_2")
        self.mlp = MLP(self.mlp_config)

    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        residual = self.config.residual
        if residual == "parallel":
            attended = self.attn(self.ln_1(x), deterministic=deterministic)
            x = x + attended + self.mlp(self.ln_2(x), deterministic=deterministic)
        elif residual == "post_norm":
            x = x + self.ln_1(self.attn(x, deterministic=deterministic))
            x = x + self.ln_2(self.mlp(x, deterministic=deterministic))
        else:
            x = x + self.attn(self.ln_1(x), deterministic=deterministic)
            x = x + self.mlp(self.ln_2(x), deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))

    def cached(
        self, x: jax.Array, cache: KVCache, index: jax.Array, start: jax.Array
    ) -> tuple[jax.Array, KVCache]:
        """`__call__` (deterministic) with the attention reading and writing `cache`."""
        residual = self.config.residual
        if residual == "post_norm":
            attended, cache = self.attn.cached(x, cache, index, start)
            x = x + self.ln_1(attended)
            return x + self.ln_2(self.mlp(x)), cache
        attended, cache = self.attn.cached(self.ln_1(x), cache, index, start)
        if residual == "parallel":
            return x + attended + self.mlp(self.ln_2(x)), cache
        x = x + attended
        return x + self.mlp(self.ln_2(x)), cache


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

    CONFIG = GPTConfig
    config: GPTConfig
    attention: AttentionConfig
    mlp_config: MLPConfig

    @classmethod
    def components(cls) -> list[type[Component]]:
        return [Block]

    @classmethod
    def build(cls, **settings: Any) -> GPT:
        """Construct the model; each setting is given once and reaches every component.

        Without settings: from the active configuration (see `theseus.config.using`),
        as a trainer does. With settings (a field name such as `n_embd=64`, or a key
        such as `architecture/n_embd`): one fresh configuration of `GPTConfig`,
        `AttentionConfig` and `MLPConfig` with those values (type-checked) and the
        defaults, so `n_embd`, `block_size` and `dropout` are never written three times.

        Example:
            >>> GPT.build(n_layers=2, n_embd=64, n_head=2, block_size=32).attention.n_embd
            64

        Raises:
            UnknownKeyError: a setting that none of the three declares (with the
                closest names).
            ConfigTypeError: a value of the wrong type.
            ConfigRangeError: a value out of its range, or settings that do not fit
                together (`n_head` not divisible by `n_kv_head`, ...).
        """
        schemas = (GPTConfig, AttentionConfig, MLPConfig)
        if not settings:
            return cls(configure(GPTConfig), configure(AttentionConfig), configure(MLPConfig))
        keys = {
            f.name: f.metadata[PATH_KEY] for schema in schemas for f in dataclasses.fields(schema)
        }
        tree = Tree.of(*schemas)
        for name, value in settings.items():
            key = keys.get(name, name)
            if key not in keys.values():
                raise UnknownKeyError(
                    f"GPT.build() got the setting {name!r}, which none of GPTConfig, "
                    f"AttentionConfig and MLPConfig declares.{suggest(name, keys)} Settings: "
                    f"{', '.join(sorted(keys))}."
                )
            tree.set(key, value)
        tree.check()
        return cls(
            configure(GPTConfig, tree), configure(AttentionConfig, tree), configure(MLPConfig, tree)
        )

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
    ) -> tuple[jax.Array, jax.Array | None]:
        """Run the model.

        Args:
            x: token ids `[batch, seq]`, `seq <= block_size`.
            y: target ids `[batch, seq]` (`-1` is ignored), or None for no loss.
            padding_mask: `[batch, seq]`, true where `x` is a real token.
            deterministic: disable dropout.

        Returns:
            `(logits [batch, seq, vocab_size], loss or None)`.
        """
        if x.shape[-1] > self.config.block_size:
            raise ModelInputError(
                f"sequence length {x.shape[-1]} exceeds architecture/block_size "
                f"{self.config.block_size}"
            )
        h = self.wte(x)
        if self.config.positions == "learned":
            h = h + self.wpe(jnp.arange(x.shape[-1]))[None]
        h = self.drop(h, deterministic=deterministic)
        h = nn.with_logical_constraint(h, ("batch", "length", "embed"))
        for block in self.blocks:
            h = block(h, deterministic)  # positional: static under nn.remat
        h = self.ln_f(h)
        tied = self.config.tie_embeddings
        logits = self.wte.attend(h) if tied else self.lm_head(h)
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

    def cached(
        self, x: jax.Array, caches: tuple[KVCache, ...], index: jax.Array, start: jax.Array
    ) -> tuple[jax.Array, tuple[KVCache, ...]]:
        """Logits of `x` at cache slots `index ..`, reading and writing every layer's cache.

        The model's forward for generation (deterministic): the padded prompt at
        `index = 0` (prefill), then one token per row and step. See `SelfAttention.cached`
        for `start` (each row's first real slot, for left-padded prompts).

        Returns:
            `(logits [batch, seq, vocab_size], caches)`.
        """
        h = self.wte(x)
        if self.config.positions == "learned":  # as SelfAttention.cached places rows
            slots = jnp.arange(x.shape[-1], dtype=jnp.int32) + index
            h = h + self.wpe(jnp.maximum(slots[None, :] - start[:, None], 0))
        written = []
        for block, cache in zip(self.blocks, caches, strict=True):
            h, cache = block.cached(h, cache, index, start)
            written.append(cache)
        h = self.ln_f(h)
        logits = self.wte.attend(h) if self.config.tie_embeddings else self.lm_head(h)
        return logits, tuple(written)

    def empty_caches(self, batch: int, slots: int) -> tuple[KVCache, ...]:
        """A zero cache per block for `batch` rows of `slots` positions."""
        return tuple(
            KVCache.empty(self.attention, batch, slots) for _ in range(self.config.n_layers)
        )
