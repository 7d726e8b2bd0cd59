"""A small random Hugging Face GPT-2 folder written without transformers, and a NumPy
GPT-2 forward that reads it: the independent reference for the import's tests.

The folder has what `save_pretrained` writes for `GPT2LMHeadModel` and
`GPT2TokenizerFast`: `config.json`, `model.safetensors` (Hugging Face's tensor names,
`Conv1D` weights `[in, out]`, the causal-mask buffers `h.N.attn.bias`), and a byte-level
BPE tokenizer trained here (`tokenizer.json`, `vocab.json`, `merges.txt`). The reference
forward is written from GPT-2's definition (layer norm, fused QKV split into heads,
causal softmax scaled by 1/sqrt(head width), `gelu_new`, tied unembedding), in float64.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A journey of a thousand miles begins with a single step.",
    "To be, or not to be, that is the question.",
    "All that glitters is not gold; all who wander are not lost.",
    "The model reads the tokens, and the tokens read the model back.",
    "Élan, naïve café: unicode text survives byte-level BPE. 12345 67890",
] * 4


def train_tokenizer(vocab_size: int = 300) -> Any:
    """A byte-level BPE tokenizer with `<|endoftext|>`, trained on `CORPUS`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def write_gpt2_folder(
    folder: Path,
    *,
    n_layer: int = 2,
    n_embd: int = 32,
    n_head: int = 4,
    n_positions: int = 64,
    n_inner: int | None = None,
    activation: str = "gelu_new",
    eps: float = 1e-5,
    vocab_size: int | None = None,
    prefix: str = "",
    tokenizer_json: bool = True,
    seed: int = 0,
) -> Path:
    """Write a random GPT-2 (weights of scale ~0.5 so logits vary) and its tokenizer."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    vocab = vocab_size or tokenizer.get_vocab_size(with_added_tokens=True)
    inner = n_inner or 4 * n_embd
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float = 0.3) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    tensors = {"wte.weight": normal(vocab, n_embd), "wpe.weight": normal(n_positions, n_embd)}
    for i in range(n_layer):
        h = f"h.{i}"
        for norm in ("ln_1", "ln_2"):
            tensors[f"{h}.{norm}.weight"] = 1.0 + normal(n_embd, scale=0.1)
            tensors[f"{h}.{norm}.bias"] = normal(n_embd, scale=0.1)
        for name, fan_in, fan_out in (
            ("attn.c_attn", n_embd, 3 * n_embd),
            ("attn.c_proj", n_embd, n_embd),
            ("mlp.c_fc", n_embd, inner),
            ("mlp.c_proj", inner, n_embd),
        ):
            tensors[f"{h}.{name}.weight"] = normal(fan_in, fan_out, scale=1 / math.sqrt(fan_in))
            tensors[f"{h}.{name}.bias"] = normal(fan_out, scale=0.1)
        tensors[f"{h}.attn.bias"] = np.tril(np.ones((n_positions, n_positions), np.float32))[
            None, None
        ]
    tensors["ln_f.weight"] = 1.0 + normal(n_embd, scale=0.1)
    tensors["ln_f.bias"] = normal(n_embd, scale=0.1)
    save_file({prefix + k: v for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": activation,
        "attn_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "resid_pdrop": 0.1,
        "layer_norm_epsilon": eps,
        "n_ctx": n_positions,
        "n_positions": n_positions,
        "n_embd": n_embd,
        "n_head": n_head,
        "n_layer": n_layer,
        "n_inner": n_inner,
        "vocab_size": vocab,
        "bos_token_id": tokenizer.token_to_id("<|endoftext|>"),
        "eos_token_id": tokenizer.token_to_id("<|endoftext|>"),
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "use_cache": True,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    if tokenizer_json:
        tokenizer.save(str(folder / "tokenizer.json"))
    tokenizer.model.save(str(folder))  # vocab.json and merges.txt
    return folder


def load_weights(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    weights = load_file(str(folder / "model.safetensors"))
    return {k.removeprefix("transformer."): v.astype(np.float64) for k, v in weights.items()}


def theseus_params(folder: Path) -> dict[str, np.ndarray]:
    """The folder's tensors at the paths of Theseus's parameter tree (`"blocks_0/attn/
    c_attn/kernel"`, ...), float32, written from the tree's contract (docs/architecture.md:
    GPT-2's `Conv1D` weights are already `[in, out]`; the unembedding is tied)."""
    from safetensors.numpy import load_file

    weights = {
        k.removeprefix("transformer."): v.astype(np.float32)
        for k, v in load_file(str(folder / "model.safetensors")).items()
    }
    n_layer = json.loads((folder / "config.json").read_text())["n_layer"]
    tree = {"wte/embedding": weights["wte.weight"], "wpe/embedding": weights["wpe.weight"],
            "ln_f/scale": weights["ln_f.weight"], "ln_f/bias": weights["ln_f.bias"]}  # fmt: skip
    for i in range(n_layer):
        for ours, theirs, kind in (("ln_1", "ln_1", "scale"), ("ln_2", "ln_2", "scale"),
                                   ("attn/c_attn", "attn.c_attn", "kernel"),
                                   ("attn/c_proj", "attn.c_proj", "kernel"),
                                   ("mlp/c_fc", "mlp.c_fc", "kernel"),
                                   ("mlp/c_proj", "mlp.c_proj", "kernel")):  # fmt: skip
            tree[f"blocks_{i}/{ours}/{kind}"] = weights[f"h.{i}.{theirs}.weight"]
            tree[f"blocks_{i}/{ours}/bias"] = weights[f"h.{i}.{theirs}.bias"]
    return tree


def _gelu_new(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_exact(x: np.ndarray) -> np.ndarray:
    from math import erf

    return 0.5 * x * (1.0 + np.vectorize(erf)(x / math.sqrt(2.0)))


def reference_forward(folder: Path, ids: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """GPT-2 on one sequence, in float64 NumPy.

    Returns:
        `(logits [len(ids), vocab], attention)`, `attention[layer]` the probabilities
        `[heads, query, key]`.
    """
    config = json.loads((folder / "config.json").read_text())
    w = load_weights(folder)
    n_head, eps = config["n_head"], config["layer_norm_epsilon"]
    act = {"gelu_new": _gelu_new, "gelu": _gelu_exact}[config["activation_function"]]

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + eps) * w[f"{name}.weight"] + w[f"{name}.bias"]

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        return x @ w[f"{name}.weight"] + w[f"{name}.bias"]

    seq = len(ids)
    x = w["wte.weight"][ids] + w["wpe.weight"][:seq]
    width = x.shape[-1]
    head = width // n_head
    mask = np.tril(np.ones((seq, seq), bool))
    attention = []
    for i in range(config["n_layer"]):
        h = f"h.{i}"
        q, k, v = np.split(linear(norm(x, f"{h}.ln_1"), f"{h}.attn.c_attn"), 3, axis=-1)
        q, k, v = (t.reshape(seq, n_head, head).transpose(1, 0, 2) for t in (q, k, v))
        scores = np.where(mask, q @ k.transpose(0, 2, 1) / math.sqrt(head), -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        attention.append(weights)
        x = x + linear((weights @ v).transpose(1, 0, 2).reshape(seq, width), f"{h}.attn.c_proj")
        x = x + linear(act(linear(norm(x, f"{h}.ln_2"), f"{h}.mlp.c_fc")), f"{h}.mlp.c_proj")
    return norm(x, "ln_f") @ w["wte.weight"].T, attention


def edit_config(**changes: object):  # type: ignore[no-untyped-def]
    """A folder breaker: `config.json` with `changes` applied."""

    def apply(src: Path) -> None:
        config = json.loads((src / "config.json").read_text())
        config.update(changes)
        (src / "config.json").write_text(json.dumps(config))

    return apply


def edit_weights(edit):  # type: ignore[no-untyped-def]
    """A folder breaker: `model.safetensors` rewritten after `edit(tensors)` changed it."""

    def apply(src: Path) -> None:
        from safetensors.numpy import load_file, save_file

        tensors = load_file(str(src / "model.safetensors"))
        edit(tensors)
        save_file(tensors, str(src / "model.safetensors"))

    return apply
