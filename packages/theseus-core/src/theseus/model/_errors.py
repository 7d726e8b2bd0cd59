"""`ModelInputError`: arrays the model or its loss cannot take.

It lives below `models.py` and `loss.py` (which `models.py` imports) so that both raise
the one class. `LossInputError`, the loss's own class before, is its earlier name: no
caller told the two apart.
"""

from __future__ import annotations

from theseus.errors import TheseusError

__all__ = ["ModelInputError"]


class ModelInputError(TheseusError, ValueError):
    """Arrays the model or its loss cannot take: token ids `[batch, seq]` longer than
    `architecture/block_size`, hidden states, unembedding and targets whose shapes do
    not fit together, or a negative loss chunk."""
