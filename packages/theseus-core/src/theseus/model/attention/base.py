"""Causal multi-head self-attention, grouped-query or not, with rotary positions or none.

With `architecture/positions = rotary` (the default) queries and keys are rotated by
position (all of each head's features, or the first `rotary_fraction` of them); with
`learned` the model adds a position embedding to its input instead (GPT-2), and
attention itself is position-free. With `architecture/n_kv_head` below `n_head`, each
key/value head serves `n_head // n_kv_head` consecutive query heads (grouped-query
attention, as Llama's `repeat_kv`); the KV cache holds only the `n_kv_head` heads.
`c_attn`'s columns are all query heads, then all key heads, then all value heads.

Where the splash kernel serves a call (`architecture/attention` = `auto` or `splash` on a
TPU), the layer projects queries, keys and values straight into the kernel's `[batch,
heads, seq, head_dim]` layout with `c_attn`'s kernel and reads the kernel's output with
`c_proj`'s (`_fused`), unless a listener of `theseus.model.hooks` is in the way: then it
calls `c_attn` and `c_proj` as modules, so every analysis sees and edits them.

`SelfAttention` is the module the debugger and analyses target by type
(`TARGET = SelfAttention`); its call's first argument is named `x`.

Rows may pack several sequences (`segments`, `[batch, seq]` ids, each sequence a run of
one id, as evaluations pack short requests): attention stays within each segment and
positions count from each segment's first token (`segment_positions`), so every packed
sequence computes what it would alone.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.config import ConfigError
from theseus.model import hooks
from theseus.model.attention.kernels import (
    attend,
    attend_heads_first,
    choose,
    probabilities,
    reference,
    repeat_kv,
)
from theseus.model.attention.rotary import apply_rotary, rotary_width
from theseus.model.component import Component, resolve_dtype
from theseus.model.config import ModelConfig
from theseus.model.norms import make_norm

__all__ = [
    "KVCache",
    "SelfAttention",
    "apply_rotary",
    "attend",
    "causal_softmax",
    "segment_positions",
]


def segment_positions(segments: jax.Array, prefixes: jax.Array | None = None) -> jax.Array:
    """Each token's position within its segment, `[batch, seq]` int32; a segment that
    continues a prefix (`prefixes`, see `attend`) starts where that prefix ends.

    Args:
        segments: `[batch, seq]` ids, each segment a run of one id.
        prefixes: None, or `[batch, seq]`: the id of the segment each token's segment
            continues (its own id where it continues none).

    Example:
        >>> segment_positions(jnp.array([[1, 1, 1, 2, 2, 0]])).tolist()
        [[0, 1, 2, 0, 1, 0]]
        >>> segment_positions(jnp.array([[1, 1, 2, 3, 3]]), jnp.array([[1, 1, 1, 1, 1]])).tolist()
        [[0, 1, 2, 2, 3]]
    """
    seq = segments.shape[-1]
    index = jnp.arange(seq, dtype=jnp.int32)
    begins = jnp.concatenate(
        [jnp.ones_like(segments[:, :1], bool), segments[:, 1:] != segments[:, :-1]], axis=1
    )
    first = jax.lax.cummax(jnp.where(begins, index[None, :], 0), axis=1)
    positions = index[None, :] - first
    if prefixes is None:
        return positions
    continued = prefixes != segments  # [batch, seq]: tokens after a prefix of another id
    prefix_length = jnp.sum(prefixes[:, :, None] == segments[:, None, :], axis=-1)
    return positions + jnp.where(continued, prefix_length, 0).astype(jnp.int32)


class SelfAttention(nn.Module, Component):
    """Causal self-attention: `x [batch, seq, n_embd] -> [batch, seq, n_embd]`."""

    CONFIG = ModelConfig
    config: ModelConfig

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
        return repeat_kv(kv, self.config.n_head)

    def weights(self, x: jax.Array) -> jax.Array:
        """Attention probabilities `[batch, n_head, query, key]` (float32, before dropout).

        Row `q` of head `h` says how much position `q` reads from each earlier position.
        Always the reference computation, whatever `architecture/attention` says.
        """
        q, k, _ = self.project(x)
        return probabilities(q, k)

    def heads(self, x: jax.Array) -> jax.Array:
        """Each head's contribution to the output, `[batch, seq, n_head, n_embd]` (no dropout).

        Head `h`'s attention output passed through its rows of `c_proj`'s kernel: the
        contributions summed over heads, plus `c_proj`'s bias, are `__call__(x)`.
        Interventions on one head (ablating, patching) subtract or swap its slice.
        Always the reference computation, whatever `architecture/attention` says.
        """
        cfg = self.config
        q, k, v = self.project(x)
        z = reference(q, k, v)
        dtype = resolve_dtype(cfg.dtype)
        kernel = self.c_proj.variables["params"]["kernel"].astype(dtype)
        kernel = kernel.reshape(cfg.n_head, cfg.head_dim, cfg.n_embd)
        return jnp.einsum("bqhd,hde->bqhe", z.astype(dtype), kernel)

    def __call__(
        self,
        x: jax.Array,
        deterministic: bool = True,
        cache: KVCache | None = None,
        segments: jax.Array | None = None,
        prefixes: jax.Array | None = None,
    ) -> Any:
        """Attend causally within `x` (within each of its segments), or from `x` over a
        key-value cache.

        Args:
            x: `[batch, seq, n_embd]`.
            deterministic: disable dropout.
            cache: None for a plain forward. Given (generation, deterministic): `x` holds
                the inputs at cache slots `cache.length .. length + seq - 1` (the whole
                left-padded prompt at length 0, then one token per step); row `b`'s real
                tokens start at slot `cache.start[b]` and its token at slot `s` sits at
                position `s - start[b]`, so every row computes what it would alone.
            segments: None, or (without a cache) `[batch, seq]` ids of the sequences each
                row packs, each a run of one id: a token reads only its own segment's
                tokens, and rotary positions count from the segment's first token.
            prefixes: None, or with `segments` the shared prefix each token's segment
                continues (see `attend`): read whole, and the positions go on from it.

        Returns:
            `[batch, seq, n_embd]`; with a cache, `(out, cache)` with `x`'s keys and
            values written and its length moved past them.
        """
        batch, seq, width = x.shape
        implementation = self.config.attention
        if cache is None:
            positions = None if segments is None else segment_positions(segments, prefixes)
            drop = None
            if self.config.dropout > 0 and not deterministic:  # rate first: may be traced
                drop = partial(self.attn_dropout, deterministic=False)
            if self._heads_first(x, segments, prefixes, drop is not None):
                out = self._fused(x, positions, segments)
                return self.resid_dropout(out, deterministic=deterministic)
            q, k, v = self.project(x, positions)
            out = attend(
                q,
                k,
                v,
                implementation=implementation,
                segments=segments,
                prefixes=prefixes,
                dropout=drop,
            )
        else:
            if segments is not None:
                raise ValueError("attention takes packed segments or a cache, not both")
            slots = jnp.arange(seq, dtype=jnp.int32) + cache.length  # [seq]
            positions = jnp.maximum(slots[None, :] - cache.start[:, None], 0)  # padding: masked
            q, k, v = self.project(x, positions)
            cache = cache.write(k, v)
            slot = jnp.arange(cache.keys.shape[1], dtype=jnp.int32)
            visible = (slot[None, None, :] <= slots[None, :, None]) & (
                slot[None, None, :] >= cache.start[:, None, None]
            )  # [batch, seq, slots]: causal, and never a row's padding
            out = attend(q, cache.keys, cache.values, implementation=implementation, mask=visible)
        out = nn.with_logical_constraint(
            out.reshape(batch, seq, width), ("batch", "length", "embed")
        )
        out = self.resid_dropout(self.c_proj(out), deterministic=deterministic)
        return out if cache is None else (out, cache)

    def _heads_first(
        self, x: jax.Array, segments: jax.Array | None, prefixes: jax.Array | None, dropout: bool
    ) -> bool:
        """Whether this call takes the fused path of `_fused`: the splash kernel serves it
        (`choose`), no listener of `theseus.model.hooks` is in the way (it would miss
        `c_attn`'s and `c_proj`'s calls), the parameters exist, and no `qk_norm` (which
        normalizes across a token's heads)."""
        cfg = self.config
        if self.is_initializing() or cfg.qk_norm or hooks.listening_depth():
            return False
        name, _ = choose(
            cfg.attention,
            q_len=x.shape[1],
            kv_len=x.shape[1],
            dtype=resolve_dtype(cfg.dtype),
            segmented=segments is not None,
            prefixed=prefixes is not None,
            dropout=dropout,
        )
        return name == "splash"

    def _fused(
        self, x: jax.Array, positions: jax.Array | None, segments: jax.Array | None
    ) -> jax.Array:
        """`c_proj(attention(c_attn(x)))` in the splash kernel's own layout, before dropout.

        Queries, keys and values are projected straight into `[batch, heads, seq,
        head_dim]` by one einsum each with their columns of `c_attn`'s kernel, and the
        kernel's output is read by `c_proj`'s kernel as `[heads, head_dim, n_embd]`: the
        same products as the module path, with nothing transposed around the kernel (on
        a TPU v5e this made the 124M GPT's step 6% faster and the 354M one's 5%).
        """
        cfg = self.config
        dtype = resolve_dtype(cfg.dtype)
        width = x.shape[-1]
        head_dim = cfg.head_dim
        into = nn.meta.unbox(self.c_attn.variables["params"])
        kernel, x = into["kernel"].astype(dtype), x.astype(dtype)
        parts, start = [], 0
        for heads in (cfg.n_head, cfg.kv_head_count, cfg.kv_head_count):
            columns = slice(start, start + heads * head_dim)
            part = jnp.einsum("bte,ehd->bhtd", x, kernel[:, columns].reshape(width, heads, -1))
            if "bias" in into:
                part = part + into["bias"][columns].astype(dtype).reshape(heads, 1, head_dim)
            parts.append(part)
            start = columns.stop
        q, k, v = parts
        if cfg.positions == "rotary":
            rotate = partial(
                apply_rotary,
                base=cfg.rope_base,
                positions=positions,
                fraction=cfg.rotary_fraction,
                scaling=cfg.scaling,
                heads_first=True,
            )
            q, k = rotate(q), rotate(k)
        z = attend_heads_first(q, k, v, segments)
        out_of = nn.meta.unbox(self.c_proj.variables["params"])
        kernel = out_of["kernel"].astype(dtype).reshape(cfg.n_head, head_dim, width)
        out = jnp.einsum("bhtd,hde->bte", z.astype(dtype), kernel)
        if "bias" in out_of:
            out = out + out_of["bias"].astype(dtype)
        return nn.with_logical_constraint(out, ("batch", "length", "embed"))


class KVCache(NamedTuple):
    """One attention layer's cache: keys and values `[batch, slots, n_kv_head, head_dim]`,
    how many slots are written (`length`, int32: the next call writes from there), and each row's first real slot
    (`start`, `[batch]` int32: a left-padded prompt's padding is never attended to)."""

    keys: jax.Array
    values: jax.Array
    length: jax.Array
    start: jax.Array

    @classmethod
    def empty(
        cls, config: ModelConfig, batch: int, slots: int, start: jax.Array | None = None
    ) -> KVCache:
        """Zeros for `batch` rows of `slots` positions in the activation dtype, length 0."""
        shape = (batch, slots, config.kv_head_count, config.head_dim)
        zeros = jnp.zeros(shape, resolve_dtype(config.dtype))
        if start is None:
            start = jnp.zeros((batch,), jnp.int32)
        return cls(zeros, zeros, jnp.int32(0), jnp.asarray(start, jnp.int32))

    def write(self, k: jax.Array, v: jax.Array) -> KVCache:
        """Keys and values `[batch, seq, n_kv_head, head_dim]` written at `length`, which moves on."""
        at = (0, self.length, 0, 0)
        keys = jax.lax.dynamic_update_slice(self.keys, k.astype(self.keys.dtype), at)
        values = jax.lax.dynamic_update_slice(self.values, v.astype(self.values.dtype), at)
        return KVCache(keys, values, self.length + k.shape[1], self.start)


def causal_softmax(q: jax.Array, k: jax.Array) -> jax.Array:
    """Causal attention probabilities `[batch, heads, query, key]` in float32.

    Args:
        q: queries `[batch, seq, heads, head_dim]`.
        k: keys `[batch, seq, heads, head_dim]` (or fewer heads, each serving a group).
    """
    return probabilities(q, k)
