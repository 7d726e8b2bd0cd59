"""Jobs of the two-process test: the tiny synthetic trainer with a tandem analysis.

Loaded by tests/test_multihost.py (the one-process reference) and by every
tests/multihost_worker.py process with `import_module_or_file`, so both runs train and
inspect with the very same classes.
"""

import os

import jax.numpy as jnp

from theseus.analysis import AnalysisBase, InterventionBase
from theseus.analysis import interventions as iv
from theseus.analysis.sae import SAEBase
from theseus.model.attention.base import SelfAttention
from theseus.model.mlp import MLP
from theseus.registry import import_module_or_file

_here = os.path.dirname(os.path.abspath(__file__))
trainer_jobs = import_module_or_file(
    os.path.join(_here, "..", "packages", "theseus-core", "tests", "trainer_jobs.py")
)
tiny = trainer_jobs.tiny


class Crop(AnalysisBase, trainer_jobs.SyntheticTrainer):
    """The input and output of the attention, cropped to 4 tokens x 8 features of EVERY row.

    The batch is split by rows over hosts and devices, so the crop holds rows that each
    host placed: the results must be gathered across hosts before they are plotted.
    """

    TARGET = SelfAttention
    NAME = "crop"

    def select(self, paths):
        return "blocks_0/attn"

    def analyze(self, layer, inputs):
        return {"x": inputs.x[:, :4, :8], "out": layer(inputs.x)[:, :4, :8]}

    def plot(self, results):
        return {key: value.tolist() for key, value in results.items()}


class BrokenPlot(Crop):
    """`Crop` whose plot() fails; it runs only on host zero, so only host zero sees it."""

    NAME = "broken"

    def plot(self, results):
        raise RuntimeError("plot() failed on purpose")


class PatchHeads(InterventionBase, trainer_jobs.SyntheticTrainer):
    """Every head of every layer patched from the batch into its rows rolled by one.

    Rolling the rows moves rows between hosts, and each intervened forward runs on the
    whole global batch: every target's loss, per layer and head.
    """

    TARGET = SelfAttention
    NAME = "patch-heads"

    def select(self, paths):
        return paths

    def variants(self, layer):
        return layer.config.n_head

    def corrupt(self, batch):
        return {name: jnp.roll(value, 1, axis=0) for name, value in batch.items()}

    def intervene(self, site):
        return iv.patch_head(site, site.variant)

    def measure(self, outcome):
        return iv.token_losses(outcome)

    def plot(self, change):
        return {"change": change.tolist()}


class TrainWithCrop(trainer_jobs.SyntheticTrainer):
    """The synthetic trainer that runs `Crop` at every validation."""

    ANALYSIS = [Crop]


def record_tandem(trainer):
    """The list that the trainer's tandem `Crop` view appends each run's `AnalysisResult` to."""
    [view] = trainer.loop.views  # attached at setup
    results = []
    run = view.run
    view.run = lambda **kw: results.append(run(**kw)) or results[-1]
    return view, results


SETTINGS = {"logging/checkpoint_interval": 3, "logging/validation_interval": 3}
STEPS = 6


class Features(SAEBase, trainer_jobs.SyntheticTrainer):
    """Two top-k SAEs (two widths) on the last MLP, chained over a lineage's checkpoints."""

    TARGET = MLP
    NAME = "features"
    WIDTH = (48, 64)
    K = 4
    TOKENS = 2048
    BUFFER = 2

    def select(self, paths):
        return paths[-1]
