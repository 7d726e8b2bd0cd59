"""What a training run shows while it runs: a progress bar on a terminal, log lines always.

The bar (step, loss, tokens/s, ETA) appears only when standard error is a terminal;
redirected output gets one log line per report instead, so CI logs stay readable.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

__all__ = ["Reporter", "format_duration"]

log = logging.getLogger("theseus.training")


def format_duration(seconds: float) -> str:
    """`75.2` -> `"1m15s"`; `3725` -> `"1h02m"`."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


class Reporter:
    """Tracks throughput and shows progress for a run of `total` steps.

    Args:
        total: the step the run ends at.
        start: the step it starts from (non-zero after a resume).
        tokens_per_step: global tokens consumed by one optimizer step.
        run: a label for the display (the run's node name).
        enabled: show the progress bar (default: when stderr is a terminal).
    """

    def __init__(
        self,
        total: int,
        start: int,
        tokens_per_step: int,
        run: str,
        enabled: bool | None = None,
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
                TextColumn("step {task.completed}/{task.total}"),
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
        """Show one report: the bar on a terminal, a log line always."""
        done = step - self.start
        elapsed = time.perf_counter() - self._began
        eta = elapsed / done * (self.total - step) if done else 0.0
        line = (
            f"{self.run} step {step}/{self.total} loss {loss:.4f} "
            f"{rate:,.0f} tok/s ETA {format_duration(eta)}"
        )
        log.info(line)
        if self._bar is not None:
            self._bar.update(
                self._task, completed=step, status=f"loss {loss:.4f} {rate:,.0f} tok/s"
            )

    def advance(self, step: int) -> None:
        """Move the bar without a report."""
        if self._bar is not None:
            self._bar.update(self._task, completed=step)

    def close(self) -> None:
        """Stop the bar."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
