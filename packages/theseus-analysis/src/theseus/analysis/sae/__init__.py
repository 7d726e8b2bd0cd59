"""Sparse autoencoders: the model, its training step and its measures, and feature matching.

The ground the ``SAEBase`` analysis kind will stand on (training on a site's activations
streamed from the compiled forward, chained over checkpoints, in tandem with training).
"""

from theseus.analysis.sae._match import Match, match
from theseus.analysis.sae._model import (
    ARCHITECTURES,
    SAEConfig,
    decode,
    encode,
    init_params,
    loss_and_metrics,
    make_train_step,
    measures,
)

__all__ = [
    "ARCHITECTURES",
    "Match",
    "SAEConfig",
    "decode",
    "encode",
    "init_params",
    "loss_and_metrics",
    "make_train_step",
    "match",
    "measures",
]
