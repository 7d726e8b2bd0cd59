"""The analysis examples of the user's documentation, verbatim, plus test-only analyses.

Loaded by the tests with `import_module_or_file`, as a user's `--import` would load it.
PretrainGPT trains on the offline synthetic language, so no dataset had to be swapped.
"""

# ---- verbatim: "Adding an analysis job" ----
from dataclasses import dataclass

from theseus.analysis import AnalysisBase
from theseus.config import field
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.model.debug import DebugInputs
from theseus.registry import analysis
from theseus.training.base import BaseTrainerConfig


@dataclass
class InspectConfig(BaseTrainerConfig):
    target: str = field("analysis/target", default="blocks_0/attn")


@analysis("my-model/analyze/activation")
class InspectActivation(AnalysisBase, PretrainGPT):
    CONFIG = InspectConfig
    TARGET = SelfAttention
    NAME = "activation"

    def select(self, paths: list[str]) -> str:
        if self.args.target not in paths:
            raise ValueError(f"Choose a discovered path: {paths}")
        return self.args.target

    def analyze(self, layer, inputs: DebugInputs):
        # Bound the result before the framework gathers it.
        return inputs.x[0, :64, :128]

    def plot(self, results):
        return self.heatmap(results, xlabel="Feature", ylabel="Token")


# ---- verbatim: "Analysis System" ----
from theseus.registry import job  # noqa: E402


@analysis("my/gpt/activations")
class Activations(AnalysisBase, PretrainGPT):
    TARGET = SelfAttention
    NAME = "activations"

    def select(self, paths):
        return paths[0]  # First discovered attention module.

    def analyze(self, layer, inputs):
        return inputs.x[0, :64, :128]  # First sample; crop tokens/features.

    def plot(self, values):
        return self.heatmap(values, xlabel="Feature", ylabel="Token")


import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def activations_scope(j) -> Figure:
    attentions = j.find(SelfAttention)
    layer, inputs = j.debug(attentions[0])  # noqa: RUF059 (verbatim)
    values = inputs.x[0, :64, :128]
    return sns.heatmap(values)


@job("my/gpt/train-with-analysis")
class GPTWithAnalysis(PretrainGPT):
    ANALYSIS = [Activations]


# ---- test-only analyses (not from the documentation) ----
import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from theseus.model.models import MLP  # noqa: E402

TINY = {
    "architecture/n_layers": 2,
    "architecture/n_embd": 32,
    "architecture/n_head": 2,
    "architecture/block_size": 32,
    "training/batch_size": 8,
    "training/validation_steps": 1,
    "logging/report_interval": 2,
    "logging/validation_interval": 2,
    "logging/checkpoint_interval": 2,
}


def tiny(config, steps=4, **extra):
    """Apply the tiny settings to a composed configuration (`q.config`)."""
    for key, value in {**TINY, **extra}.items():
        config[key] = value
    config["training/tokens"] = (
        steps * config["training/batch_size"] * config["architecture/block_size"]
    )
    return config


class Stats(AnalysisBase, PretrainGPT):
    """A JSON result: the selected attention's input statistics and output crop."""

    TARGET = SelfAttention
    NAME = "stats"

    def select(self, paths):
        return paths[-1]

    def analyze(self, layer, inputs):
        out = layer(inputs.x)
        return {"x": inputs.x[:, :4, :8], "out": out[:, :4, :8], "mean": inputs.x.mean()}

    def plot(self, results):
        return {key: value.tolist() for key, value in results.items()}


class Several(AnalysisBase, PretrainGPT):
    """A list selection in an order that differs from the call order."""

    TARGET = (SelfAttention, MLP)
    NAME = "several"
    CHOICE = ["blocks_1/mlp", "blocks_0/attn", "blocks_1/attn"]

    def select(self, paths):
        return list(self.CHOICE)

    def analyze(self, layers, inputs):
        assert isinstance(layers, list) and isinstance(inputs, list)
        return [layer(given.x)[:, :2, :4] for layer, given in zip(layers, inputs, strict=True)]

    def plot(self, results):
        return [r.tolist() for r in results]


class OneInList(Several):
    NAME = "one-in-list"
    CHOICE = ["blocks_0/attn"]


class TrainWithStats(PretrainGPT):
    ANALYSIS = [Stats, Several]


class ReversedTrace(PretrainGPT):
    """A custom trace: the model reads every sequence backwards (no dropout)."""

    @classmethod
    def trace(cls, state, batch, key, *, sharding):
        flipped = {name: value[:, ::-1] for name, value in batch.items()}
        with (
            jax.sharding.use_abstract_mesh(sharding.mesh.abstract_mesh),
            nn.logical_axis_rules(sharding.parameter_fwdbwd_mapping),
        ):
            return cls.forward(state, state.params, flipped, key=key, deterministic=True)


class ReversedStats(AnalysisBase, ReversedTrace):
    TARGET = SelfAttention
    NAME = "reversed"

    def select(self, paths):
        return paths[0]

    def analyze(self, layer, inputs):
        return inputs.x[:, :4, :8]

    def plot(self, results):
        return None


def embed_reference(trainer, x):
    """The input of `blocks_0/attn` computed by hand: `ln_1(wte[x])` (no dropout)."""
    params = trainer.state.params
    h = jnp.take(params["wte"]["embedding"], x, axis=0)
    mean = h.mean(-1, keepdims=True)
    var = ((h - mean) ** 2).mean(-1, keepdims=True)
    return (h - mean) / jnp.sqrt(var + 1e-5) * params["blocks_0"]["ln_1"]["scale"]


@analysis("analysis-tests/stats")
class RegisteredStats(Stats):
    """`Stats` under a registered name, for `theseus configure` and `theseus run --over`."""
