"""Built-in experiments, registered as jobs when the registry is first used."""

from theseus.experiments.models import gpt as gpt
from theseus.experiments.models import gpt2 as gpt2
from theseus.experiments.models import hf as hf
from theseus.experiments.models import suite as suite

__all__ = ["gpt", "gpt2", "hf", "suite"]
