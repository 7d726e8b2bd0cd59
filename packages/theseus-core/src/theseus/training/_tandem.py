"""Tandem analyses: the `ANALYSIS` views a trainer runs at validation cadence.

theseus-core never imports theseus-analysis: an `ANALYSIS` entry only has to satisfy
`TandemAnalysis` (checked when the trainer is constructed, `check_analyses`), and its
view `TandemView`. `analyze` runs each view; a failing one is logged, recorded on the
live node as `analysis/NAME/error` and in `analysis_failures`, and training goes on
(unless `training/analysis_errors = "raise"`). `drain` publishes what the views still
hold after a failed run, and `summarize_failures` is the run's closing warning.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from theseus.store import Node
from theseus.training._errors import TrainerError
from theseus.training.evaluation import TandemAnalysis, TandemView

__all__ = ["analyze", "check_analyses", "drain", "summarize_failures"]

# The trainer's own logger: these records keep the name they have always had.
logger = logging.getLogger("theseus.training.base")


def check_analyses(owner: str, analyses: Sequence[Any]) -> None:
    """`analyses` (`owner`'s `ANALYSIS`) are analysis classes with distinct `NAME`s.

    Raises:
        TrainerError: an entry that is not a `TandemAnalysis`, or two with one `NAME`.
    """
    names: dict[str, Any] = {}
    for analysis in analyses:
        if not isinstance(analysis, TandemAnalysis):
            raise TrainerError(
                f"ANALYSIS entry {analysis!r} of {owner} is not an analysis "
                "class (it needs NAME, analysis_config() and from_trainer()); subclass "
                "theseus.analysis.AnalysisBase"
            )
        if analysis.NAME in names:
            raise TrainerError(
                f"{owner}.ANALYSIS has two analyses named "
                f"{analysis.NAME!r} ({_name(names[analysis.NAME])} and "
                f"{_name(analysis)}); their files and artifacts would collide. Give "
                "each a distinct NAME."
            )
        names[analysis.NAME] = analysis


def analyze(
    views: Sequence[TandemView],
    names: Sequence[str],
    *,
    errors: str,
    step: int,
    node: Node,
    log: Callable[[dict[str, Any]], None],
    failures: list[tuple[int, str, str]],
) -> None:
    """Run each tandem view; a failure is logged and recorded, and training goes on.

    The compiled computation runs here; with `errors = "log"` (`training/analysis_errors`)
    its `plot()`, file, artifact and Comet copy are published on a background thread in
    cadence order (the views drain it when the run finishes or fails), so a slow
    plot never stalls training. A typo in an analysis's `plot()` must not end a run
    of many days: the error is logged with its traceback, kept on the live node as the
    string value `analysis/NAME/error` (through `log`), appended to `failures` as
    `(step, NAME, "Type: message")` for the run's closing summary, and the analysis is
    tried again at the next validation. `errors = "raise"` stops the run instead.

    Args:
        views: the trainer's tandem views (none when `training/analyze` is off).
        names: each view's analysis `NAME`, in the same order.
        step: the step just taken; `node`: the live node (both for the record).
    """
    if not views:  # training/analyze = false, or not attached on this setup
        return
    background = errors == "log"  # "raise" must raise right here
    for name, view in zip(names, views, strict=True):
        try:
            view.run(background=background)
        except Exception as err:
            if errors == "raise":
                raise
            message = f"{type(err).__name__}: {err}"
            logger.error(
                "Tandem analysis %r failed at step %d of %s; training goes on and it runs "
                "again at the next validation (training/analysis_errors=raise stops the "
                "run instead):\n%s",
                name,
                step,
                node.serialize(),
                "".join(traceback.format_exception(err)).rstrip(),
            )
            log({f"analysis/{name}/error": message})
            failures.append((step, name, message))


def drain(views: Sequence[TandemView]) -> None:
    """After a failed run: publish what each view still holds, logging (not raising) errors."""
    for view in views:
        try:
            view.drain()
        except Exception:  # the run's own error is the one to report
            logger.warning("Publishing tandem analyses after a failed run failed", exc_info=True)


def summarize_failures(node: Node, failures: Sequence[tuple[int, str, str]]) -> None:
    """Warn once, at the end of a run, of every tandem analysis run that failed."""
    if failures:
        logger.warning(
            "%s finished with %d failed tandem analysis run(s):\n%s",
            node.serialize(),
            len(failures),
            "\n".join(f"  {name} at step {step}: {message}" for step, name, message in failures),
        )


def _name(cls: Any) -> str:
    return str(getattr(cls, "__name__", cls))
