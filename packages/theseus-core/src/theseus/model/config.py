"""The model's configuration: every `architecture/*` key, declared once.

`ModelConfig` holds every setting the model reads: sizes, attention (grouped-query
heads, positions and rotary settings, QK-norm, biases, the attention computation), the
MLP, norms, the residual layout, dtypes, and the two memory settings `training/remat` and
`training/loss_chunk`. `GPT`, `Block`, `SelfAttention` and `MLP` all read it, so each
key has one declaration, one default and one help text. `GPTConfig`, `AttentionConfig`
and `MLPConfig`, the three dataclasses earlier versions declared, are names of it:
`GPT(GPTConfig(...), AttentionConfig(...), MLPConfig(...))` still builds a model, and
configuration files, saved configurations and checkpoints keep their keys (no key was
renamed). Each `@rule` refuses a combination the model cannot build, in one line, when
the configuration is checked (before a job writes anything).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from theseus.config import field, rule
from theseus.model.attention.rotary import RopeScaling, rotary_width

__all__ = [
    "AttentionConfig",
    "GPTConfig",
    "MLPConfig",
    "ModelConfig",
    "head_width",
    "kv_heads",
    "kv_shard",
    "rope_scaling",
    "rotated",
]


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


@rule("architecture/n_head", "architecture/n_kv_head")
def kv_heads(n_head: int, n_kv_head: int) -> str | None:
    """Query heads split evenly over `n_kv_head` key/value heads (0: as many as query heads)."""
    if n_kv_head == 0 or n_head % n_kv_head == 0:
        return None
    fits = ", ".join(str(d) for d in range(1, n_head + 1) if n_head % d == 0)
    return (
        f"Configuration value for 'architecture/n_kv_head' must divide architecture/n_head "
        f"({n_head}) so each key/value head serves the same number of query heads; got "
        f"{n_kv_head}. Set architecture/n_kv_head to one of {fits} (or 0: one per query head)."
    )


@rule("architecture/n_head", "architecture/n_kv_head", "training/shard")
def kv_shard(n_head: int, n_kv_head: int, shard: int) -> str | None:
    """`training/shard` splits grouped key/value heads whole (a trainer's configuration only)."""
    if n_kv_head in (0, n_head) or shard <= 1 or n_kv_head % shard == 0:
        return None
    fits = ", ".join(str(d) for d in range(1, n_kv_head + 1) if n_kv_head % d == 0)
    return (
        f"Configuration value for 'training/shard' must split architecture/n_kv_head "
        f"({n_kv_head}) key/value heads evenly over the tensor-parallel devices; got {shard}. "
        f"Set training/shard to one of {fits}, or use training/strategy=fsdp with "
        "training/shard=1."
    )


@rule(
    "architecture/n_embd",
    "architecture/n_head",
    "architecture/positions",
    "architecture/rotary_fraction",
)
def rotated(n_embd: int, n_head: int, positions: str, fraction: float) -> str | None:
    """Partial rotary rotates an even, non-zero number of each head's features."""
    if fraction == 1.0 or n_embd % n_head:
        return None
    if positions != "rotary":
        return (
            f"Configuration value for 'architecture/rotary_fraction' only applies to rotary "
            f"positions; got {fraction} with architecture/positions = {positions}. Set "
            "`architecture.rotary_fraction=1.0`, or `architecture.positions=rotary`."
        )
    head_dim = n_embd // n_head
    rot = rotary_width(head_dim, fraction)
    if rot == 0 or rot % 2:
        even = max(2, round(head_dim * fraction / 2) * 2)
        return (
            f"Configuration value for 'architecture/rotary_fraction' must rotate an even, "
            f"non-zero number of each head's {head_dim} features; got {fraction}, which "
            f"rotates int({head_dim} * {fraction}) = {rot}. Choose a fraction f with "
            f"int({head_dim} * f) even, e.g. {even}/{head_dim} = {even / head_dim:g}."
        )
    return None


@rule(
    "architecture/positions",
    "architecture/rope_scaling/kind",
    "architecture/rope_scaling/low_freq_factor",
    "architecture/rope_scaling/high_freq_factor",
)
def rope_scaling(positions: str, kind: str, low: float, high: float) -> str | None:
    """Llama 3.1's scaling needs rotary positions and `low_freq_factor < high_freq_factor`."""
    if kind == "none":
        return None
    if positions != "rotary":
        return (
            f"Configuration value for 'architecture/rope_scaling/kind' only applies to rotary "
            f"positions; got {kind!r} with architecture/positions = {positions}. Set "
            "`architecture.rope_scaling.kind=none`, or `architecture.positions=rotary`."
        )
    if low >= high:
        return (
            f"Configuration value for 'architecture/rope_scaling/high_freq_factor' must exceed "
            f"architecture/rope_scaling/low_freq_factor ({low}); got {high}. Set them as the "
            "model's config.json does (Llama 3.1: 1.0 and 4.0)."
        )
    return None


@dataclass(frozen=True)
class ModelConfig:
    """Every setting the model reads (`architecture/*`, `training/remat`, `training/loss_chunk`)."""

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
    n_head: int = field(
        "architecture/n_head", default=4, ge=1, rules=[head_width], help="attention heads per layer"
    )
    n_kv_head: int = field(
        "architecture/n_kv_head",
        default=0,
        ge=0,
        rules=[kv_heads, kv_shard],
        help="key/value heads (grouped-query attention); 0: one per query head",
    )
    qkv_bias: bool | None = field(
        "architecture/qkv_bias",
        default=None,
        help="a bias on the query/key/value projection c_attn; None: architecture/bias",
    )
    attn_out_bias: bool | None = field(
        "architecture/attn_out_bias",
        default=None,
        help="a bias on the attention's output projection c_proj; None: architecture/bias",
    )
    rope_base: float = field(
        "architecture/rope_base", default=10000.0, gt=0, help="rotary frequency base"
    )
    rotary_fraction: float = field(
        "architecture/rotary_fraction",
        default=1.0,
        gt=0,
        le=1,
        rules=[rotated],
        help="share of each head's features rotary rotates (GPT-NeoX rotary_pct)",
    )
    rope_scaling_kind: Literal["none", "llama3"] = field(
        "architecture/rope_scaling/kind",
        default="none",
        rules=[rope_scaling],
        help="rotary frequency scaling: 'none', or Llama 3.1's 'llama3'",
    )
    rope_scaling_factor: float = field(
        "architecture/rope_scaling/factor", default=8.0, gt=0, help="llama3: the scaling factor"
    )
    rope_scaling_low_freq_factor: float = field(
        "architecture/rope_scaling/low_freq_factor",
        default=1.0,
        gt=0,
        help="llama3: wavelengths beyond original_context / this are divided by factor",
    )
    rope_scaling_high_freq_factor: float = field(
        "architecture/rope_scaling/high_freq_factor",
        default=4.0,
        gt=0,
        help="llama3: wavelengths below original_context / this are kept",
    )
    rope_scaling_original_context: int = field(
        "architecture/rope_scaling/original_context",
        default=8192,
        ge=1,
        help="llama3: the context length the model was first trained on",
    )
    qk_norm: bool = field(
        "architecture/qk_norm",
        default=False,
        help="normalize all query and all key features after the projection (OLMo-2)",
    )
    attention: Literal["auto", "reference", "splash", "flash", "cudnn"] = field(
        "architecture/attention",
        default="auto",
        help="how attention is computed: 'auto' (the fastest the platform has: Pallas splash "
        "on a TPU, cuDNN on a GPU, the reference on a CPU), 'reference', or a fused kernel "
        "('splash', 'flash': TPU; 'cudnn': GPU); a call a kernel cannot serve uses the "
        "reference and says so once",
    )
    mlp_ratio: int = field("architecture/mlp_ratio", default=4, ge=1, help="hidden width / n_embd")
    mlp_width: int = field(
        "architecture/mlp_width",
        default=0,
        ge=0,
        help="the MLP's hidden width (Llama's intermediate_size); 0: mlp_ratio * n_embd",
    )
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

    @property
    def kv_head_count(self) -> int:
        """The key/value heads: `n_kv_head`, or `n_head` when it is 0."""
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        """Each head's width, `n_embd // n_head`."""
        return self.n_embd // self.n_head

    @property
    def scaling(self) -> RopeScaling | None:
        """The rotary frequency scaling, or None for `rope_scaling/kind = none`."""
        if self.rope_scaling_kind == "none":
            return None
        return RopeScaling(
            self.rope_scaling_factor,
            self.rope_scaling_low_freq_factor,
            self.rope_scaling_high_freq_factor,
            self.rope_scaling_original_context,
        )

    @property
    def hidden(self) -> int:
        """The hidden width: `mlp_width`, or `mlp_ratio * n_embd` when it is 0."""
        return self.mlp_width or self.mlp_ratio * self.n_embd


#: The names of the three dataclasses earlier versions declared (GPT's, the attention's, the MLP's).
GPTConfig = ModelConfig
AttentionConfig = ModelConfig
MLPConfig = ModelConfig
