"""A SLURM time limit, checked before anything is written or submitted.

SLURM's ``--time`` takes ``MINUTES``, ``MINUTES:SECONDS``, ``HOURS:MINUTES:SECONDS``,
``DAYS-HOURS``, ``DAYS-HOURS:MINUTES`` and ``DAYS-HOURS:MINUTES:SECONDS`` (and
``UNLIMITED``/``INFINITE``). The leading field may be any whole number; the fields after
it are bounded (hours 0-23 after days, minutes and seconds 0-59 after a larger unit).
``sbatch`` would refuse anything else only once the job is submitted, and a dry run
would print it unchecked.

Example:
    >>> check_time("1-12:30")
    '1-12:30'
    >>> check_time("90")
    '90'
"""

from __future__ import annotations

import re

from theseus.job._slurm import SubmitError

__all__ = ["check_time"]

_FORMS = "MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (e.g. 90, 12:00:00, 2-00:00:00)"
# (pattern, the bound of each field after the first)
_SHAPES: tuple[tuple[re.Pattern[str], tuple[int, ...]], ...] = (
    (re.compile(r"(\d+)"), ()),
    (re.compile(r"(\d+):(\d+)"), (59,)),
    (re.compile(r"(\d+):(\d+):(\d+)"), (59, 59)),
    (re.compile(r"(\d+)-(\d+)"), (23,)),
    (re.compile(r"(\d+)-(\d+):(\d+)"), (23, 59)),
    (re.compile(r"(\d+)-(\d+):(\d+):(\d+)"), (23, 59, 59)),
)
_NAMES = {(59,): ("seconds",), (59, 59): ("minutes", "seconds"), (23,): ("hours",),
          (23, 59): ("hours", "minutes"), (23, 59, 59): ("hours", "minutes", "seconds")}  # fmt: skip


def check_time(text: str, where: str = "--time") -> str:
    """``text`` when it is a time limit SLURM accepts, else a one-line `SubmitError`.

    Args:
        text: the limit as given (``"12:00:00"``).
        where: what gave it, for the message (``--time``, a profile's ``time``).

    Returns:
        ``text`` unchanged (stripped of surrounding spaces).

    Raises:
        SubmitError: not one of SLURM's forms, or a field out of its range.
    """
    value = text.strip()
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return value
    for pattern, bounds in _SHAPES:
        match = pattern.fullmatch(value)
        if match is None:
            continue
        later = [int(field) for field in match.groups()[1:]]
        for name, field, bound in zip(_NAMES.get(bounds, ()), later, bounds, strict=True):
            if field > bound:
                raise SubmitError(
                    f"{where} {text}: {name} must be 0-{bound}, got {field}; write the limit "
                    f"as {_FORMS}."
                )
        return value
    raise SubmitError(f"{where} {text!r} is not a SLURM time limit; expected {_FORMS}.")
