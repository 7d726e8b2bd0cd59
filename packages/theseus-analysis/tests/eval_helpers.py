"""Shared by the evaluation tests: a reference forward and a local multiple-choice task.

`reference` scores tokens with the trainer's plain forward on one row alone (float64
NumPy log-softmax), independent of `theseus.model.scoring`; `write_task` writes the
JSON task `tiny_mc` (no download) into a folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROWS = [{"query": f"{w} ", "choices": ["cat", "dog", "the"], "gold": g}
        for w, g in (("the", 0), ("a", 1), ("on", 2), ("sat", 0))]  # fmt: skip

_FORWARDS: dict[int, object] = {}


def reference(trainer, ids: list[int], scored: int, params=None) -> tuple[float, bool]:
    """The last `scored` tokens of `ids` from the plain forward on `ids` alone (one row,
    right-padded to the context, which causal attention never reads back). Longer rows
    keep their last `block_size + 1` tokens, as the harness's `hf` model cuts them."""
    block = trainer.model.config.block_size
    ids = list(ids)[-(block + 1) :]
    if id(trainer) not in _FORWARDS:
        _FORWARDS[id(trainer)] = jax.jit(
            lambda params, x: trainer.model.apply({"params": params}, x)[0][0]
        )
    padded = np.zeros((1, block), np.int32)
    padded[0, : len(ids) - 1] = ids[:-1]
    forward = _FORWARDS[id(trainer)]
    params = trainer.state.params if params is None else params
    logits = np.asarray(forward(params, jnp.asarray(padded)), np.float64)[: len(ids) - 1]
    top = logits.max(-1, keepdims=True)
    logprobs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    positions = range(len(ids) - 1 - scored, len(ids) - 1)
    total = float(sum(logprobs[i, ids[i + 1]] for i in positions))
    return total, all(int(np.argmax(logits[i])) == ids[i + 1] for i in positions)


def reference_accuracy(trainer, encode, rows=ROWS, delimiter=" ", params=None) -> float:
    """The share of `rows` whose gold choice the plain forward finds most likely (the
    harness's `acc`: context and choice split as the harness splits them)."""
    right = 0
    for row in rows:
        context = row["query"].rstrip() if delimiter == " " else row["query"]
        ctx = encode(context)
        scores = []
        for choice in row["choices"]:
            cont = encode(context + delimiter + choice)[len(ctx) :]
            scores.append(reference(trainer, ctx + cont, len(cont), params)[0])
        right += int(np.argmax(scores)) == row["gold"]
    return right / len(rows)


def write_task(folder: Path) -> None:
    """The local multiple-choice task `tiny_mc` (JSON rows, no download) in `folder`."""
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (folder / "tiny_mc.yaml").write_text(
        "task: tiny_mc\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {folder / 'rows.jsonl'}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        "doc_to_text: '{{query}}'\n"
        "doc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{gold}}'\n"
        "metric_list:\n  - metric: acc\n"
    )
