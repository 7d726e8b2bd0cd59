"""The model's normalization layers: LayerNorm or RMSNorm, one choice for every norm.

`architecture/norm` picks the kind for `ln_1`, `ln_2`, `ln_f` and, with
`architecture/qk_norm`, the attention's `q_norm` and `k_norm`; `architecture/norm_eps`
is every norm's epsilon. A LayerNorm has `scale` and, with `architecture/norm_bias`
(default: `architecture/bias`), `bias`; an RMSNorm has `scale` only (as Llama's,
Qwen2's and OLMo-2's): `x / sqrt(mean(x**2) + eps) * scale`.
"""

from __future__ import annotations

from typing import Literal

import flax.linen as nn

from theseus.model.component import resolve_dtype

__all__ = ["NormKind", "make_norm"]

NormKind = Literal["layernorm", "rmsnorm"]


def make_norm(
    kind: str,
    *,
    eps: float,
    bias: bool,
    dtype: str,
    param_dtype: str,
    name: str,
    axis: str = "embed",
) -> nn.Module:
    """A norm over the last axis, its parameters along logical axis `axis`.

    Args:
        kind: `"layernorm"` or `"rmsnorm"`.
        eps: the epsilon added to the variance (or mean square).
        bias: a LayerNorm's bias (an RMSNorm has none whatever this says).
        dtype: the activation dtype's configuration name.
        param_dtype: the parameter dtype's configuration name.
        name: the module's name (its path in the parameter tree).
        axis: the logical axis of `scale` (and `bias`).
    """
    scale_init = nn.with_logical_partitioning(nn.initializers.ones, (axis,))
    if kind == "rmsnorm":
        return nn.RMSNorm(
            epsilon=eps,
            dtype=resolve_dtype(dtype),
            param_dtype=resolve_dtype(param_dtype),
            scale_init=scale_init,
            name=name,
        )
    return nn.LayerNorm(
        epsilon=eps,
        use_bias=bias,
        dtype=resolve_dtype(dtype),
        param_dtype=resolve_dtype(param_dtype),
        scale_init=scale_init,
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (axis,)),
        name=name,
    )
