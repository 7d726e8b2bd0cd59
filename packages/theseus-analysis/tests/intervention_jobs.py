"""Interventions the tests run (standalone, in tandem, sharded, on two processes).

Loaded with `import_module_or_file`, as a user's `--import` would load it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from theseus.analysis import InterventionBase
from theseus.analysis import interventions as iv
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.model.models import MLP, Block


class HeadAblation(InterventionBase, PretrainGPT):
    """The loss change from zero-ablating each head of each layer (a sweep)."""

    TARGET = SelfAttention
    NAME = "head-ablation"

    def select(self, paths):
        return paths

    def variants(self, layer):
        return layer.config.n_head

    def intervene(self, site):
        return iv.ablate_head(site, site.variant)

    def plot(self, change):
        return change.tolist()


class HeadAblationTokens(HeadAblation):
    """The same sweep, judged by every target's loss (no averaging: exact differences)."""

    NAME = "head-ablation-tokens"

    def measure(self, outcome):
        return iv.token_losses(outcome)

    def plot(self, change):
        return None


class MeanHeadAblationTokens(HeadAblationTokens):
    NAME = "mean-head-ablation-tokens"

    def intervene(self, site):
        return iv.ablate_head(site, site.variant, how="mean")


class ZeroMLP(InterventionBase, PretrainGPT):
    """Zero-ablate the last MLP's output: every target's loss with and without."""

    TARGET = MLP
    NAME = "zero-mlp"

    def select(self, paths):
        return paths[-1]

    def intervene(self, site):
        return iv.zero(site)

    def measure(self, outcome):
        return iv.token_losses(outcome)

    def analyze(self, effect):
        return {"baseline": effect.baseline, "intervened": effect.intervened}

    def plot(self, results):
        return {k: v.tolist() for k, v in results.items()}


class MeanAttention(ZeroMLP):
    """Mean-ablate the first attention layer's output."""

    TARGET = SelfAttention
    NAME = "mean-attention"

    def select(self, paths):
        return paths[0]

    def intervene(self, site):
        return iv.mean(site)


def rolled(batch):
    """The corrupted batch: every row takes the next row's tokens."""
    return {name: jnp.roll(value, 1, axis=0) for name, value in batch.items()}


class PatchLastBlock(InterventionBase, PretrainGPT):
    """Patch the last block's output from the batch into its corrupted twin: logits."""

    TARGET = Block
    NAME = "patch-last-block"

    def select(self, paths):
        return paths[-1]

    def corrupt(self, batch):
        return rolled(batch)

    def intervene(self, site):
        return iv.patch(site)

    def measure(self, outcome):
        return outcome.logits

    def analyze(self, effect):
        return {
            "source": effect.source,
            "baseline": effect.baseline,
            "intervened": effect.intervened,
        }

    def plot(self, results):
        return None


class PatchHeads(InterventionBase, PretrainGPT):
    """Patch each head of each layer from the clean batch into the corrupted one: loss."""

    TARGET = SelfAttention
    NAME = "patch-heads"

    def select(self, paths):
        return paths

    def variants(self, layer):
        return layer.config.n_head

    def corrupt(self, batch):
        return rolled(batch)

    def intervene(self, site):
        return iv.patch_head(site, site.variant)

    def analyze(self, effect):
        return {"change": effect.change, "baseline": effect.baseline, "source": effect.source}

    def plot(self, results):
        return {k: v.tolist() for k, v in results.items()}


class PatchHeadsTokens(PatchHeads):
    """Patching judged by every target's loss."""

    NAME = "patch-heads-tokens"

    def measure(self, outcome):
        return iv.token_losses(outcome)


class AttributeHeads(PatchHeads):
    """The same sweep estimated by attribution patching (one forward, one backward)."""

    NAME = "attribute-heads"
    ESTIMATE = "linear"


STEER_SCALE = 4.0


def steering_vector(width: int) -> jax.Array:
    """A fixed unit direction of the residual stream."""
    v = jax.random.normal(jax.random.key(7), (width,), jnp.float32)
    return v / jnp.linalg.norm(v)


class Steer(InterventionBase, PretrainGPT):
    """Add a direction to the first block's output; KL of the next-token distribution."""

    TARGET = Block
    NAME = "steer"

    def select(self, paths):
        return paths[0]

    def intervene(self, site):
        return iv.steer(site, steering_vector(site.output.shape[-1]), STEER_SCALE)

    def measure(self, outcome):
        return outcome.logits[:, -1]

    def analyze(self, effect):
        return {"kl": iv.kl(effect.baseline, effect.intervened).mean()}

    def plot(self, results):
        return {"kl": float(results["kl"])}


class TrainWithHeadAblation(PretrainGPT):
    """Training with the head-ablation sweep in tandem, at validation cadence."""

    ANALYSIS = [HeadAblation]
