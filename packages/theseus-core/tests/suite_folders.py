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
