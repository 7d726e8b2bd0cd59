"""Sparse autoencoders: the model, its training step and its measures, feature matching,
and SAELens's on-disk format.

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
from theseus.analysis.sae._saelens import SAELensError, read_saelens, saelens_files

__all__ = [
    "ARCHITECTURES",
    "Match",
    "SAEConfig",
    "SAELensError",
    "decode",
    "encode",
    "init_params",
    "loss_and_metrics",
    "make_train_step",
    "match",
    "measures",
    "read_saelens",
    "saelens_files",
]
