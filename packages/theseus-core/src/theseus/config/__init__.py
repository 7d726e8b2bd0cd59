"""Configuration of Theseus jobs: paths, composition, hydration, YAML.

A dataclass field declared with :func:`field` lives at a path of one tree
(``"training/batch_size"``). A job's tree is composed from its ``CONFIG`` and
every class it declares (:func:`compose`, :class:`Tree`); :func:`configure`
hydrates a dataclass from the active tree (:func:`using`).
"""

from theseus.config._compose import Entry, compose
from theseus.config._errors import (
    ConfigError,
    ConfigTypeError,
    ConflictError,
    MissingValueError,
    UnknownKeyError,
)
from theseus.config._field import field, normalize_path
from theseus.config._hydrate import active, configure, using
from theseus.config._tree import Section, Tree
from theseus.config._yaml import dump, load, parse_overrides

__all__ = [
    "ConfigError",
    "ConfigTypeError",
    "ConflictError",
    "Entry",
    "MissingValueError",
    "Section",
    "Tree",
    "UnknownKeyError",
    "active",
    "compose",
    "configure",
    "dump",
    "field",
    "load",
    "normalize_path",
    "parse_overrides",
    "using",
]
