"""What a training run shows while it runs, wherever its output goes.

On a terminal, a progress bar (step, loss, tokens/s, ETA). Every report, validation
and checkpoint is also a line of the `theseus.training` logger. When logging would
not show that line (a script that never configured logging: Python drops INFO
records then), the reporter writes it to standard error itself, so a run under
`python train.py > log.txt`, nohup, SLURM or a notebook still says what it does.
A script that configures logging gets the lines through its own handlers only.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

__all__ = ["Reporter", "format_duration", "logging_shows"]

log = logging.getLogger("theseus.training")


def format_duration(seconds: float) -> str:
    """`75.2` -> `"1m15s"`; `3725` -> `"1h02m"`."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


def logging_shows(logger: logging.Logger, level: int = logging.INFO) -> bool:
    """Whether a record of `level` on `logger` reaches a handler that emits it.

    Python's last-resort handler (used when no handler is configured) shows only
    warnings, so an unconfigured program shows no INFO line.
    """
    if not logger.isEnabledFor(level):
        return False
    current: logging.Logger | None = logger
    while current is not None:
        if any(handler.level <= level for handler in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


class Reporter:
    """Tracks throughput and shows progress for a run of `total` steps.

    Args:
        total: the step the run ends at.
        start: the step it starts from (non-zero after a resume).
        tokens_per_step: global tokens consumed by one optimizer step.
        run: a label for the display (the run's node name).
        enabled: show the progress bar (default: when stderr is a terminal).
        unit: what the bar counts ("step"; an analysis walking a lineage counts
            "checkpoint"s).
    """

    def __init__(
        self,
        total: int,
        start: int,
        tokens_per_step: int,
        run: str,
        enabled: bool | None = None,
        unit: str = "step",
    ) -> None:
        self.total, self.start, self.tokens_per_step = total, start, tokens_per_step
        self.run = run
        self._window_start = time.perf_counter()
        self._window_step = start
        self._began = self._window_start
        self._bar: Any = None
        if sys.stderr.isatty() if enabled is None else enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn(unit + " {task.completed}/{task.total}"),
                TextColumn("{task.fields[status]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._task = self._bar.add_task(run, total=total, completed=start, status="")
            self._bar.start()

    def throughput(self, step: int) -> float:
        """Tokens per second since the previous report, and start a new window."""
        now = time.perf_counter()
        elapsed = max(now - self._window_start, 1e-9)
        rate = (step - self._window_step) * self.tokens_per_step / elapsed
        self._window_start, self._window_step = now, step
        return rate

    def report(self, step: int, loss: float, rate: float) -> None:
        """Show one report: the bar on a terminal, a line (see the module docstring)."""
        done = step - self.start
        elapsed = time.perf_counter() - self._began
        eta = elapsed / done * (self.total - step) if done else 0.0
        line = (
            f"{self.run} step {step}/{self.total} loss {loss:.4f} "
            f"{rate:,.0f} tok/s ETA {format_duration(eta)}"
        )
        if self._bar is not None:
            self._bar.update(
                self._task, completed=step, status=f"loss {loss:.4f} {rate:,.0f} tok/s"
            )
            if logging_shows(log):  # the bar already says it on the terminal
                log.info(line)
            return
        self.say(line)

    def event(self, step: int, what: str) -> None:
        """Say what happened at `step` (a validation, a checkpoint), on every output."""
        self.say(f"{self.run} step {step}/{self.total} {what}")

    def say(self, line: str) -> None:
        """One line: through logging when it shows it, else on stderr (above the bar)."""
        if logging_shows(log):
            log.info(line)
        elif self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=sys.stderr, flush=True)

    def advance(self, step: int) -> None:
        """Move the bar without a report."""
        if self._bar is not None:
            self._bar.update(self._task, completed=step)

    def close(self) -> None:
        """Stop the bar."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
