"""Training suites written for the tests: per-revision folders and a Hugging Face cache.

`hf_cache(folder, revisions)` lays model folders out as `huggingface_hub` caches a
repository with several revisions: `refs/<revision>` holding a commit hash,
`snapshots/<commit>/<file>` symlinks to `../../blobs/<hash>`, a blob per distinct
file content (named by its SHA-256, as the hub names LFS files), so revisions that
share a file share its blob. `reshard(folder, parts)` splits a folder's
`model.safetensors` into shards with a `model.safetensors.index.json`, as
`save_pretrained` does past `max_shard_size`. `neox_attention` is GPT-NeoX's attention
per layer in float64 NumPy from its definition, over a folder's own tensors (such as
hf_folder.py's `write_folder("gpt_neox", ...)` writes).
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
