"""Causal multi-head self-attention, with rotary positions or none of its own.

With `architecture/positions = rotary` (the default) queries and keys are rotated by
position; with `learned` the model adds a position embedding to its input instead
(GPT-2), and attention itself is position-free.

`SelfAttention` is the module the debugger and analyses target by type
(`TARGET = SelfAttention`); its call's first argument is named `x`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.config import ConfigError, field, rule
from theseus.model.component import Component, resolve_dtype

__all__ = ["AttentionConfig", "KVCache", "SelfAttention", "apply_rotary", "causal_softmax"]


@rule("architecture/n_embd", "architecture/n_head", "architecture/positions")
def head_width(n_embd: int, n_head: int, positions: str) -> str | None:
    """`architecture/n_embd` splits into `n_head` heads of one width, even for rotary positions."""
    if n_embd % n_head:
        return (
            f"Configuration value for 'architecture/n_head' must divide architecture/n_embd "
            f"({n_embd}) into heads of equal width; got {n_head}. Set architecture/n_head to "
            f"a divisor of {n_embd}, or architecture/n_embd to a multiple of {n_head}."
        )
    if positions == "rotary" and (n_embd // n_head) % 2:
        return (
            f"Configuration value for 'architecture/n_head' must leave heads of even width "
            f"for rotary positions; got {n_head} heads of {n_embd} // {n_head} = "
            f"{n_embd // n_head}. Choose n_embd and n_head with an even n_embd / n_head, or "
            "`architecture.positions=learned`."
        )
    return None


@dataclass(frozen=True)
class AttentionConfig:
    """Settings read by `SelfAttention`."""

    n_embd: int = field(
        "architecture/n_embd", default=128, ge=1, help="width of the residual stream"
    )
    n_head: int = field(
        "architecture/n_head", default=4, ge=1, rules=[head_width], help="attention heads per layer"
    )
    block_size: int = field(
        "architecture/block_size", default=128, ge=1, help="context length in tokens"
    )
    dropout: float = field(
        "architecture/dropout", default=0.0, ge=0, lt=1, help="dropout probability"
    )
    bias: bool = field("architecture/bias", default=False, help="biases in dense layers and norms")
    rope_base: float = field(
        "architecture/rope_base", default=10000.0, gt=0, help="rotary frequency base"
    )
    positions: Literal["rotary", "learned"] = field(
        "architecture/positions",
        default="rotary",
        help="'rotary' rotates queries and keys; 'learned' adds a position embedding (GPT-2)",
    )
    param_dtype: str = field("architecture/dtype/param", default="float32", help="parameter dtype")
    dtype: str = field("architecture/dtype/activation", default="float32", help="activation dtype")


def apply_rotary(x: jax.Array, base: float, positions: jax.Array | None = None) -> jax.Array:
    """Rotate pairs of features of `x` `[batch, seq, heads, head_dim]` by position.

    Feature `i` and `i + head_dim/2` form a pair rotated by angle `pos * base**(-2i/head_dim)`.

    Args:
        x: queries or keys.
        base: the rotary frequency base.
        positions: `[batch, seq]` integer positions (cached decoding, left padding);
            None: `0 .. seq-1` for every row.
    """
    seq, head_dim = x.shape[1], x.shape[-1]
    half = head_dim // 2
    inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / head_dim)
    if positions is None:
        angles = jnp.arange(seq, dtype=jnp.float32)[None, :, None] * inv_freq  # [1, seq, half]
    else:
        angles = positions.astype(jnp.float32)[:, :, None] * inv_freq  # [batch, seq, half]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    first, second = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    rotated = jnp.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)
    return rotated.astype(x.dtype)


class SelfAttention(nn.Module, Component):
    """Causal self-attention: `x [batch, seq, n_embd] -> [batch, seq, n_embd]`."""

    CONFIG = AttentionConfig
    config: AttentionConfig

    def setup(self) -> None:
        cfg = self.config
        if cfg.n_embd % cfg.n_head:
            raise ConfigError(
                f"architecture/n_embd ({cfg.n_embd}) must split into architecture/n_head "
                f"({cfg.n_head}) heads of equal width"
            )
        if cfg.positions == "rotary" and (cfg.n_embd // cfg.n_head) % 2:
            raise ConfigError(
                f"architecture/n_embd ({cfg.n_embd}) must split into architecture/n_head "
                f"({cfg.n_head}) heads of even width for rotary positions"
            )
        dense = {
            "use_bias": cfg.bias,
            "dtype": resolve_dtype(cfg.dtype),
            "param_dtype": resolve_dtype(cfg.param_dtype),
        }
        init = nn.initializers.normal(0.02)
        self.c_attn = nn.Dense(
            3 * cfg.n_embd,
            kernel_init=nn.with_logical_partitioning(init, ("embed", "heads")),
            **dense,
        )
        self.c_proj = nn.Dense(
            cfg.n_embd, kernel_init=nn.with_logical_partitioning(init, ("heads", "embed")), **dense
        )
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def project(
        self, x: jax.Array, positions: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Queries and keys (rotated) and values, each `[batch, seq, n_head, head_dim]`.

        `positions` (`[batch, seq]`) places the rows' tokens for the rotation; None:
        `0 .. seq-1`. With learned positions nothing is rotated.
        """
        cfg = self.config
        batch, seq, width = x.shape
        qkv = self.c_attn(x).reshape(batch, seq, 3, cfg.n_head, width // cfg.n_head)
        q, k = qkv[:, :, 0], qkv[:, :, 1]
        if cfg.positions == "rotary":
            q = apply_rotary(q, cfg.rope_base, positions)
            k = apply_rotary(k, cfg.rope_base, positions)
        return q, k, qkv[:, :, 2]

    def cached(
        self, x: jax.Array, cache: KVCache, index: jax.Array, start: jax.Array
    ) -> tuple[jax.Array, KVCache]:
        """Attend from `x` at cache positions `index ..` over the cache, and write its keys.

        The cached twin of `__call__` (deterministic): row `b` holds its real tokens from
        cache slot `start[b]` on (a left-padded prompt), and its token at slot `s` sits
        at position `s - start[b]`, so every row computes what it would alone.

        Args:
            x: `[batch, seq, n_embd]`, the inputs at slots `index .. index + seq - 1`
                (the whole padded prompt at `index = 0`, then one token per step).
            cache: this layer's keys and values, `[batch, slots, n_head, head_dim]` each.
            index: the first slot `x` fills (a scalar int32).
            start: `[batch]` int32, the slot of each row's first real token.

        Returns:
            `(out [batch, seq, n_embd], cache)` with `x`'s keys and values written.
        """
        batch, seq, width = x.shape
        slots = jnp.arange(seq, dtype=jnp.int32) + index  # [seq]
        positions = jnp.maximum(slots[None, :] - start[:, None], 0)  # padding: masked below
        q, k, v = self.project(x, positions)
        keys = jax.lax.dynamic_update_slice(
            cache.keys, k.astype(cache.keys.dtype), (0, index, 0, 0)
        )
        values = jax.lax.dynamic_update_slice(
            cache.values, v.astype(cache.values.dtype), (0, index, 0, 0)
        )
        total, head_dim = keys.shape[1], q.shape[-1]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, keys).astype(jnp.float32) / jnp.sqrt(head_dim)
        slot = jnp.arange(total, dtype=jnp.int32)
        visible = (slot[None, None, :] <= slots[None, :, None]) & (
            slot[None, None, :] >= start[:, None, None]
        )  # [batch, seq, slots]: causal, and never a row's padding
        scores = jnp.where(visible[:, None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, values).reshape(batch, seq, width)
        return self.c_proj(out), KVCache(keys, values)

    def weights(self, x: jax.Array) -> jax.Array:
        """Attention probabilities `[batch, n_head, query, key]` (float32, before dropout).

        Row `q` of head `h` says how much position `q` reads from each earlier position.
        """
        q, k, _ = self.project(x)
        return causal_softmax(q, k)

    def heads(self, x: jax.Array) -> jax.Array:
        """Each head's contribution to the output, `[batch, seq, n_head, n_embd]` (no dropout).

        Head `h`'s attention output passed through its rows of `c_proj`'s kernel: the
        contributions summed over heads, plus `c_proj`'s bias, are `__call__(x)`.
        Interventions on one head (ablating, patching) subtract or swap its slice.
        """
        cfg = self.config
        width = x.shape[-1]
        q, k, v = self.project(x)
        weights = causal_softmax(q, k).astype(v.dtype)
        z = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        dtype = resolve_dtype(cfg.dtype)
        kernel = self.c_proj.variables["params"]["kernel"].astype(dtype)
        kernel = kernel.reshape(cfg.n_head, width // cfg.n_head, width)
        return jnp.einsum("bqhd,hde->bqhe", z.astype(dtype), kernel)

    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        batch, seq, width = x.shape
        q, k, v = self.project(x)
        weights = causal_softmax(q, k).astype(v.dtype)
        weights = self.attn_dropout(weights, deterministic=deterministic)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, seq, width)
        out = nn.with_logical_constraint(out, ("batch", "length", "embed"))
        return self.resid_dropout(self.c_proj(out), deterministic=deterministic)


class KVCache(NamedTuple):
    """One attention layer's cached keys and values, `[batch, slots, n_head, head_dim]` each."""

    keys: jax.Array
    values: jax.Array

    @classmethod
    def empty(cls, config: AttentionConfig, batch: int, slots: int) -> KVCache:
        """Zeros for `batch` rows of `slots` positions, in the activation dtype."""
        shape = (batch, slots, config.n_head, config.n_embd // config.n_head)
        zeros = jnp.zeros(shape, resolve_dtype(config.dtype))
        return cls(zeros, zeros)


def causal_softmax(q: jax.Array, k: jax.Array) -> jax.Array:
    """Causal attention probabilities `[batch, heads, query, key]` in float32.

    Args:
        q: queries `[batch, seq, heads, head_dim]`.
        k: keys `[batch, seq, heads, head_dim]`.
    """
    seq, head_dim = q.shape[1], q.shape[-1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scores = jnp.where(causal[None, None], scores, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(scores, axis=-1)
