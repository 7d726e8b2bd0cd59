"""Each family's tensor names, shapes, and how they become the block's parameter tree.

`plan(family, settings, prefix)` lists, for every leaf of `GPT`'s parameter tree
(`blocks_3/attn/c_attn/kernel`, ...), the checkpoint tensors it is made of, their
shapes, and how it is made: torch `nn.Linear` weights `[out, in]` are transposed to
Flax kernels `[in, out]`; Llama's `q_proj`, `k_proj`, `v_proj` are concatenated into
`c_attn`'s columns (all query heads, then key heads, then value heads); GPT-NeoX's
fused `query_key_value` rows, interleaved per head (`h0: q k v, h1: q k v, ...`), are
regrouped into that order. GPT-2's `Conv1D` weights are already `[in, out]`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BUFFERS", "Leaf", "plan"]

#: Buffers checkpoints carry that are not parameters (causal masks, rotary tables).
BUFFERS = ("attn.bias", "attn.masked_bias", "attention.bias", "attention.masked_bias",
           "rotary_emb.inv_freq")  # fmt: skip


@dataclass(frozen=True)
class Leaf:
    """One parameter: its checkpoint tensors (name -> shape) and how they combine."""

    sources: dict[str, tuple[int, ...]]
    make: Callable[[list[np.ndarray]], np.ndarray]


def _same(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0]


def _transposed(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0].T  # a view: placing it on the device is the one copy


def _concatenated(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts, axis=0)


def _concatenated_transposed(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts, axis=0).T


def _neox_qkv(n_head: int) -> Callable[[list[np.ndarray]], np.ndarray]:
    """`[3 d, ...]` rows per head `(q, k, v)` -> rows all q, all k, all v (then `.T`)."""

    def make(parts: list[np.ndarray]) -> np.ndarray:
        rows = parts[0]
        grouped = rows.reshape(n_head, 3, -1, *rows.shape[1:]).swapaxes(0, 1)
        flat = grouped.reshape(rows.shape)
        return flat.T if flat.ndim == 2 else flat

    return make


def _one(name: str, shape: tuple[int, ...], make: Callable[..., np.ndarray] = _same) -> Leaf:
    return Leaf({name: shape}, make)


def _gpt2(s: dict[str, Any], p: str) -> dict[str, Leaf]:
    d, vocab = s["architecture/n_embd"], s["architecture/vocab_size"]
    inner = s["architecture/mlp_ratio"] * d
    tree = {
        "wte/embedding": _one(p + "wte.weight", (vocab, d)),
        "wpe/embedding": _one(p + "wpe.weight", (s["architecture/block_size"], d)),
        "ln_f/scale": _one(p + "ln_f.weight", (d,)),
        "ln_f/bias": _one(p + "ln_f.bias", (d,)),
    }
    for i in range(s["architecture/n_layers"]):
        h, b = f"{p}h.{i}", f"blocks_{i}"
        for norm in ("ln_1", "ln_2"):
            tree[f"{b}/{norm}/scale"] = _one(f"{h}.{norm}.weight", (d,))
            tree[f"{b}/{norm}/bias"] = _one(f"{h}.{norm}.bias", (d,))
        for ours, theirs, fan_in, fan_out in (
            ("attn/c_attn", "attn.c_attn", d, 3 * d),
            ("attn/c_proj", "attn.c_proj", d, d),
            ("mlp/c_fc", "mlp.c_fc", d, inner),
            ("mlp/c_proj", "mlp.c_proj", inner, d),
        ):
            tree[f"{b}/{ours}/kernel"] = _one(f"{h}.{theirs}.weight", (fan_in, fan_out))
            tree[f"{b}/{ours}/bias"] = _one(f"{h}.{theirs}.bias", (fan_out,))
    if not s["architecture/tie_embeddings"]:
        tree["lm_head/kernel"] = _one("lm_head.weight", (vocab, d), _transposed)
    return tree


def _bias(s: dict[str, Any], key: str) -> bool:
    value = s.get(f"architecture/{key}")
    return bool(s["architecture/bias"] if value is None else value)


def _dense(
    tree: dict[str, Leaf], ours: str, theirs: str, fan_in: int, fan_out: int, bias: bool
) -> None:
    tree[f"{ours}/kernel"] = _one(f"{theirs}.weight", (fan_out, fan_in), _transposed)
    if bias:
        tree[f"{ours}/bias"] = _one(f"{theirs}.bias", (fan_out,))


def _norm(tree: dict[str, Leaf], ours: str, theirs: str, width: int, bias: bool) -> None:
    tree[f"{ours}/scale"] = _one(f"{theirs}.weight", (width,))
    if bias:
        tree[f"{ours}/bias"] = _one(f"{theirs}.bias", (width,))


def _gpt_neox(s: dict[str, Any], p: str) -> dict[str, Leaf]:
    d, vocab, n_head = (
        s["architecture/n_embd"],
        s["architecture/vocab_size"],
        s["architecture/n_head"],
    )
    width, norm_bias = s["architecture/mlp_width"], _bias(s, "norm_bias")
    tree = {"wte/embedding": _one(p + "embed_in.weight", (vocab, d))}
    _norm(tree, "ln_f", p + "final_layer_norm", d, norm_bias)
    for i in range(s["architecture/n_layers"]):
        h, b = f"{p}layers.{i}", f"blocks_{i}"
        _norm(tree, f"{b}/ln_1", f"{h}.input_layernorm", d, norm_bias)
        _norm(tree, f"{b}/ln_2", f"{h}.post_attention_layernorm", d, norm_bias)
        qkv = f"{h}.attention.query_key_value"
        tree[f"{b}/attn/c_attn/kernel"] = _one(f"{qkv}.weight", (3 * d, d), _neox_qkv(n_head))
        if _bias(s, "qkv_bias"):
            tree[f"{b}/attn/c_attn/bias"] = _one(f"{qkv}.bias", (3 * d,), _neox_qkv(n_head))
        _dense(tree, f"{b}/attn/c_proj", f"{h}.attention.dense", d, d, _bias(s, "attn_out_bias"))
        _dense(tree, f"{b}/mlp/c_fc", f"{h}.mlp.dense_h_to_4h", d, width, _bias(s, "mlp_bias"))
        _dense(tree, f"{b}/mlp/c_proj", f"{h}.mlp.dense_4h_to_h", width, d, _bias(s, "mlp_bias"))
    if not s["architecture/tie_embeddings"]:
        tree["lm_head/kernel"] = _one("embed_out.weight", (vocab, d), _transposed)
    return tree


def _llama(s: dict[str, Any], p: str, olmo2: bool) -> dict[str, Leaf]:
    d, vocab, n_head = (
        s["architecture/n_embd"],
        s["architecture/vocab_size"],
        s["architecture/n_head"],
    )
    head, width = d // n_head, s["architecture/mlp_width"]
    kv = s["architecture/n_kv_head"] * head
    tree = {"wte/embedding": _one(p + "embed_tokens.weight", (vocab, d))}
    _norm(tree, "ln_f", p + "norm", d, False)
    first, second = (
        ("post_attention_layernorm", "post_feedforward_layernorm")
        if olmo2
        else ("input_layernorm", "post_attention_layernorm")
    )
    for i in range(s["architecture/n_layers"]):
        h, b = f"{p}layers.{i}", f"blocks_{i}"
        _norm(tree, f"{b}/ln_1", f"{h}.{first}", d, False)
        _norm(tree, f"{b}/ln_2", f"{h}.{second}", d, False)
        attn = f"{h}.self_attn"
        widths = {"q": n_head * head, "k": kv, "v": kv}
        tree[f"{b}/attn/c_attn/kernel"] = Leaf(
            {f"{attn}.{x}_proj.weight": (w, d) for x, w in widths.items()},
            _concatenated_transposed,
        )
        if _bias(s, "qkv_bias"):
            tree[f"{b}/attn/c_attn/bias"] = Leaf(
                {f"{attn}.{x}_proj.bias": (w,) for x, w in widths.items()}, _concatenated
            )
        if olmo2:
            tree[f"{b}/attn/q_norm/scale"] = _one(f"{attn}.q_norm.weight", (n_head * head,))
            tree[f"{b}/attn/k_norm/scale"] = _one(f"{attn}.k_norm.weight", (kv,))
        _dense(
            tree, f"{b}/attn/c_proj", f"{attn}.o_proj", n_head * head, d, _bias(s, "attn_out_bias")
        )
        mlp_bias = _bias(s, "mlp_bias")
        _dense(tree, f"{b}/mlp/c_gate", f"{h}.mlp.gate_proj", d, width, mlp_bias)
        _dense(tree, f"{b}/mlp/c_fc", f"{h}.mlp.up_proj", d, width, mlp_bias)
        _dense(tree, f"{b}/mlp/c_proj", f"{h}.mlp.down_proj", width, d, mlp_bias)
    if not s["architecture/tie_embeddings"]:
        tree["lm_head/kernel"] = _one("lm_head.weight", (vocab, d), _transposed)
    return tree


def plan(family: str, settings: dict[str, Any], prefix: str) -> dict[str, Leaf]:
    """`{"blocks_0/attn/c_attn/kernel": Leaf, ...}` for one folder's settings.

    Args:
        family: a value of `FAMILIES` (`gpt2`, `gpt_neox`, `llama`, `olmo2`).
        settings: the `architecture/...` settings `settings_of` gave.
        prefix: how the folder names the body's tensors (`transformer.`, `gpt_neox.`,
            `model.` or `""`); the output head (`lm_head`, `embed_out`) never has one.
    """
    if family == "gpt2":
        return _gpt2(settings, prefix)
    if family == "gpt_neox":
        return _gpt_neox(settings, prefix)
    return _llama(settings, prefix, olmo2=family == "olmo2")
