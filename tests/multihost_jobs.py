"""Jobs of the two-process test: the tiny synthetic trainer with a tandem analysis.

Loaded by tests/test_multihost.py (the one-process reference) and by every
tests/multihost_worker.py process with `import_module_or_file`, so both runs train and
inspect with the very same classes.
"""

import os

from theseus.analysis import AnalysisBase
from theseus.model.attention.base import SelfAttention
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


class TrainWithCrop(trainer_jobs.SyntheticTrainer):
    """The synthetic trainer that runs `Crop` at every validation."""

    ANALYSIS = [Crop]


def record_tandem(trainer):
    """The list that the trainer's tandem `Crop` view appends each run's `AnalysisResult` to."""
    [view] = trainer._views  # attached at setup
    results = []
    run = view.run
    view.run = lambda **kw: results.append(run(**kw)) or results[-1]
    return view, results


SETTINGS = {"logging/checkpoint_interval": 3, "logging/validation_interval": 3}
STEPS = 6
