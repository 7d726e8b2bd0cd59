"""Small random Hugging Face folders of each family, written without transformers, and
float64 NumPy forwards written from each family's Hugging Face definition.

`write_folder(family, folder, ...)` writes what `save_pretrained` writes for
`GPTNeoXForCausalLM`, `LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM` and
`Olmo2ForCausalLM`: `config.json` (in the older spelling or transformers 5's
`rope_parameters`), the weights under Hugging Face's names (torch `[out, in]`), in one
`model.safetensors` or sharded with `model.safetensors.index.json`, buffers some
checkpoints carry, and a `tokenizer.json`. `hf_forward` is the model on one sequence
from those tensors, as the modeling files compute it (GPT-NeoX's per-head fused QKV,
rotate_half rotary on the first rotary_pct of each head, Llama 3's rope scaling,
grouped-query heads, RMSNorm, SwiGLU, OLMo-2's post-norms and QK-norm).
`tree_forward` is the same model over the Theseus parameter tree the contract
(docs/architecture.md, "The decoder block") describes, so the import's mapping is
checked without the model; `test_hf.py` also runs the model itself.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

LLAMAS = ("llama", "mistral", "qwen2", "olmo2")
FAMILIES = ("gpt_neox", *LLAMAS)
ARCHITECTURES = {"gpt_neox": "GPTNeoXForCausalLM", "llama": "LlamaForCausalLM",
                 "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "olmo2": "Olmo2ForCausalLM"}  # fmt: skip


def write_tokenizer(folder: Path, *, bos: bool = False) -> Any:
    """A byte-level BPE with `<|endoftext|>`; with `bos`, also Llama 3's `<|begin_of_text|>`
    (which a `TemplateProcessing` post-processor adds) and `<|end_of_text|>`."""
    from theseus.registry import import_module_or_file

    gpt2 = import_module_or_file(str(Path(__file__).with_name("gpt2_folder.py")))
    from tokenizers import processors

    tokenizer = gpt2.train_tokenizer()
    if bos:
        tokenizer.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
        start = tokenizer.token_to_id("<|begin_of_text|>")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", start)],
        )
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer


def config_of(family: str, spelling: str = "old", **changes: Any) -> dict[str, Any]:
    """A small config.json of `family`; `spelling` "old" or "rope_parameters"."""
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[family]], "model_type": family, "hidden_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48,
        "max_position_embeddings": 64, "vocab_size": 320, "tie_word_embeddings": False,
        "torch_dtype": "float32", "bos_token_id": 0, "eos_token_id": 0,
    }  # fmt: skip
    if family == "gpt_neox":
        config.update(hidden_act="gelu", layer_norm_eps=1e-5, use_parallel_residual=True,
                      attention_bias=True)  # fmt: skip
        rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
        old = {"rotary_pct": 0.5, "rotary_emb_base": 10000}
    else:
        config.update(hidden_act="silu", rms_norm_eps=1e-6, num_key_value_heads=2,
                      attention_bias=False)  # fmt: skip
        rope = {"rope_type": "default", "rope_theta": 500000.0}
        old = {"rope_theta": 500000.0, "rope_scaling": None}
        if family == "mistral":
            config["sliding_window"] = None
        if family == "qwen2":
            config.update(use_sliding_window=False, sliding_window=32)
    config.update(old if spelling == "old" else {"rope_parameters": rope})
    config.update(changes)
    return config


def _shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    family, d = config["model_type"], config["hidden_size"]
    n_head, width, vocab = (
        config["num_attention_heads"],
        config["intermediate_size"],
        config["vocab_size"],
    )
    head = d // n_head
    shapes: dict[str, tuple[int, ...]] = {}
    if family == "gpt_neox":
        p = "gpt_neox."
        shapes[p + "embed_in.weight"] = (vocab, d)
        for i in range(config["num_hidden_layers"]):
            h = f"{p}layers.{i}."
            for norm in ("input_layernorm", "post_attention_layernorm"):
                shapes[h + norm + ".weight"] = shapes[h + norm + ".bias"] = (d,)
            for name, out, inp in (("attention.query_key_value", 3 * d, d),
                                   ("attention.dense", d, d),
                                   ("mlp.dense_h_to_4h", width, d), ("mlp.dense_4h_to_h", d, width)):  # fmt: skip
                shapes[h + name + ".weight"], shapes[h + name + ".bias"] = (out, inp), (out,)
        shapes[p + "final_layer_norm.weight"] = shapes[p + "final_layer_norm.bias"] = (d,)
        if not config.get("tie_word_embeddings"):
            shapes["embed_out.weight"] = (vocab, d)
        return shapes
    kv = config["num_key_value_heads"] * head
    shapes["model.embed_tokens.weight"] = (vocab, d)
    norms = (("post_attention_layernorm", "post_feedforward_layernorm") if family == "olmo2"
             else ("input_layernorm", "post_attention_layernorm"))  # fmt: skip
    qkv_bias = family == "qwen2" or config.get("attention_bias")
    for i in range(config["num_hidden_layers"]):
        h = f"model.layers.{i}."
        for norm in norms:
            shapes[h + norm + ".weight"] = (d,)
        for x, w in (("q", n_head * head), ("k", kv), ("v", kv)):
            shapes[f"{h}self_attn.{x}_proj.weight"] = (w, d)
            if qkv_bias:
                shapes[f"{h}self_attn.{x}_proj.bias"] = (w,)
        shapes[h + "self_attn.o_proj.weight"] = (d, n_head * head)
        if family != "qwen2" and config.get("attention_bias"):
            shapes[h + "self_attn.o_proj.bias"] = (d,)
        if family == "olmo2":
            shapes[h + "self_attn.q_norm.weight"], shapes[h + "self_attn.k_norm.weight"] = (
                (n_head * head,),
                (kv,),
            )
        for name, out, inp in (
            ("gate_proj", width, d),
            ("up_proj", width, d),
            ("down_proj", d, width),
        ):
            shapes[f"{h}mlp.{name}.weight"] = (out, inp)
            if config.get("mlp_bias"):
                shapes[f"{h}mlp.{name}.bias"] = (out,)
    shapes["model.norm.weight"] = (d,)
    if not config.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (vocab, d)
    return shapes


def write_folder(
    family: str,
    folder: Path,
    *,
    spelling: str = "old",
    shards: int = 1,
    dtype: Any = np.float32,
    bos: bool = False,
    seed: int = 0,
    **changes: Any,
) -> Path:
    """Write a random `family` model (weights of scale ~0.3 so logits vary) and a tokenizer."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = config_of(family, spelling, **changes)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(folder, bos=bos)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in _shapes(config).items():
        scale = 0.1 if len(shape) == 1 else 1 / math.sqrt(shape[-1])
        value = scale * rng.standard_normal(shape)
        if name.endswith(("norm.weight", "layernorm.weight")):
            value += 1.0
        tensors[name] = value.astype(dtype)
    if family == "gpt_neox":  # buffers save_pretrained may carry
        tensors["gpt_neox.layers.0.attention.rotary_emb.inv_freq"] = np.ones(4, np.float32)
    names = sorted(tensors)
    groups = [names[i::shards] for i in range(shards)]
    if shards == 1:
        save_file(tensors, str(folder / "model.safetensors"))
        return folder
    weight_map = {}
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in group}, str(folder / file))
        weight_map.update(dict.fromkeys(group, file))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def load_weights(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder in float64 (ml_dtypes' bfloat16 included)."""
    from safetensors.numpy import load_file

    files = sorted(folder.glob("*.safetensors"))
    return {k: np.asarray(v, np.float64) for f in files for k, v in load_file(str(f)).items()}


# ------------------------------------------------------------------------ forwards
def _gelu(x: np.ndarray) -> np.ndarray:
    from math import erf

    return 0.5 * x * (1.0 + np.vectorize(erf)(x / math.sqrt(2.0)))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    out = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * w
    return out if b is None else out + b


def _rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * w


def rope_settings(config: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
    """`(base, fraction, scaling)` as transformers reads them from either spelling."""
    params = config.get("rope_parameters")
    if params:
        scaling = params
        base = params.get("rope_theta", 10000.0)
        fraction = params.get("partial_rotary_factor", 1.0)
    else:
        scaling = config.get("rope_scaling") or {}
        base = config.get("rope_theta", config.get("rotary_emb_base", 10000.0))
        fraction = config.get("rotary_pct", 1.0)
    return float(base), float(fraction), scaling


def inv_freq(config: dict[str, Any], rot: int) -> np.ndarray:
    """transformers' default and llama3 `_compute_*_parameters` inverse frequencies."""
    base, _, scaling = rope_settings(config)
    freq = 1.0 / base ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
    if scaling.get("rope_type", scaling.get("type", "default")) != "llama3":
        return freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / freq
    scaled = np.where(wavelen > old / low, freq / factor, freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return np.where(medium, smoothed, scaled)


def _rotary(x: np.ndarray, config: dict[str, Any], fraction: float) -> np.ndarray:
    """HF's apply_rotary_pos_emb on `x [heads, seq, head]`: rotate_half on the first `rot`."""
    seq, head = x.shape[1], x.shape[2]
    rot = int(head * fraction)
    freqs = np.arange(seq)[:, None] * inv_freq(config, rot)[None]
    emb = np.concatenate([freqs, freqs], -1)
    cos, sin = np.cos(emb), np.sin(emb)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = np.concatenate([-x_rot[..., half:], x_rot[..., :half]], -1)
    return np.concatenate([x_rot * cos + rotated * sin, x_pass], -1)


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Causal attention of `q [H, s, hd]` over `k, v [Hkv, s, hd]` (grouped heads repeated)."""
    repeat = q.shape[0] // k.shape[0]
    k, v = np.repeat(k, repeat, 0), np.repeat(v, repeat, 0)
    seq = q.shape[1]
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
    scores = np.where(np.tril(np.ones((seq, seq), bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return (weights @ v).transpose(1, 0, 2).reshape(seq, -1), weights


def hf_forward(folder: Path, ids: list[int]) -> np.ndarray:
    """The folder's model on one sequence, as transformers' modeling file computes it."""
    config = json.loads((folder / "config.json").read_text())
    w = load_weights(folder)
    family, n_head = config["model_type"], config["num_attention_heads"]
    d = config["hidden_size"]
    head, seq = d // n_head, len(ids)

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        out = x @ w[name + ".weight"].T
        return out + w[name + ".bias"] if name + ".bias" in w else out

    def split(x: np.ndarray) -> np.ndarray:
        return x.reshape(seq, -1, head).transpose(1, 0, 2)

    if family == "gpt_neox":
        _, fraction, _ = rope_settings(config)
        eps = config["layer_norm_eps"]

        def ln(x: np.ndarray, name: str) -> np.ndarray:
            return _layernorm(x, w[name + ".weight"], w[name + ".bias"], eps)

        x = w["gpt_neox.embed_in.weight"][ids]
        for i in range(config["num_hidden_layers"]):
            h = f"gpt_neox.layers.{i}."
            qkv = linear(ln(x, h + "input_layernorm"), h + "attention.query_key_value")
            qkv = qkv.reshape(seq, n_head, 3 * head).transpose(1, 0, 2)  # per head: q k v
            q, k, v = qkv[..., :head], qkv[..., head : 2 * head], qkv[..., 2 * head :]
            attended, _ = _attend(_rotary(q, config, fraction), _rotary(k, config, fraction), v)
            attn = linear(attended, h + "attention.dense")
            if config.get("use_parallel_residual", True):
                mlp_in = ln(x, h + "post_attention_layernorm")
                x = (
                    x
                    + attn
                    + linear(
                        _gelu(linear(mlp_in, h + "mlp.dense_h_to_4h")), h + "mlp.dense_4h_to_h"
                    )
                )
            else:
                x = x + attn
                mlp_in = ln(x, h + "post_attention_layernorm")
                x = x + linear(
                    _gelu(linear(mlp_in, h + "mlp.dense_h_to_4h")), h + "mlp.dense_4h_to_h"
                )
        x = ln(x, "gpt_neox.final_layer_norm")
        head_w = w.get("embed_out.weight", w["gpt_neox.embed_in.weight"])
        return x @ head_w.T
    eps = config["rms_norm_eps"]
    _, fraction, _ = rope_settings(config)

    def rms(x: np.ndarray, name: str) -> np.ndarray:
        return _rmsnorm(x, w[name + ".weight"], eps)

    x = w["model.embed_tokens.weight"][ids]
    for i in range(config["num_hidden_layers"]):
        h = f"model.layers.{i}."
        a = f"{h}self_attn."

        def attention(y: np.ndarray, a: str = a) -> np.ndarray:
            q, k, v = linear(y, a + "q_proj"), linear(y, a + "k_proj"), linear(y, a + "v_proj")
            if family == "olmo2":
                q, k = rms(q, a + "q_norm"), rms(k, a + "k_norm")
            q, k = _rotary(split(q), config, fraction), _rotary(split(k), config, fraction)
            return linear(_attend(q, k, split(v))[0], a + "o_proj")

        def mlp(y: np.ndarray, h: str = h) -> np.ndarray:
            gated = _silu(linear(y, h + "mlp.gate_proj")) * linear(y, h + "mlp.up_proj")
            return linear(gated, h + "mlp.down_proj")

        if family == "olmo2":
            x = x + rms(attention(x), h + "post_attention_layernorm")
            x = x + rms(mlp(x), h + "post_feedforward_layernorm")
        else:
            x = x + attention(rms(x, h + "input_layernorm"))
            x = x + mlp(rms(x, h + "post_attention_layernorm"))
    x = rms(x, "model.norm")
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


def tree_forward(params: dict[str, Any], settings: dict[str, Any], ids: list[int]) -> np.ndarray:
    """The contract's block over a Theseus parameter tree, in float64 (rotary models).

    `settings` are the `architecture/...` keys; the c_attn columns are all query heads,
    then key heads, then value heads; rotary pairs feature i with i + rot/2.
    """
    s = {k.removeprefix("architecture/"): v for k, v in settings.items()}
    p = {k: np.asarray(v, np.float64) for k, v in _flat(params).items()}
    d, n_head = s["n_embd"], s["n_head"]
    n_kv, head, seq = s.get("n_kv_head") or n_head, d // n_head, len(ids)
    rot = int(head * s["rotary_fraction"])
    freq = 1.0 / s["rope_base"] ** (np.arange(0, rot, 2) / rot)
    if s.get("rope_scaling/kind") == "llama3":
        scaling = {"rope_type": "llama3", "factor": s["rope_scaling/factor"],
                   "low_freq_factor": s["rope_scaling/low_freq_factor"],
                   "high_freq_factor": s["rope_scaling/high_freq_factor"],
                   "original_max_position_embeddings": s["rope_scaling/original_context"]}  # fmt: skip
        freq = inv_freq({"rope_parameters": {**scaling, "rope_theta": s["rope_base"]}}, rot)
    angles = np.arange(seq)[:, None] * freq[None]
    cos, sin = np.cos(angles), np.sin(angles)

    def rotate(x: np.ndarray) -> np.ndarray:  # [heads, seq, head]
        a, b, rest = x[..., : rot // 2], x[..., rot // 2 : rot], x[..., rot:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin, rest], -1)

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        if s["norm"] == "rmsnorm":
            return _rmsnorm(x, p[name + "/scale"], s["norm_eps"])
        return _layernorm(x, p[name + "/scale"], p.get(name + "/bias"), s["norm_eps"])

    def dense(x: np.ndarray, name: str) -> np.ndarray:
        out = x @ p[name + "/kernel"]
        return out + p[name + "/bias"] if name + "/bias" in p else out

    act = {"silu": _silu, "gelu": _gelu}[s["activation"]]
    x = p["wte/embedding"][ids]
    for i in range(s["n_layers"]):
        b = f"blocks_{i}"

        def attention(y: np.ndarray, b: str = b) -> np.ndarray:
            qkv = dense(y, b + "/attn/c_attn")
            q, k, v = np.split(qkv, [n_head * head, (n_head + n_kv) * head], -1)
            if s.get("qk_norm"):
                q, k = norm(q, b + "/attn/q_norm"), norm(k, b + "/attn/k_norm")
            q, k, v = (t.reshape(seq, -1, head).transpose(1, 0, 2) for t in (q, k, v))
            return dense(_attend(rotate(q), rotate(k), v)[0], b + "/attn/c_proj")

        def mlp(y: np.ndarray, b: str = b) -> np.ndarray:
            hidden = act(dense(y, b + "/mlp/c_fc"))
            if s.get("gated_mlp"):
                hidden = act(dense(y, b + "/mlp/c_gate")) * dense(y, b + "/mlp/c_fc")
            return dense(hidden, b + "/mlp/c_proj")

        residual = s.get("residual", "sequential")
        if residual == "parallel":
            x = x + attention(norm(x, b + "/ln_1")) + mlp(norm(x, b + "/ln_2"))
        elif residual == "post_norm":
            x = x + norm(attention(x), b + "/ln_1")
            x = x + norm(mlp(x), b + "/ln_2")
        else:
            x = x + attention(norm(x, b + "/ln_1"))
            x = x + mlp(norm(x, b + "/ln_2"))
    x = norm(x, "ln_f")
    return x @ (p["lm_head/kernel"] if "lm_head/kernel" in p else p["wte/embedding"].T)


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}/"))
        else:
            out[prefix + key] = value
    return out
