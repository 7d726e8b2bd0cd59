"""Ranges and rules: the values a numeric setting admits, and checks across settings.

A numeric field declares its range where it is declared
(``field("training/batch_size", default=16, ge=1)``); :class:`Range` holds the bounds
and :func:`check_value` refuses a value outside them with one line that names the
key, the range, the value that arrived and how to fix it. NaN is never in a range, and
neither is an infinity unless a bound is infinite itself (``le=math.inf``).
``unbounded=True`` is the explicit opt-out: any finite number.

A :class:`Rule` checks several settings together (``training/tokens`` at least one
batch); :meth:`theseus.config.Tree.check` runs every rule whose settings the
configuration declares and has values for.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any

from theseus.config._errors import ConfigError, ConfigRangeError
from theseus.config._path import normalize_path

Number = int | float


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class Range:
    """The numbers a setting admits: optional bounds, or ``unbounded``.

    Attributes:
        ge: the least value allowed (inclusive).
        gt: a value every allowed one is greater than (exclusive).
        le: the greatest value allowed (inclusive).
        lt: a value every allowed one is less than (exclusive).
        unbounded: any finite number (the explicit opt-out of bounds).
    """

    ge: Number | None = None
    gt: Number | None = None
    le: Number | None = None
    lt: Number | None = None
    unbounded: bool = False

    def __post_init__(self) -> None:
        bounds = {"ge": self.ge, "gt": self.gt, "le": self.le, "lt": self.lt}
        given = {k: v for k, v in bounds.items() if v is not None}
        for name, bound in given.items():
            if not _is_number(bound) or math.isnan(bound):
                raise ConfigError(
                    f"A range bound {name}= must be a number; got {bound!r}. Write e.g. ge=0."
                )
        if (self.ge is not None and self.gt is not None) or (
            self.le is not None and self.lt is not None
        ):
            raise ConfigError(
                f"A range takes one lower bound (ge= or gt=) and one upper bound (le= or lt=); "
                f"got {', '.join(f'{k}={v!r}' for k, v in given.items())}. Keep one of each."
            )
        if self.unbounded and given:
            raise ConfigError(
                f"unbounded=True means no bounds, and bounds were given too "
                f"({', '.join(f'{k}={v!r}' for k, v in given.items())}); pass one or the other."
            )
        low, high = self.lower, self.upper
        if low is not None and high is not None and not self._inside_bounds(low, high):
            raise ConfigError(
                f"The range {self.describe()} is empty; make the lower bound smaller than "
                "the upper one."
            )

    @property
    def lower(self) -> Number | None:
        """The lower bound (inclusive or not), or ``None``."""
        return self.ge if self.ge is not None else self.gt

    @property
    def upper(self) -> Number | None:
        """The upper bound (inclusive or not), or ``None``."""
        return self.le if self.le is not None else self.lt

    def _inside_bounds(self, low: Number, high: Number) -> bool:
        if self.ge is not None and self.le is not None:
            return low <= high
        return low < high

    def admits(self, value: Number) -> bool:
        """Whether the number ``value`` is inside the range."""
        if math.isnan(value):
            return False
        if math.isinf(value) and value not in (self.lower, self.upper):
            return False
        return not (
            (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
            or (self.lt is not None and value >= self.lt)
        )

    def describe(self) -> str:
        """The range in words: ``">= 1"``, ``">= 0 and < 1"``; ``""`` when unbounded."""
        parts = [
            f"{sign} {bound!r}"
            for sign, bound in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
            if bound is not None
        ]
        return " and ".join(parts)


def range_of(
    ge: Number | None, gt: Number | None, le: Number | None, lt: Number | None, unbounded: bool
) -> Range | None:
    """The :class:`Range` that ``field()``'s keywords declare, or ``None`` when none do."""
    if not unbounded and ge is None and gt is None and le is None and lt is None:
        return None
    return Range(ge=ge, gt=gt, le=le, lt=lt, unbounded=unbounded)


def is_numeric(tp: Any) -> bool:
    """Whether the annotation ``tp`` holds numbers (``int``, ``float``, their unions, lists of them).

    ``bool`` is not a number here.
    """
    if tp is int or tp is float:
        return True
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType, list, tuple, dict):
        return any(is_numeric(arg) for arg in typing.get_args(tp) if arg is not Ellipsis)
    return False


def kind(tp: Any) -> str:
    """``"an integer"`` or ``"a finite number"``: what a value of ``tp`` is called in messages."""
    return "a finite number" if "float" in repr(tp) else "an integer"


def numbers(value: Any) -> list[Number]:
    """The numbers inside a (coerced) value: itself, or the items of a list, tuple or dict."""
    if _is_number(value):
        return [value]
    if isinstance(value, (list, tuple)):
        return [n for item in value for n in numbers(item)]
    if isinstance(value, dict):
        return [n for item in value.values() for n in numbers(item)]
    return []


def check_value(path: str, value: Any, declared: Range | None, tp: Any, default: Any) -> None:
    """Refuse a value with a number outside ``declared``.

    Args:
        path: the setting's path, named in the message.
        value: the coerced value (a number, a list of numbers, ``None``, ...).
        declared: the setting's range; ``None`` checks nothing.
        tp: the declared annotation (``int`` or ``float``, for the message).
        default: the setting's default, suggested in the message (``MISSING`` when required).

    Raises:
        ConfigRangeError: a number is outside the range.
    """
    if declared is None:
        return
    for number in numbers(value):
        if not declared.admits(number):
            raise ConfigRangeError(out_of_range(path, declared, tp, number, value, default))


def out_of_range(
    path: str, declared: Range, tp: Any, number: Number, value: Any, default: Any
) -> str:
    """The one-line message for ``number`` (in ``value``) outside the range of ``path``."""
    got = repr(number) if number == value or number is value else f"{number!r} in {value!r}"
    example = (
        default
        if default is not dataclasses.MISSING and numbers(default) and default is not None
        else "VALUE"
    )
    return (
        f"Configuration value for {path!r} must be "
        f"{' '.join(filter(None, (kind(tp), declared.describe())))}; "
        f"got {got}. Set it within that range "
        f"in the YAML file, with `{path.replace('/', '.')}={_plain(example)}` on the command "
        f"line, or with q.config[{path!r}] = {_plain(example)}"
        f"{' (the default)' if example != 'VALUE' else ''}."
    )


def _plain(value: Any) -> str:
    return str(list(value)) if isinstance(value, tuple) else str(value)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A check across settings: ``check(*values)`` returns the problem in one line, or ``None``.

    Attributes:
        paths: the settings it reads, in the order ``check`` takes their values.
        check: returns ``None`` when the values agree, else the message (what is
            expected, what arrived, how to fix it).
    """

    paths: tuple[str, ...]
    check: Callable[..., str | None]


def rule(*paths: str) -> Callable[[Callable[..., str | None]], Rule]:
    """Decorate a function of the values at ``paths`` into a :class:`Rule`.

    Declare it on a field with ``field(..., rules=[the_rule])``; it runs when the
    configuration is checked (:meth:`theseus.config.Tree.check`), once every path is
    declared and set.

    Example:
        >>> @rule("training/tokens", "training/batch_size")
        ... def enough(tokens, batch_size):
        ...     return None if tokens >= batch_size else f"{tokens} < {batch_size}"
        >>> enough.check(1, 8)
        '1 < 8'
    """
    canonical = tuple(normalize_path(p) for p in paths)

    def decorate(check: Callable[..., str | None]) -> Rule:
        return Rule(canonical, check)

    return decorate
