"""``quick(root)``: build a job, set its configuration, pick a base node, create it."""

from theseus.quick._find import Finder, QuickError
from theseus.quick._session import Quick, init, quick

__all__ = [
    "Finder",
    "Quick",
    "QuickError",
    "init",
    "quick",
]
