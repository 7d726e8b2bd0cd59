"""`TrainerError`: the error every part of the trainer raises for a setup that cannot work.

It lives apart from `base.py` so that the trainer's modules (`_steps`, `_restore`,
`_inspection`, ...) can raise it without importing the trainer; `theseus.training.base`
and `theseus.training` re-export it.
"""

from __future__ import annotations

from theseus.errors import TheseusError

__all__ = ["TrainerError"]


class TrainerError(TheseusError, ValueError):
    """A trainer configuration or setup that cannot work, with the fix in the message."""
