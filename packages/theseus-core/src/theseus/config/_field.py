"""``field(path, ...)``: a dataclass field that also says where it lives in the configuration tree."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from theseus.config._errors import ConfigError
from theseus.config._path import normalize_path
from theseus.config._range import Number, Rule, range_of

PATH_KEY = "theseus.path"
HELP_KEY = "theseus.help"
RANGE_KEY = "theseus.range"
RULES_KEY = "theseus.rules"
RESERVED = frozenset({"job"})


def field(
    path: str,
    *,
    default: Any = dataclasses.MISSING,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    help: str = "",
    ge: Number | None = None,
    gt: Number | None = None,
    le: Number | None = None,
    lt: Number | None = None,
    unbounded: bool = False,
    rules: Sequence[Rule] = (),
) -> Any:
    """Declare a dataclass field and the path of its setting in the configuration tree.

    Every class that declares the same path reads the same value. A field with
    neither ``default`` nor ``default_factory`` is required; it is keyword-only
    so it may follow fields that have defaults. On a field whose type is a
    dataclass, ``path`` is a prefix for the nested dataclass's own paths.

    A numeric field declares its range here (``ge``/``gt`` and ``le``/``lt``, or
    ``unbounded=True`` for any finite number); every value the configuration takes
    (default, file, assignment, ``key=value`` override) is checked against it. NaN is
    never admitted, nor an infinity unless a bound is infinite.

    Args:
        path: where the setting lives, ``"training/batch_size"`` (``.`` works too).
        default: the default value.
        default_factory: a zero-argument callable making the default (lists, dicts).
        help: a one-line description, written as a comment by ``dump``.
        ge: the least value allowed.
        gt: a value every allowed one must exceed.
        le: the greatest value allowed.
        lt: a value every allowed one must stay below.
        unbounded: declare that any finite number is allowed (no bounds).
        rules: checks of this setting together with others (see :func:`theseus.config.rule`).

    Returns:
        A ``dataclasses.Field`` carrying the path in its metadata.

    Raises:
        ConfigError: both defaults given, an invalid path, a reserved first segment,
            or bounds that make no range (two lower bounds, an empty range, bounds
            with ``unbounded``).

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Training:
        ...     batch_size: int = field("training/batch_size", default=8, ge=1)
        >>> Training().batch_size
        8
    """
    canonical = normalize_path(path)
    if canonical.split("/")[0] in RESERVED:
        raise ConfigError(
            f"Configuration path {path!r} starts with the reserved segment "
            f"{canonical.split('/')[0]!r} (the saved YAML names its job there); "
            "choose another first segment, e.g. 'training/...'."
        )
    if default is not dataclasses.MISSING and default_factory is not dataclasses.MISSING:
        raise ConfigError(
            f"field({path!r}) got both default= and default_factory=; give one of them "
            "(default_factory for mutable values such as lists)."
        )
    metadata: dict[str, Any] = {PATH_KEY: canonical, HELP_KEY: help}
    declared = range_of(ge, gt, le, lt, unbounded)
    if declared is not None:
        metadata[RANGE_KEY] = declared
    if rules:
        if not all(isinstance(r, Rule) for r in rules):
            raise ConfigError(
                f"field({path!r}) rules= takes theseus.config.rule(...) checks; got {rules!r}. "
                "Decorate each check with @rule('a/b', ...)."
            )
        metadata[RULES_KEY] = tuple(rules)
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    if default is not dataclasses.MISSING:
        return dataclasses.field(default=default, metadata=metadata)
    return dataclasses.field(metadata=metadata, kw_only=True)
