"""Causal multi-head self-attention, grouped-query or not, with rotary positions or none.

With `architecture/positions = rotary` (the default) queries and keys are rotated by
position (all of each head's features, or the first `rotary_fraction` of them); with
`learned` the model adds a position embedding to its input instead (GPT-2), and
attention itself is position-free. With `architecture/n_kv_head` below `n_head`, each
key/value head serves `n_head // n_kv_head` consecutive query heads (grouped-query
attention, as Llama's `repeat_kv`); the KV cache holds only the `n_kv_head` heads.
`c_attn`'s columns are all query heads, then all key heads, then all value heads.

`SelfAttention` is the module the debugger and analyses target by type
(`TARGET = SelfAttention`); its call's first argument is named `x`.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.config import ConfigError
from theseus.model.attention.config import AttentionConfig
from theseus.model.attention.rotary import apply_rotary, rotary_width
from theseus.model.component import Component, resolve_dtype
from theseus.model.norms import make_norm

__all__ = ["AttentionConfig", "KVCache", "SelfAttention", "apply_rotary", "causal_softmax"]


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
        if cfg.n_head % cfg.kv_head_count:
            raise ConfigError(
                f"architecture/n_kv_head ({cfg.n_kv_head}) must divide architecture/n_head "
                f"({cfg.n_head}); set it to a divisor of {cfg.n_head} or 0"
            )
        rot = rotary_width(cfg.head_dim, cfg.rotary_fraction)
        if cfg.positions == "rotary" and (rot == 0 or rot % 2):
            raise ConfigError(
                f"architecture/rotary_fraction ({cfg.rotary_fraction}) must rotate an even, "
                f"non-zero number of each head's {cfg.head_dim} features; it rotates {rot}"
            )
        dtypes = {"dtype": resolve_dtype(cfg.dtype), "param_dtype": resolve_dtype(cfg.param_dtype)}
        init = nn.initializers.normal(0.02)
        self.c_attn = nn.Dense(
            (cfg.n_head + 2 * cfg.kv_head_count) * cfg.head_dim,
            use_bias=cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias,
            kernel_init=nn.with_logical_partitioning(init, ("embed", "heads")),
            **dtypes,
        )
        if cfg.qk_norm:
            norm = partial(
                make_norm,
                cfg.norm,
                eps=cfg.norm_eps,
                bias=cfg.bias if cfg.norm_bias is None else cfg.norm_bias,
                dtype=cfg.dtype,
                param_dtype=cfg.param_dtype,
                axis="heads",  # along c_attn's columns, which `heads` splits
            )
            self.q_norm = norm(name="q_norm")
            self.k_norm = norm(name="k_norm")
        self.c_proj = nn.Dense(
            cfg.n_embd,
            use_bias=cfg.bias if cfg.attn_out_bias is None else cfg.attn_out_bias,
            kernel_init=nn.with_logical_partitioning(init, ("heads", "embed")),
            **dtypes,
        )
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def project(
        self, x: jax.Array, positions: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Queries `[batch, seq, n_head, head_dim]`, keys and values `[.., n_kv_head, ..]`.

        Queries and keys are normalized (`qk_norm`) and then rotated. `positions`
        (`[batch, seq]`) places the rows' tokens for the rotation; None: `0 .. seq-1`.
        With learned positions nothing is rotated.
        """
        cfg = self.config
        batch, seq, _ = x.shape
        heads, kv, head_dim = cfg.n_head, cfg.kv_head_count, cfg.head_dim
        qkv = self.c_attn(x)
        q, k, v = jnp.split(qkv, [heads * head_dim, (heads + kv) * head_dim], axis=-1)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.reshape(batch, seq, heads, head_dim)
        k = k.reshape(batch, seq, kv, head_dim)
        v = v.reshape(batch, seq, kv, head_dim)
        if cfg.positions == "rotary":
            fraction, scaling = cfg.rotary_fraction, cfg.scaling
            q = apply_rotary(q, cfg.rope_base, positions, fraction, scaling)
            k = apply_rotary(k, cfg.rope_base, positions, fraction, scaling)
        return q, k, v

    def grouped(self, kv: jax.Array) -> jax.Array:
        """Keys or values `[batch, seq, n_kv_head, head_dim]` repeated to one per query head.

        Query head `h` reads key/value head `h // (n_head // n_kv_head)`.
        """
        group = self.config.n_head // self.config.kv_head_count
        return kv if group == 1 else jnp.repeat(kv, group, axis=2)

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
            cache: this layer's keys and values, `[batch, slots, n_kv_head, head_dim]` each.
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
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, self.grouped(keys)).astype(jnp.float32)
        scores = scores / jnp.sqrt(head_dim)
        slot = jnp.arange(total, dtype=jnp.int32)
        visible = (slot[None, None, :] <= slots[None, :, None]) & (
            slot[None, None, :] >= start[:, None, None]
        )  # [batch, seq, slots]: causal, and never a row's padding
        scores = jnp.where(visible[:, None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, self.grouped(values))
        return self.c_proj(out.reshape(batch, seq, width)), KVCache(keys, values)

    def weights(self, x: jax.Array) -> jax.Array:
        """Attention probabilities `[batch, n_head, query, key]` (float32, before dropout).

        Row `q` of head `h` says how much position `q` reads from each earlier position.
        """
        q, k, _ = self.project(x)
        return causal_softmax(q, self.grouped(k))

    def heads(self, x: jax.Array) -> jax.Array:
        """Each head's contribution to the output, `[batch, seq, n_head, n_embd]` (no dropout).

        Head `h`'s attention output passed through its rows of `c_proj`'s kernel: the
        contributions summed over heads, plus `c_proj`'s bias, are `__call__(x)`.
        Interventions on one head (ablating, patching) subtract or swap its slice.
        """
        cfg = self.config
        q, k, v = self.project(x)
        v = self.grouped(v)
        weights = causal_softmax(q, self.grouped(k)).astype(v.dtype)
        z = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        dtype = resolve_dtype(cfg.dtype)
        kernel = self.c_proj.variables["params"]["kernel"].astype(dtype)
        kernel = kernel.reshape(cfg.n_head, cfg.head_dim, cfg.n_embd)
        return jnp.einsum("bqhd,hde->bqhe", z.astype(dtype), kernel)

    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        batch, seq, width = x.shape
        q, k, v = self.project(x)
        v = self.grouped(v)
        weights = causal_softmax(q, self.grouped(k)).astype(v.dtype)
        weights = self.attn_dropout(weights, deterministic=deterministic)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, seq, width)
        out = nn.with_logical_constraint(out, ("batch", "length", "embed"))
        return self.resid_dropout(self.c_proj(out), deterministic=deterministic)


class KVCache(NamedTuple):
    """One attention layer's cached keys and values, `[batch, slots, n_kv_head, head_dim]` each."""

    keys: jax.Array
    values: jax.Array

    @classmethod
    def empty(cls, config: AttentionConfig, batch: int, slots: int) -> KVCache:
        """Zeros for `batch` rows of `slots` positions, in the activation dtype."""
        shape = (batch, slots, config.kv_head_count, config.head_dim)
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
