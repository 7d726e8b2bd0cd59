"""The position-wise feed-forward network: plain or gated (SwiGLU), of any hidden width.

Plain: `c_proj(act(c_fc(x)))` (GPT-2, GPT-NeoX). Gated (`architecture/gated_mlp`):
`c_proj(act(c_gate(x)) * c_fc(x))`, so SwiGLU is `activation = silu` with
`gated_mlp = true` (Llama's `gate_proj` is `c_gate`, `up_proj` `c_fc`, `down_proj`
`c_proj`). The hidden width is `architecture/mlp_width`, or `mlp_ratio * n_embd` when
that is 0; `architecture/mlp_bias` (default: `architecture/bias`) gives the three
projections biases.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from theseus.model.component import Component, resolve_dtype
from theseus.model.config import MLPConfig, ModelConfig

__all__ = ["ACTIVATIONS", "MLP", "MLPConfig"]


ACTIVATIONS = {
    "gelu_tanh": lambda x: nn.gelu(x, approximate=True),
    "gelu": lambda x: nn.gelu(x, approximate=False),
    "relu": nn.relu,
    "silu": nn.silu,
}


class MLP(nn.Module, Component):
    """Position-wise feed-forward: `x [batch, seq, n_embd] -> [batch, seq, n_embd]`."""

    CONFIG = ModelConfig
    config: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        cfg = self.config
        dense = {
            "use_bias": cfg.bias if cfg.mlp_bias is None else cfg.mlp_bias,
            "dtype": resolve_dtype(cfg.dtype),
            "param_dtype": resolve_dtype(cfg.param_dtype),
        }
        init = nn.initializers.normal(0.02)
        hidden = nn.Dense(
            cfg.hidden,
            kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")),
            name="c_fc",
            **dense,
        )(x)
        if cfg.gated_mlp:
            gate = nn.Dense(
                cfg.hidden,
                kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")),
                name="c_gate",
                **dense,
            )(x)
            hidden = ACTIVATIONS[cfg.activation](gate) * hidden
        else:
            hidden = ACTIVATIONS[cfg.activation](hidden)
        hidden = nn.with_logical_constraint(hidden, ("batch", "length", "mlp"))
        out = nn.Dense(
            cfg.n_embd,
            kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")),
            name="c_proj",
            **dense,
        )(hidden)
        return nn.Dropout(cfg.dropout)(out, deterministic=deterministic)
