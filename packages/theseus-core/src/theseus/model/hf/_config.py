"""config.json to Theseus's `architecture/...` settings, per Hugging Face `model_type`.

Each family maps to the one decoder block (see `theseus.model.models`): GPT-2 (learned
positions), GPT-NeoX (partial rotary, parallel residual, exact GELU, untied), and the
Llama family (Llama, Mistral, Qwen2, OLMo-2: RMSNorm, SwiGLU, grouped-query attention;
OLMo-2 with post-norm residuals and QK-norm). Rotary settings are read in both
spellings: transformers 5's `rope_parameters` (`rope_type`, `rope_theta`,
`partial_rotary_factor`, `factor`, ...) and the older top-level `rope_theta`,
`rope_scaling` (`type` or `rope_type`), `rotary_pct`, `rotary_emb_base`. A setting the
block cannot reproduce is refused by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from theseus.errors import TheseusError

__all__ = ["FAMILIES", "HFFolderError", "settings_of"]

#: `model_type`s the import reads, and the family whose tensor names each uses.
FAMILIES = {
    "gpt2": "gpt2",
    "gpt_neox": "gpt_neox",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "olmo2": "olmo2",
}
_GELU = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
         "gelu_fast": "gelu_tanh", "relu": "relu"}  # fmt: skip
_ROPE_TYPES = ("default", "llama3")
# Settings of GPT2Config that change the computation, with the value the block computes.
_GPT2_FIXED = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "add_cross_attention": False,
}


class HFFolderError(TheseusError, ValueError):
    """A folder that is not a model this import can load (the message names what is wrong)."""


def _integer(config: dict[str, Any], where: Path, *names: str, default: int | None = None) -> int:
    for name in names:
        value = config.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise HFFolderError(f"{where}: {name} is {value!r}; expected a positive integer")
            return value
    if default is not None:
        return default
    raise HFFolderError(f"{where} has no {names[0]}; a {config.get('model_type')} config sets it")


def _number(config: dict[str, Any], where: Path, name: str, default: float) -> float:
    value = config.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise HFFolderError(f"{where}: {name} is {value!r}; expected a positive number")
    return float(value)


def _rope(
    config: dict[str, Any], where: Path, base_default: float, fraction_default: float
) -> dict[str, Any]:
    """Rotary settings from either spelling: `rope_parameters`, or `rope_theta`/`rope_scaling`."""
    params = config.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise HFFolderError(f"{where}: rope_parameters is {params!r}; expected a JSON object")
    if params:
        source, spelled = dict(params), "rope_parameters"
    else:
        scaling = config.get("rope_scaling") or {}
        if not isinstance(scaling, dict):
            raise HFFolderError(f"{where}: rope_scaling is {scaling!r}; expected a JSON object")
        source, spelled = dict(scaling), "rope_scaling"
    kind = source.get("rope_type", source.get("type", "default"))
    if kind not in _ROPE_TYPES:
        raise HFFolderError(
            f"{where}: {spelled} has rope type {kind!r}, which Theseus does not compute; "
            f"supported: {', '.join(_ROPE_TYPES)}"
        )
    top = {"rope_theta": config.get("rope_theta", config.get("rotary_emb_base"))}
    base = _number({**top, **source}, where, "rope_theta", base_default)
    fraction = source.get(
        "partial_rotary_factor",
        config.get("partial_rotary_factor", config.get("rotary_pct", fraction_default)),
    )
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise HFFolderError(f"{where}: the rotary fraction is {fraction!r}; expected 0 < f <= 1")
    out: dict[str, Any] = {
        "architecture/positions": "rotary",
        "architecture/rope_base": base,
        "architecture/rotary_fraction": float(fraction),
    }
    if kind == "llama3":
        out["architecture/rope_scaling/kind"] = "llama3"
        for key, name in (("factor", "factor"), ("low_freq_factor", "low_freq_factor"),
                          ("high_freq_factor", "high_freq_factor")):  # fmt: skip
            if name not in source:
                raise HFFolderError(f"{where}: {spelled} of type llama3 has no {name}")
            out[f"architecture/rope_scaling/{key}"] = _number(source, where, name, 1.0)
        out["architecture/rope_scaling/original_context"] = _integer(
            source, where, "original_max_position_embeddings"
        )
    return out


def _rotated(settings: dict[str, Any], where: Path) -> None:
    head = settings["architecture/n_embd"] // settings["architecture/n_head"]
    rotated = int(head * settings["architecture/rotary_fraction"])
    if rotated < 2 or rotated % 2:
        raise HFFolderError(
            f"{where}: the rotary fraction {settings['architecture/rotary_fraction']} of head "
            f"width {head} rotates {rotated} features; it must be an even count >= 2"
        )


def _sizes(config: dict[str, Any], where: Path) -> dict[str, Any]:
    n_embd = _integer(config, where, "hidden_size", "n_embd")
    n_head = _integer(config, where, "num_attention_heads", "n_head")
    if n_embd % n_head:
        raise HFFolderError(f"{where}: hidden_size {n_embd} does not split into {n_head} heads")
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim != n_embd // n_head:
        raise HFFolderError(
            f"{where}: head_dim is {head_dim!r}, but Theseus's heads are hidden_size / "
            f"num_attention_heads = {n_embd // n_head} wide"
        )
    return {
        "architecture/n_layers": _integer(config, where, "num_hidden_layers", "n_layer"),
        "architecture/n_embd": n_embd,
        "architecture/n_head": n_head,
        "architecture/block_size": _integer(config, where, "max_position_embeddings"),
        "architecture/vocab_size": _integer(config, where, "vocab_size"),
        "architecture/mlp_width": _integer(config, where, "intermediate_size"),
        "architecture/dropout": 0.0,
    }


def _gpt2(config: dict[str, Any], where: Path) -> dict[str, Any]:
    """GPT-2: learned positions, biases in every dense layer and norm, tied embeddings by
    default, `n_inner` (default 4 x `n_embd`) a multiple of the width, and dropout from
    `resid_pdrop` (GPT2Config's 0.1 when absent)."""
    for key, wanted in _GPT2_FIXED.items():
        if key in config and config[key] != wanted:
            raise HFFolderError(
                f"{where}: {key} is {config[key]!r}; this model computes GPT-2 with "
                f"{key} = {wanted}"
            )
    n_layer = _integer(config, where, "n_layer", "num_hidden_layers")
    n_embd = _integer(config, where, "n_embd", "hidden_size")
    n_head = _integer(config, where, "n_head", "num_attention_heads")
    n_positions = _integer(config, where, "n_positions", "n_ctx", "max_position_embeddings")
    vocab_size = _integer(config, where, "vocab_size")
    if n_embd % n_head:
        raise HFFolderError(f"{where}: n_embd {n_embd} does not split into n_head {n_head}")
    inner = config.get("n_inner") or 4 * n_embd
    if not isinstance(inner, int) or inner % n_embd:
        raise HFFolderError(
            f"{where}: n_inner is {inner!r}; this model needs a multiple of n_embd ({n_embd})"
        )
    activation = config.get("activation_function", "gelu_new")
    if activation not in _GELU:
        raise HFFolderError(
            f"{where}: activation_function {activation!r} is not one this model computes; "
            f"supported: {', '.join(sorted(_GELU))}"
        )
    eps = config.get("layer_norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < 1:
        raise HFFolderError(f"{where}: layer_norm_epsilon is {eps!r}; expected a small number")
    dropout = config.get("resid_pdrop", 0.1)
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise HFFolderError(f"{where}: resid_pdrop is {dropout!r}; expected a probability")
    return {
        "architecture/n_layers": n_layer,
        "architecture/n_embd": n_embd,
        "architecture/n_head": n_head,
        "architecture/block_size": n_positions,
        "architecture/vocab_size": vocab_size,
        "architecture/mlp_ratio": inner // n_embd,
        "architecture/activation": _GELU[activation],
        "architecture/norm_eps": float(eps),
        "architecture/dropout": float(dropout),
        "architecture/positions": "learned",
        "architecture/bias": True,
        "architecture/tie_embeddings": bool(config.get("tie_word_embeddings", True)),
    }


def _gpt_neox(config: dict[str, Any], where: Path) -> dict[str, Any]:
    act = config.get("hidden_act", "gelu")
    if act not in _GELU:
        raise HFFolderError(
            f"{where}: hidden_act {act!r} is not one Theseus computes for gpt_neox; "
            f"supported: {', '.join(sorted(_GELU))}"
        )
    attention_bias = bool(config.get("attention_bias", True))
    settings = {
        **_sizes(config, where),
        **_rope(config, where, 10000.0, 0.25),
        "architecture/activation": _GELU[act],
        "architecture/norm": "layernorm",
        "architecture/norm_eps": _number(config, where, "layer_norm_eps", 1e-5),
        "architecture/residual": (
            "parallel" if config.get("use_parallel_residual", True) else "sequential"
        ),
        "architecture/bias": True,
        "architecture/qkv_bias": attention_bias,
        "architecture/attn_out_bias": attention_bias,
        "architecture/tie_embeddings": bool(config.get("tie_word_embeddings", False)),
    }
    _rotated(settings, where)
    return settings


def _llama(config: dict[str, Any], where: Path) -> dict[str, Any]:
    kind = config["model_type"]
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise HFFolderError(f"{where}: hidden_act {act!r}; a {kind} Theseus computes uses silu")
    settings = {**_sizes(config, where), **_rope(config, where, 10000.0, 1.0)}
    n_head = settings["architecture/n_head"]
    n_kv = _integer(config, where, "num_key_value_heads", default=n_head)
    if n_head % n_kv:
        raise HFFolderError(
            f"{where}: num_attention_heads {n_head} is not a multiple of num_key_value_heads {n_kv}"
        )
    attention_bias = bool(config.get("attention_bias", False))
    settings.update({
        "architecture/n_kv_head": n_kv,
        "architecture/activation": "silu",
        "architecture/gated_mlp": True,
        "architecture/norm": "rmsnorm",
        "architecture/norm_eps": _number(config, where, "rms_norm_eps", 1e-6),
        "architecture/residual": "post_norm" if kind == "olmo2" else "sequential",
        "architecture/qk_norm": kind == "olmo2",
        "architecture/bias": False,
        "architecture/qkv_bias": True if kind == "qwen2" else attention_bias,
        "architecture/attn_out_bias": False if kind == "qwen2" else attention_bias,
        "architecture/mlp_bias": bool(config.get("mlp_bias", False)),
        "architecture/tie_embeddings": bool(config.get("tie_word_embeddings", False)),
    })  # fmt: skip
    _rotated(settings, where)
    return settings


def settings_of(config: dict[str, Any], where: Path) -> tuple[dict[str, Any], list[str]]:
    """The settings that reproduce `config` (a parsed config.json) and notes to print.

    Mistral's (and Qwen2's, when `use_sliding_window`) sliding window: a window at least
    the context changes nothing; a shorter one caps `block_size` to the window, where
    full causal attention is the same computation, and a note says so.

    Raises:
        HFFolderError: an unsupported `model_type` (the supported ones listed), rope
            type, activation or size.
    """
    kind = config.get("model_type")
    if kind not in FAMILIES:
        raise HFFolderError(
            f"{where} describes model_type {kind!r}; theseus import hf reads "
            f"{', '.join(sorted(FAMILIES))}"
        )
    family = FAMILIES[kind]
    if family == "gpt2":
        return _gpt2(config, where), []
    settings = _gpt_neox(config, where) if family == "gpt_neox" else _llama(config, where)
    notes = []
    window = config.get("sliding_window")
    windowed = kind == "mistral" or (kind == "qwen2" and config.get("use_sliding_window"))
    if windowed and window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise HFFolderError(
                f"{where}: sliding_window is {window!r}; expected a positive integer"
            )
        if window < settings["architecture/block_size"]:
            notes.append(
                f"sliding_window {window} is shorter than max_position_embeddings "
                f"{settings['architecture/block_size']}: block_size is capped to {window}, "
                "where every token attends to all before it as in the window"
            )
            settings["architecture/block_size"] = window
    return settings, notes
