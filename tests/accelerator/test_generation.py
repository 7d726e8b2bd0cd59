"""The KV cache on the accelerator against the full forward recomputed at every step.

The shared run's model (grouped-query heads, rotary) after 50 steps. Three prompts of
different lengths are decoded together (left-padded, so each row starts at its own
cache slot). Reference: `GPT.__call__` on the whole sequence so far, alone, its logits
at the last position. Under `precise()` the cached logits are within `recompiled` of the
reference at every step, and the greedy tokens are the reference's argmax, except where
the reference's two largest logits are within that tolerance of each other (a tie at
this precision, after which the two continuations differ and the row is not compared on).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _tolerances import assert_close, precise, tolerance

from theseus.model import generation

pytestmark = pytest.mark.accelerator

NEW = 12


def _prompts(trainer: Any) -> list[list[int]]:
    """Three prompts from the validation text: 5, 9 and 13 tokens."""
    rows = np.asarray(trainer.read_batch(0, "val")["x"])
    return [rows[i, : 5 + 4 * i].tolist() for i in range(3)]


def _recompute(trainer: Any) -> Any:
    """`ids -> logits [vocab]` at the last of `ids`, from the plain forward on them alone."""
    model, params, block = trainer.model, trainer.state.params, trainer.block_size

    @jax.jit
    def last(ids: jax.Array, at: jax.Array) -> jax.Array:
        logits, _ = model.apply({"params": params}, ids)
        return logits[0, at]

    def logits(ids: list[int]) -> np.ndarray:
        padded = np.zeros((1, block), np.int32)  # causal: the padding is never read back
        padded[0, : len(ids)] = ids
        return np.asarray(last(jnp.asarray(padded), jnp.int32(len(ids) - 1)), np.float64)

    return logits


def test_cached_logits_and_greedy_tokens_equal_the_recompute(trained: tuple[Path, Any]) -> None:
    _, trainer = trained
    model, params, block = trainer.model, trainer.state.params, trainer.block_size
    prompts = _prompts(trainer)
    with precise():
        full = _recompute(trainer)
        width = generation.prompt_bucket(max(map(len, prompts)), block - NEW)
        padded = np.zeros((len(prompts), width), np.int32)
        start = np.asarray([width - len(p) for p in prompts], np.int32)
        for row, prompt in enumerate(prompts):
            padded[row, start[row] :] = prompt
        last, caches = generation._prefill(
            model, params, jnp.asarray(padded), jnp.asarray(start), block
        )
        sequences = [list(p) for p in prompts]
        for n in range(NEW):
            for row, ids in enumerate(sequences):
                assert_close(
                    np.asarray(last[row]), full(ids), "recompiled", what=f"row {row} step {n}"
                )
            token = jnp.argmax(last, axis=-1).astype(jnp.int32)
            for row, ids in enumerate(sequences):
                ids.append(int(token[row]))
            if n + 1 < NEW:
                last, caches = generation._step(model, params, caches, token)
        cached = generation.generate(model, params, prompts, NEW, temperature=0)
        assert cached == [ids[len(p) :] for ids, p in zip(sequences, prompts, strict=True)]

        compared = 0
        for prompt, new in zip(prompts, cached, strict=True):
            ids = list(prompt)
            for chosen in new:
                reference = full(ids)
                best = int(np.argmax(reference))
                if chosen != best:
                    gap = reference[best] - reference[chosen]
                    allowed = tolerance("recompiled") * np.abs(reference).max()
                    assert gap <= allowed, (prompt, new, len(ids), gap, allowed)
                    break
                ids.append(chosen)
                compared += 1
    assert compared >= NEW, compared  # ties are rare: most tokens were compared
