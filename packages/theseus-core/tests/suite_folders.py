"""Training suites written for the tests: per-revision folders and a Hugging Face cache.

`hf_cache(folder, revisions)` lays model folders out as `huggingface_hub` caches a
repository with several revisions: `refs/<revision>` holding a commit hash,
`snapshots/<commit>/<file>` symlinks to `../../blobs/<hash>`, a blob per distinct
file content (named by its SHA-256, as the hub names LFS files), so revisions that
share a file share its blob. `reshard(folder, parts)` splits a folder's
`model.safetensors` into shards with a `model.safetensors.index.json`, as
`save_pretrained` does past `max_shard_size`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np


def hf_cache(
    cache: Path, revisions: dict[str, Path], aliases: dict[str, str] | None = None
) -> Path:
    """Write `models--ORG--NAME` at `cache` holding `revisions` (name -> model folder).

    `aliases` names more refs that point at a revision's commit (`{"main": "step3000"}`).
    """
    (cache / "blobs").mkdir(parents=True)
    commits: dict[str, str] = {}
    for name, folder in revisions.items():
        commit = hashlib.sha1(name.encode()).hexdigest()  # a git commit is 40 hex digits
        commits[name] = commit
        snapshot = cache / "snapshots" / commit
        snapshot.mkdir(parents=True)
        for file in sorted(folder.iterdir()):
            data = file.read_bytes()
            blob = cache / "blobs" / hashlib.sha256(data).hexdigest()
            if not blob.exists():
                blob.write_bytes(data)
            os.symlink(os.path.join("..", "..", "blobs", blob.name), snapshot / file.name)
        ref = cache / "refs" / name
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)  # huggingface_hub writes the hash without a newline
    for alias, target in (aliases or {}).items():
        (cache / "refs" / alias).write_text(commits[target])
    return cache


def reshard(folder: Path, parts: int = 2) -> list[Path]:
    """Split `folder/model.safetensors` into `parts` shards (tensors in name order)."""
    from safetensors.numpy import load_file, save_file

    single = folder / "model.safetensors"
    tensors = load_file(str(single))
    names = sorted(tensors)
    files, weight_map = [], {}
    for index, chunk in enumerate(np.array_split(np.array(names, dtype=object), parts)):
        file = f"model-{index + 1:05d}-of-{parts:05d}.safetensors"
        save_file({str(n): tensors[str(n)] for n in chunk}, str(folder / file))
        weight_map.update({str(n): file for n in chunk})
        files.append(folder / file)
    single.unlink()
    index_file = folder / "model.safetensors.index.json"
    index_file.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return files


def copy_shard(source: Path, target: Path, shard: str) -> None:
    """Put `source`'s shard file `shard` in place of `target`'s (a damaged revision)."""
    shutil.copyfile(source / shard, target / shard)


def write_neox_folder(
    folder: Path,
    *,
    seed: int = 0,
    n_layer: int = 2,
    hidden: int = 32,
    heads: int = 4,
    context: int = 64,
    rotary_pct: float = 0.25,
) -> Path:
    """A random GPT-NeoX (Pythia's architecture) folder as `save_pretrained` writes one:
    Hugging Face's tensor names (`query_key_value` rows interleaved per head), parallel
    residual, partial rotary, an untied `embed_out`, and gpt2_folder's BPE tokenizer."""
    import math

    from safetensors.numpy import save_file

    from theseus.registry import import_module_or_file

    gpt2 = import_module_or_file(str(Path(__file__).with_name("gpt2_folder.py")))
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = gpt2.train_tokenizer()
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    rng = np.random.default_rng(seed)

    def normal(*shape: int, scale: float = 0.3) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    p, inner = "gpt_neox.", 4 * hidden
    tensors = {
        f"{p}embed_in.weight": normal(vocab, hidden),
        "embed_out.weight": normal(vocab, hidden),
    }
    for i in range(n_layer):
        h = f"{p}layers.{i}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"{h}.{norm}.weight"] = 1.0 + normal(hidden, scale=0.1)
            tensors[f"{h}.{norm}.bias"] = normal(hidden, scale=0.1)
        for name, fan_in, fan_out in (
            ("attention.query_key_value", hidden, 3 * hidden),
            ("attention.dense", hidden, hidden),
            ("mlp.dense_h_to_4h", hidden, inner),
            ("mlp.dense_4h_to_h", inner, hidden),
        ):
            tensors[f"{h}.{name}.weight"] = normal(fan_out, fan_in, scale=1 / math.sqrt(fan_in))
            tensors[f"{h}.{name}.bias"] = normal(fan_out, scale=0.1)
    tensors[f"{p}final_layer_norm.weight"] = 1.0 + normal(hidden, scale=0.1)
    tensors[f"{p}final_layer_norm.bias"] = normal(hidden, scale=0.1)
    save_file(tensors, str(folder / "model.safetensors"))
    eos = tokenizer.token_to_id("<|endoftext|>")
    config = {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_hidden_layers": n_layer,
        "intermediate_size": inner,
        "max_position_embeddings": context,
        "vocab_size": vocab,
        "rotary_pct": rotary_pct,
        "rotary_emb_base": 10000,
        "use_parallel_residual": True,
        "layer_norm_eps": 1e-5,
        "hidden_act": "gelu",
        "tie_word_embeddings": False,
        "bos_token_id": eos,
        "eos_token_id": eos,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def neox_attention(folder: Path, ids: list[int]) -> list[np.ndarray]:
    """GPT-NeoX's attention probabilities `[heads, query, key]` per layer, in float64 NumPy,
    written from its definition (fused QKV rows per head, rotate_half over the first
    rotary_pct of each head, parallel residual)."""
    from math import erf

    from safetensors.numpy import load_file

    config = json.loads((folder / "config.json").read_text())
    w = {k: v.astype(np.float64) for k, v in load_file(str(folder / "model.safetensors")).items()}
    heads, eps = config["num_attention_heads"], config["layer_norm_eps"]
    seq, width = len(ids), config["hidden_size"]
    head = width // heads
    rot = int(head * config["rotary_pct"])
    inv = config["rotary_emb_base"] ** (-np.arange(0, rot, 2) / rot)
    angles = np.arange(seq)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))

    def rope(x: np.ndarray) -> np.ndarray:  # [heads, seq, head]
        r, rest = x[..., :rot], x[..., rot:]
        half = np.concatenate([-r[..., rot // 2 :], r[..., : rot // 2]], -1)
        return np.concatenate([r * cos + half * sin, rest], -1)

    def norm(x: np.ndarray, name: str) -> np.ndarray:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + eps) * w[f"{name}.weight"] + w[f"{name}.bias"]

    def linear(x: np.ndarray, name: str) -> np.ndarray:
        return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    gelu = np.vectorize(lambda v: 0.5 * v * (1.0 + erf(v / np.sqrt(2.0))))
    x = w["gpt_neox.embed_in.weight"][ids]
    mask = np.tril(np.ones((seq, seq), bool))
    attention = []
    for i in range(config["num_hidden_layers"]):
        h = f"gpt_neox.layers.{i}"
        qkv = linear(norm(x, f"{h}.input_layernorm"), f"{h}.attention.query_key_value")
        qkv = qkv.reshape(seq, heads, 3, head).transpose(2, 1, 0, 3)  # rows per head: q k v
        q, k, v = rope(qkv[0]), rope(qkv[1]), qkv[2]
        scores = np.where(mask, q @ k.transpose(0, 2, 1) / np.sqrt(head), -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attention.append(probs)
        out = linear((probs @ v).transpose(1, 0, 2).reshape(seq, width), f"{h}.attention.dense")
        mlp = linear(
            gelu(linear(norm(x, f"{h}.post_attention_layernorm"), f"{h}.mlp.dense_h_to_4h")),
            f"{h}.mlp.dense_4h_to_h",
        )
        x = x + out + mlp
    return attention
