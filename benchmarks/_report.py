"""The results file every benchmark writes: rows of paired ratios, their median and range.

Every script takes ``--json PATH`` (write its results there) and ``--quick`` (a smoke run);
``python -m benchmarks`` runs them all and turns the files into one table. A file is::

    {"benchmark": str, "quick": bool, "rows": [ROW, ...]}

and each row::

    {"what": str, "ours": str, "theirs": str, "unit": str,
     "ours_samples": [float], "theirs_samples": [float], "ratios": [float],
     "ratio_meaning": str, "goal": str | None, "goal_value": float | None,
     "met": bool | None, "note": str}

``ratios`` are *paired*: each comes from two measurements taken side by side (one round,
one alternation), because on the shared CPUs a ratio of two medians measured apart mixes
in whatever else the machine did. The table shows their median and their range. A file
may carry an optional ``"info"`` object (model size, device) for tools like ``gpu.py``.

Example:
    >>> r = compare("x", [2.0, 4.0], [1.0, 2.0], unit="s", fmt="{:.1f} s", ratio="theirs/ours",
    ...             meaning="theirs time / ours time", goal=(">=", 0.4))
    >>> r.ratios, r.met, r.ours
    ([0.5, 0.5], True, '3.0 s')
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import operator
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "Row",
    "add_arguments",
    "compare",
    "goal_text",
    "info_row",
    "write",
]

_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}


@dataclasses.dataclass
class Row:
    """One line of the table (see the module docstring for the fields)."""

    what: str
    ours: str
    theirs: str
    unit: str
    ours_samples: list[float]
    theirs_samples: list[float]
    ratios: list[float]
    ratio_meaning: str
    goal: str | None = None
    goal_value: float | None = None
    met: bool | None = None
    note: str = ""


def add_arguments(parser: argparse.ArgumentParser, *, quick: bool = True) -> None:
    """Add the runner's options, ``--json PATH`` and (unless it has one) ``--quick``."""
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    if quick:
        parser.add_argument("--quick", action="store_true", help="smoke run: few repeats")


def goal_text(goal: tuple[str, float], unit: str = "") -> str:
    """``(">=", 0.98)`` -> ``">= 0.98"``; with ``unit="ms"``, ``"< 1 ms"``."""
    op, value = goal
    if op not in _OPERATORS:
        raise ValueError(f"goal operator {op!r} is not one of {sorted(_OPERATORS)}")
    return f"{op} {value:g}" + (f" {unit}" if unit else "")


def compare(
    what: str,
    ours: Sequence[float],
    theirs: Sequence[float],
    *,
    unit: str,
    fmt: str,
    ratio: str,
    meaning: str,
    goal: tuple[str, float] | None = None,
    note: str = "",
) -> Row:
    """A row of paired samples: ``ours[i]`` was measured side by side with ``theirs[i]``.

    Args:
        what: the row's name.
        ours, theirs: the paired samples (the same length), in `unit`.
        unit: unit of the samples ("s", "tokens/s", "bytes").
        fmt: format of a median in the ``ours``/``theirs`` cells, e.g. ``"{:,.0f} tokens/s"``.
        ratio: ``"ours/theirs"`` or ``"theirs/ours"``, the quotient taken for each pair.
        meaning: how to read the ratio (e.g. "theirs time / ours time; above 1: ours faster").
        goal: ``(operator, value)`` that the median of the ratios must satisfy, or None.
        note: anything the reader needs to weigh the numbers.

    Raises:
        ValueError: the samples are not paired (different lengths) or `ratio` is unknown.
    """
    if len(ours) != len(theirs):
        raise ValueError(f"{what}: {len(ours)} samples of ours but {len(theirs)} of theirs")
    if ratio == "ours/theirs":
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    elif ratio == "theirs/ours":
        ratios = [b / a for a, b in zip(ours, theirs, strict=True)]
    else:
        raise ValueError(f"ratio must be 'ours/theirs' or 'theirs/ours', not {ratio!r}")
    met = None
    if goal is not None and ratios:
        met = _OPERATORS[goal[0]](statistics.median(ratios), goal[1])
    return Row(
        what=what,
        ours=fmt.format(statistics.median(ours)) if ours else "",
        theirs=fmt.format(statistics.median(theirs)) if theirs else "",
        unit=unit,
        ours_samples=[float(x) for x in ours],
        theirs_samples=[float(x) for x in theirs],
        ratios=[float(x) for x in ratios],
        ratio_meaning=meaning,
        goal=None if goal is None else goal_text(goal),
        goal_value=None if goal is None else float(goal[1]),
        met=met,
        note=note,
    )


def info_row(
    what: str,
    ours: str,
    samples: Sequence[float],
    *,
    unit: str,
    goal: tuple[str, float] | None = None,
    met: bool | None = None,
    theirs: str = "",
    note: str = "",
) -> Row:
    """A row without a side-by-side comparison (an absolute target, or a check).

    `goal` is in `unit` (``("<", 1.0)`` with ``unit="ms"`` reads "< 1 ms").
    """
    return Row(
        what=what,
        ours=ours,
        theirs=theirs,
        unit=unit,
        ours_samples=[float(x) for x in samples],
        theirs_samples=[],
        ratios=[],
        ratio_meaning="",
        goal=None if goal is None else goal_text(goal, unit),
        goal_value=None if goal is None else float(goal[1]),
        met=met,
        note=note,
    )


def write(
    path: str | Path | None,
    benchmark: str,
    quick: bool,
    rows: Sequence[Row],
    info: dict[str, Any] | None = None,
) -> None:
    """Write the results file (nothing when `path` is None: the script ran on its own)."""
    if path is None:
        return
    data: dict[str, Any] = {
        "benchmark": benchmark,
        "quick": quick,
        "rows": [dataclasses.asdict(row) for row in rows],
    }
    if info:
        data["info"] = info
    target = Path(path)
    scratch = target.with_name(target.name + ".partial")
    scratch.write_text(json.dumps(data, indent=1) + "\n")
    scratch.replace(target)  # the runner never reads half a file


def exit_status(rows: Sequence[Row], *, checks: Sequence[tuple[bool, str]] = ()) -> int:
    """0 when every row's goal is met and every check holds; else 1, after one line per
    miss on stderr (a goal missed, a check failed): a benchmark never exits 1 unexplained.

    Args:
        rows: the results' rows; a row whose `met` is False is a miss.
        checks: `(held, what)` pairs, e.g. `(same, "the two sides' parameters differ")`.
    """
    said = [
        f"goal missed: {row.what}: {row.ours} (goal {row.goal})" for row in rows if row.met is False
    ]
    said += [f"check failed: {what}" for held, what in checks if not held]
    for line in said:
        print(line, file=sys.stderr, flush=True)
    return 1 if said else 0
