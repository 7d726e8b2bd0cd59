"""The common interventions, for `InterventionBase.intervene(site)` to return.

Each takes the `Site` the engine hands to `intervene` and returns the call's
replacement output::

    def intervene(self, site):
        return interventions.ablate_head(site, site.variant)   # one head of a layer

Head interventions need a layer with a `heads(x)` method giving each head's
contribution, `[batch, seq, n_head, n_embd]` (Theseus's `SelfAttention` has one).
They also hold for a call whose output is that layer's output plus a bias: the
head's contribution is what changes. `token_losses`, `kl` and `logit_difference` are measures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from theseus.analysis._sites import InterventionError, Site

__all__ = [
    "ablate_head",
    "head_contributions",
    "kl",
    "logit_difference",
    "mean",
    "patch",
    "patch_head",
    "steer",
    "token_losses",
    "zero",
]


def zero(site: Site) -> Any:
    """Zero-ablation: the call returns zeros."""
    return jax.tree.map(jnp.zeros_like, site.output)


def mean(site: Site, axis: int | Sequence[int] = (0, 1)) -> Any:
    """Mean-ablation: every entry replaced by the output's mean over `axis`.

    The default, batch and positions, keeps each feature's average over the batch the
    intervention runs on and removes what varies with the token and the row.
    """
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return jax.tree.map(
        lambda out: jnp.broadcast_to(out.mean(axis=axes, keepdims=True), out.shape), site.output
    )


def steer(site: Site, vector: Any, scale: float | jax.Array = 1.0) -> jax.Array:
    """Add `scale * vector` to the output (`vector` broadcasts against it: `[n_embd]`)."""
    vector = jnp.asarray(vector, dtype=site.output.dtype)
    return site.output + jnp.asarray(scale, site.output.dtype) * vector


def patch(site: Site) -> Any:
    """Activation patching: the output the same call gave on the source batch."""
    return _source(site, "patch").output


def head_contributions(site: Site, source: bool = False) -> jax.Array:
    """Each head's contribution at this call, `[batch, seq, n_head, n_embd]`.

    Args:
        site: a call of a layer with a `heads(x)` method (Theseus's `SelfAttention`).
        source: the contributions on the source batch instead (patching).
    """
    heads = getattr(site.layer, "heads", None)
    if heads is None:
        raise InterventionError(
            f"the layer at {site.path!r} ({type(site.layer.module).__name__}) has no "
            "heads(x) method giving each head's contribution; select a SelfAttention call"
        )
    inputs = _source(site, "patch_head").inputs if source else site.inputs
    return heads(inputs["x"])


def ablate_head(site: Site, head: int | jax.Array, how: str = "zero") -> jax.Array:
    """The output without head `head`'s contribution (`how="mean"`: with its mean instead).

    `how="zero"` removes the head (as zeroing its attention output before the output
    projection does); `"mean"` puts in its contribution averaged over batch and positions.
    """
    if how not in ("zero", "mean"):
        raise InterventionError(f"ablate_head(how={how!r}); use 'zero' or 'mean'")
    contribution = jnp.take(head_contributions(site), head, axis=2)
    replaced = site.output - contribution
    if how == "mean":
        replaced = replaced + contribution.mean(axis=(0, 1), keepdims=True)
    return replaced


def patch_head(site: Site, head: int | jax.Array) -> jax.Array:
    """The output with head `head`'s contribution taken from the source batch."""
    here = jnp.take(head_contributions(site), head, axis=2)
    there = jnp.take(head_contributions(site, source=True), head, axis=2)
    return site.output - here + there


def token_losses(outcome: Any) -> jax.Array:
    """Each target's cross-entropy `[batch, seq]` in nats (float32; 0 where not counted).

    The mean loss averages these over the counted targets; a sweep's per-token changes
    show which tokens an intervention hurts.
    """
    targets = outcome.batch["y"]
    counted = targets >= 0
    if "padding_mask" in outcome.batch:
        counted = counted & outcome.batch["padding_mask"].astype(bool)
    logp = jax.nn.log_softmax(outcome.logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, jnp.where(counted, targets, 0)[..., None], axis=-1)
    return jnp.where(counted, -picked[..., 0], 0.0)


def kl(reference: jax.Array, logits: jax.Array, axis: int = -1) -> jax.Array:
    """KL(softmax(reference) || softmax(logits)) over `axis`, in nats (float32).

    Broadcasts: `kl(baseline_logits, intervened_logits)` with a sweep's leading axes.
    """
    p = jax.nn.log_softmax(reference.astype(jnp.float32), axis=axis)
    q = jax.nn.log_softmax(logits.astype(jnp.float32), axis=axis)
    return jnp.sum(jnp.exp(p) * (p - q), axis=axis)


def logit_difference(logits: jax.Array, correct: jax.Array, wrong: jax.Array) -> jax.Array:
    """Mean over rows of `logits[:, -1, correct] - logits[:, -1, wrong]` at the last position.

    `correct` and `wrong` are token ids, one per row or one for all rows.
    """
    last = logits[:, -1].astype(jnp.float32)
    rows = jnp.arange(last.shape[0])
    correct = jnp.broadcast_to(jnp.asarray(correct), rows.shape)
    wrong = jnp.broadcast_to(jnp.asarray(wrong), rows.shape)
    return jnp.mean(last[rows, correct] - last[rows, wrong])


def _source(site: Site, what: str) -> Any:
    if site.source is None:
        raise InterventionError(
            f"{what}() at {site.path!r} needs a source batch: define corrupt(batch) on the "
            "intervention (the batch is then the source, corrupt(batch) the target)"
        )
    return site.source
