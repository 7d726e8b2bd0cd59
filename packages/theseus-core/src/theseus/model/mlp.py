"""The position-wise feed-forward network: plain or gated (SwiGLU), of any hidden width.

Plain: `c_proj(act(c_fc(x)))` (GPT-2, GPT-NeoX). Gated (`architecture/gated_mlp`):
`c_proj(act(c_gate(x)) * c_fc(x))`, so SwiGLU is `activation = silu` with
`gated_mlp = true` (Llama's `gate_proj` is `c_gate`, `up_proj` `c_fc`, `down_proj`
`c_proj`). The hidden width is `architecture/mlp_width`, or `mlp_ratio * n_embd` when
that is 0; `architecture/mlp_bias` (default: `architecture/bias`) gives the three
projections biases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import flax.linen as nn
import jax

from theseus.config import field
from theseus.model.component import Component, resolve_dtype

__all__ = ["ACTIVATIONS", "MLP", "MLPConfig"]


@dataclass(frozen=True)
class MLPConfig:
    """Settings read by `MLP`."""

    n_embd: int = field(
        "architecture/n_embd", default=128, ge=1, help="width of the residual stream"
    )
    mlp_ratio: int = field("architecture/mlp_ratio", default=4, ge=1, help="hidden width / n_embd")
    mlp_width: int = field(
        "architecture/mlp_width",
        default=0,
        ge=0,
        help="the MLP's hidden width (Llama's intermediate_size); 0: mlp_ratio * n_embd",
    )
    dropout: float = field(
        "architecture/dropout", default=0.0, ge=0, lt=1, help="dropout probability"
    )
    bias: bool = field("architecture/bias", default=False, help="biases in dense layers and norms")
    mlp_bias: bool | None = field(
        "architecture/mlp_bias",
        default=None,
        help="biases on the MLP's projections; None: architecture/bias",
    )
    activation: Literal["gelu_tanh", "gelu", "relu", "silu"] = field(
        "architecture/activation",
        default="gelu_tanh",
        help="the MLP's nonlinearity: GELU with the tanh approximation (GPT-2's), exact GELU, "
        "ReLU, SiLU (Llama's, with gated_mlp)",
    )
    gated_mlp: bool = field(
        "architecture/gated_mlp",
        default=False,
        help="hidden = act(c_gate(x)) * c_fc(x) (SwiGLU with activation silu)",
    )
    param_dtype: str = field("architecture/dtype/param", default="float32", help="parameter dtype")
    dtype: str = field("architecture/dtype/activation", default="float32", help="activation dtype")

    @property
    def hidden(self) -> int:
        """The hidden width: `mlp_width`, or `mlp_ratio * n_embd` when it is 0."""
        return self.mlp_width or self.mlp_ratio * self.n_embd


ACTIVATIONS = {
    "gelu_tanh": lambda x: nn.gelu(x, approximate=True),
    "gelu": lambda x: nn.gelu(x, approximate=False),
    "relu": nn.relu,
    "silu": nn.silu,
}


class MLP(nn.Module, Component):
    """Position-wise feed-forward: `x [batch, seq, n_embd] -> [batch, seq, n_embd]`."""

    CONFIG = MLPConfig
    config: MLPConfig

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
