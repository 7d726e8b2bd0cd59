"""Retired settings: paths an earlier version declared on a class that no longer does.

A configuration class lists them in ``RETIRED`` (a tuple of :class:`Retired`). A file
or saved configuration written by the earlier version still holds such a path, at its
old default unless someone set it: that value loads and is dropped, so the file keeps
working; any other value is refused in one line that says where the setting lives now.
A retired path that another composed class declares again is an ordinary setting.

Example:
    >>> from dataclasses import dataclass
    >>> from theseus.config import Tree, field
    >>> @dataclass
    ... class Training:
    ...     RETIRED = (Retired("logging/comet", "", "the analyses declare it"),)
    ...     steps: int = field("training/steps", default=1)
    >>> tree = Tree.of(Training)
    >>> tree.load({"training": {"steps": 2}, "logging": {"comet": ""}})
    []
    >>> tree.flat()
    {'training/steps': 2}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from theseus.config._errors import UnknownKeyError
from theseus.config._field import normalize_path

__all__ = ["Retired", "retired_of"]


@dataclasses.dataclass(frozen=True)
class Retired:
    """A path a configuration class declared in an earlier version.

    Attributes:
        path: the setting's path (``"inspection/prompt"``).
        default: the value the earlier version wrote when nobody set it; a file that
            holds it loads, and the value is dropped.
        now: where the setting is declared today, and what to do instead (the refusal
            of any other value says it).
    """

    path: str
    default: Any
    now: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", normalize_path(self.path))

    def refusal(
        self, key: str, job: str | None, value: Any = dataclasses.MISSING
    ) -> UnknownKeyError:
        """The one-line error for setting this path (to ``value``) in a job that no longer reads it."""
        owner = f"job {job!r}" if job else "this configuration"
        given = "" if value is dataclasses.MISSING else f" (set to {value!r})"
        return UnknownKeyError(
            f"Configuration key {key!r}{given} is no longer a setting of {owner}: "
            f"{self.now}. Remove it from the file or the command line."
        )


def retired_of(classes: Iterable[type], declared: Iterable[str]) -> dict[str, Retired]:
    """``{path: Retired}`` that ``classes`` list in ``RETIRED``, less the paths ``declared``."""
    known = set(declared)
    found: dict[str, Retired] = {}
    for cls in classes:
        for item in getattr(cls, "RETIRED", ()):
            if item.path not in known:
                found.setdefault(item.path, item)
    return found
