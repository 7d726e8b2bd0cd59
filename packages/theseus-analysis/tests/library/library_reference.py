"""NumPy references for the library's analyses, written from their definitions.

The residual streams are recorded with Flax's own `capture_intermediates` (not the
analysis engine), and everything after them is float64 NumPy: the final norm
(LayerNorm or RMSNorm, with the model's `ln_f` weights and epsilon), the unembedding
(the tied embedding's transpose or `lm_head`'s kernel), log-softmax, cross-entropy, KL,
the per-position and per-frequency-bucket means.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from theseus.model.models import Block


def forward(state: Any, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(logits [b, s, V], residuals [layers + 1, b, s, d])` as float64, by Flax's capture
    (the embeddings are the output of the model's `drop`, the first block's input).
    Each batch's forward is taken once (`forwards`) and shared by the references below."""

    def wanted(module: Any, method: str) -> bool:
        return method == "__call__" and (isinstance(module, Block) or module.name == "drop")

    def run(params: Any, x: Any) -> Any:
        (logits, _), held = state.apply_fn(
            {"params": params}, x, capture_intermediates=wanted, mutable=["intermediates"]
        )
        found = held["intermediates"]
        blocks = sorted((k for k in found if k.startswith("blocks_")), key=lambda k: int(k[7:]))
        return logits, [found["drop"]["__call__"][0], *(found[k]["__call__"][0] for k in blocks)]

    logits, streams = jax.jit(run)(state.params, x)
    return np.asarray(logits, np.float64), np.stack([np.asarray(h, np.float64) for h in streams])


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def unembed(params: Any, configuration: Any, h: np.ndarray) -> np.ndarray:
    """`ln_f` then the unembedding, in float64 from the parameters."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    eps = float(configuration["architecture/norm_eps"])
    scale = p["ln_f"]["scale"]
    if configuration["architecture/norm"] == "rmsnorm":
        h = h / np.sqrt((h**2).mean(axis=-1, keepdims=True) + eps) * scale
    else:
        centred = h - h.mean(axis=-1, keepdims=True)
        h = centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + eps) * scale
        if "bias" in p["ln_f"]:
            h = h + p["ln_f"]["bias"]
    if "lm_head" in p:
        return h @ p["lm_head"]["kernel"]
    return h @ p["wte"]["embedding"].T


def token_losses(logits: np.ndarray, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """`(losses [b, s], counted [b, s])` in float64 (0 where not counted)."""
    counted = (batch["y"] >= 0) & batch["padding_mask"].astype(bool)
    logp = log_softmax(logits)
    picked = np.take_along_axis(logp, np.where(counted, batch["y"], 0)[..., None], axis=-1)[..., 0]
    return np.where(counted, -picked, 0.0), counted


Forwards = list[tuple[np.ndarray, np.ndarray]]


def forwards(state: Any, batches: list[dict[str, np.ndarray]]) -> Forwards:
    """`forward` of each batch."""
    return [forward(state, batch["x"]) for batch in batches]


def lens(
    state: Any, configuration: Any, batches: list[dict[str, np.ndarray]], ran: Forwards
) -> dict[str, Any]:
    """Each residual stream's mean loss and `KL(final || layer)` over the batches' counted
    targets, and the final logits' mean loss."""
    loss = kl = final_loss = 0.0
    count = 0
    for batch, (logits, streams) in zip(batches, ran, strict=True):
        _, counted = token_losses(logits, batch)
        final = log_softmax(logits)
        per_layer = []
        for h in streams:
            logp = log_softmax(unembed(state.params, configuration, h))
            nll, _ = token_losses(logp, batch)
            div = (np.exp(final) * (final - logp)).sum(axis=-1)
            per_layer.append((nll.sum(), np.where(counted, div, 0.0).sum()))
        loss = loss + np.array([a for a, _ in per_layer])
        kl = kl + np.array([b for _, b in per_layer])
        final_loss += token_losses(logits, batch)[0].sum()
        count += int(counted.sum())
    return {"loss": loss / count, "kl": kl / count, "final_loss": final_loss / count}


def position_sums(
    batches: list[dict[str, np.ndarray]], ran: Forwards
) -> tuple[np.ndarray, np.ndarray]:
    """Loss summed over the batches' rows at each position, and the counts `[seq]`."""
    total = count = 0
    for batch, (logits, _) in zip(batches, ran, strict=True):
        nll, counted = token_losses(logits, batch)
        total = total + nll.sum(axis=0)
        count = count + counted.sum(axis=0)
    return np.asarray(total), np.asarray(count)


def buckets_of(train: np.ndarray, vocab: int, buckets: int) -> np.ndarray:
    """Each id's frequency bucket: types taken from the most frequent (ties: lower id
    first), a type in bucket `b` when the share of the tokens before it is in
    `[b/buckets, (b+1)/buckets)`; unused types in the last."""
    counts = np.bincount(train, minlength=vocab)[:vocab].astype(np.float64)
    order = sorted(range(vocab), key=lambda t: (-counts[t], t))
    out = np.full(vocab, buckets - 1)
    seen = 0.0
    for t in order:
        if counts[t] > 0:
            out[t] = min(int(seen / counts.sum() * buckets), buckets - 1)
        seen += counts[t]
    return out


def frequency_sums(
    batches: list[dict[str, np.ndarray]], ran: Forwards, of: np.ndarray, buckets: int
) -> tuple[np.ndarray, np.ndarray]:
    """Loss summed per bucket of the target token, and the counts `[buckets]`."""
    total, count = np.zeros(buckets), np.zeros(buckets)
    for batch, (logits, _) in zip(batches, ran, strict=True):
        nll, counted = token_losses(logits, batch)
        ids = of[np.where(counted, batch["y"], 0)]
        np.add.at(total, ids[counted], nll[counted])
        np.add.at(count, ids[counted], 1)
    return total, count
