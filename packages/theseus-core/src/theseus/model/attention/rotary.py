"""Rotary position embedding: rotate pairs of query and key features by position.

Feature `i` and `i + rot/2` of a head form a pair rotated by angle `pos * inv_freq[i]`,
`inv_freq = base ** (-2i / rot)`, over the first `rot = int(head_dim * fraction)`
features (GPT-NeoX's partial rotary, `rotary_pct`); the rest pass through. Llama 3.1's
`rope_scaling` (`kind = "llama3"`) rescales the frequencies as transformers'
`_compute_llama3_parameters` does: wavelengths beyond the original context are divided
by `factor`, those within `original_context / high_freq_factor` kept, and the band
between interpolated smoothly.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

__all__ = ["RopeScaling", "apply_rotary", "rotary_frequencies", "rotary_width"]


class RopeScaling(NamedTuple):
    """Llama 3.1's frequency scaling (`architecture/rope_scaling/...`)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192


def rotary_width(head_dim: int, fraction: float = 1.0) -> int:
    """How many features of a head rotary rotates: `int(head_dim * fraction)`."""
    return int(head_dim * fraction)


def rotary_frequencies(rot: int, base: float, scaling: RopeScaling | None = None) -> jax.Array:
    """`inv_freq [rot/2]` (float32): `base ** (-2i / rot)`, rescaled by `scaling` if given."""
    inv_freq = base ** (-jnp.arange(rot // 2, dtype=jnp.float32) * 2.0 / rot)
    if scaling is None:
        return inv_freq
    low_wavelen = scaling.original_context / scaling.low_freq_factor
    high_wavelen = scaling.original_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(medium, smoothed, scaled)


def apply_rotary(
    x: jax.Array,
    base: float,
    positions: jax.Array | None = None,
    fraction: float = 1.0,
    scaling: RopeScaling | None = None,
    heads_first: bool = False,
) -> jax.Array:
    """Rotate pairs of features of `x` `[batch, seq, heads, head_dim]` by position.

    Feature `i` and `i + rot/2` form a pair rotated by angle `pos * base**(-2i/rot)`,
    `rot = int(head_dim * fraction)`; features from `rot` on are returned unchanged.

    Args:
        x: queries or keys.
        base: the rotary frequency base.
        positions: `[batch, seq]` integer positions (cached decoding, left padding);
            None: `0 .. seq-1` for every row.
        fraction: the share of each head's features rotated (1: all of them).
        scaling: Llama 3.1's frequency scaling, or None for none.
        heads_first: `x` is `[batch, heads, seq, head_dim]` (the fused attention's layout).
    """
    seq, head_dim = x.shape[2 if heads_first else 1], x.shape[-1]
    rot = rotary_width(head_dim, fraction)
    half = rot // 2
    inv_freq = rotary_frequencies(rot, base, scaling)
    if positions is None:
        angles = jnp.arange(seq, dtype=jnp.float32)[None, :, None] * inv_freq  # [1, seq, half]
    else:
        angles = positions.astype(jnp.float32)[:, :, None] * inv_freq  # [batch, seq, half]
    heads_axis = 1 if heads_first else 2
    cos = jnp.expand_dims(jnp.cos(angles), heads_axis)
    sin = jnp.expand_dims(jnp.sin(angles), heads_axis)
    first, second = x[..., :half].astype(jnp.float32), x[..., half:rot].astype(jnp.float32)
    rotated = jnp.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)
    if rot == head_dim:
        return rotated.astype(x.dtype)
    return jnp.concatenate([rotated.astype(x.dtype), x[..., rot:]], axis=-1)
