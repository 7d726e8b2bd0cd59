"""Sparse autoencoders: the ``SAEBase`` analysis kind, the model, its training step and
its measures, feature matching, and SAELens's on-disk format.

``SAEBase`` trains SAEs on a site's activations streamed from the compiled forward, on
one node, chained over a lineage's checkpoints, or in tandem with training.
"""

from theseus.analysis.sae._analysis import SAEBase
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
    "SAEBase",
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
