"""Configuration of Theseus jobs: paths, composition, hydration, YAML.

A dataclass field declared with :func:`field` lives at a path of one tree
(``"training/batch_size"``). A job's tree is composed from its ``CONFIG`` and
every class it declares (:func:`compose`, :class:`Tree`); :func:`configure`
hydrates a dataclass from the active tree (:func:`using`). A numeric field declares
its range (``field(..., ge=1)``, :class:`Range`) and may attach :func:`rule` checks
across settings; values outside are refused (:class:`ConfigRangeError`). A path an
earlier version declared is listed as :class:`Retired`, so its files still load.
"""

from theseus.config._compose import Entry, compose
from theseus.config._errors import (
    ConfigError,
    ConfigRangeError,
    ConfigTypeError,
    ConflictError,
    MissingValueError,
    UnknownKeyError,
)
from theseus.config._field import field, normalize_path
from theseus.config._files import write_atomic
from theseus.config._hydrate import active, check_settings, configure, using
from theseus.config._range import Range, Rule, rule
from theseus.config._retired import Retired
from theseus.config._tree import Section, Tree
from theseus.config._yaml import dump, load, parse_overrides

__all__ = [
    "ConfigError",
    "ConfigRangeError",
    "ConfigTypeError",
    "ConflictError",
    "Entry",
    "MissingValueError",
    "Range",
    "Retired",
    "Rule",
    "Section",
    "Tree",
    "UnknownKeyError",
    "active",
    "check_settings",
    "compose",
    "configure",
    "dump",
    "field",
    "load",
    "normalize_path",
    "parse_overrides",
    "rule",
    "using",
    "write_atomic",
]
