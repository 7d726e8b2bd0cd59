"""Seed 003's trainer examples, verbatim, plus the tiny settings tests train with.

Loaded by the trainer tests with `import_module_or_file`, like a user's `--import`.
"""

# ---- verbatim from the user's documentation (seed 003) ----
from theseus.data.datasets import FineWeb
from theseus.model.models import GPT
from theseus.registry import job
from theseus.training.base import BaseTrainer, BaseTrainerConfig
from theseus.training.flywheel.strategy import Sampling
from theseus.training.optimizers import AdamW
from theseus.training.schedules import WSD


@job("my/gpt/train")
class MyTrainer(BaseTrainer):
    CONFIG = BaseTrainerConfig
    MODEL = GPT
    DATASET = Sampling(FineWeb, 1.0, "pmd")
    OPTIMIZER = AdamW
    SCHEDULE = WSD
    EVALUATION = []
    ANALYSIS = []


class IgnoreFirstTarget(MyTrainer):
    def batch(self, slice="train"):
        batch = dict(super().batch(slice))
        batch["y"] = batch["y"].copy()
        batch["y"][..., 0] = -1
        return batch


import jax.numpy as jnp  # noqa: E402


class LogitRMS(MyTrainer):
    @staticmethod
    def forward(state, params, batch, key=None, deterministic=False, intermediates=False):
        logits, loss, meta = MyTrainer.forward(
            state,
            params,
            batch,
            key=key,
            deterministic=deterministic,
            intermediates=intermediates,
        )
        rms = jnp.sqrt(jnp.mean(logits.astype(jnp.float32) ** 2))
        return logits, loss, {**meta, "logit_rms": rms}


class StepMetrics(MyTrainer):
    @classmethod
    def train_step(cls, state, batch, key, accumulate_steps, **kwargs):
        state, loss, meta, grad_norm = super().train_step(
            state,
            batch,
            key,
            accumulate_steps,
            **kwargs,
        )
        return state, loss, {**meta, "grad_norm_squared": grad_norm**2}, grad_norm

    @classmethod
    def val_step(cls, state, batch, *, sharding):
        loss_sum, count, meta = super().val_step(state, batch, sharding=sharding)
        return loss_sum, count, {**meta, "valid_tokens": count}


import flax.linen as nn  # noqa: E402
import jax  # noqa: E402


class DeterministicInspection(MyTrainer):
    @classmethod
    def trace(cls, state, batch, key, *, sharding):
        with (
            jax.sharding.use_abstract_mesh(sharding.mesh.abstract_mesh),
            nn.logical_axis_rules(sharding.parameter_fwdbwd_mapping),
        ):
            return cls.forward(state, state.params, batch, key=key, deterministic=True)


# ---- test settings (not from the documentation) ----
from theseus.data.datasets import Synthetic  # noqa: E402

TINY = {
    "architecture/n_layers": 1,
    "architecture/n_embd": 32,
    "architecture/n_head": 2,
    "architecture/block_size": 32,
    "training/batch_size": 8,
    "training/validation_steps": 2,
    "logging/report_interval": 2,
    "logging/validation_interval": 4,
    "logging/checkpoint_interval": 4,
    "optimization/lr": 3e-3,
}


def tiny(config, steps=8, **extra):
    """Apply the tiny settings to a composed configuration (`q.config`)."""
    for key, value in {**TINY, **extra}.items():
        config[key] = value
    config["training/tokens"] = (
        steps * config["training/batch_size"] * config["architecture/block_size"]
    )
    return config


def train_tiny(root, cls, run, steps, **extra):
    """Train `cls` as run `run` under `root` with the tiny settings; return the trainer."""
    from theseus.quick import quick

    with quick(root) as q:
        q.build(cls, run)
        tiny(q.config, steps=steps, **extra)
        trainer = q.create()
        trainer()
    return trainer


@job("test/synthetic/train")
class SyntheticTrainer(BaseTrainer):
    """A trainer on the offline synthetic language with a constant learning rate."""

    DATASET = Synthetic
