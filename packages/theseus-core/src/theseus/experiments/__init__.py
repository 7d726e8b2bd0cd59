"""Built-in experiments, registered as jobs when the registry is first used."""

from theseus.experiments.models import gpt as gpt

__all__ = ["gpt"]
