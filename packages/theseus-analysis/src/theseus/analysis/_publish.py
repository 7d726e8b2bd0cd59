"""What `plot()` returned, as a file: a Figure is a PDF, a JSON value is JSON, None is nothing.

`render` turns the value into `(filename, bytes)` before any file is opened, so a
bad value (a NaN in JSON, an unsupported type) leaves nothing half written.
`write_atomic` writes through a temporary file in the same folder and renames it
over the target, so a reader sees the old file or the new one, never a part.

`Publisher` runs publishing off the training thread: one worker per trainer takes
tasks in the order they were submitted (the cadence order), a few at most waiting, so
a slow `plot()` delays only the next submission, never a step, until the queue is full.

`PlotHelper` makes theseus-plot's helpers methods of an analysis (`self.heatmap`),
imported on first use.
"""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from theseus.analysis._errors import AnalysisError

__all__ = ["PlotHelper", "Publisher", "figure_of", "render", "write_atomic"]

log = logging.getLogger("theseus.analysis")


def render(name: str, value: Any, owner: str) -> tuple[str, bytes] | None:
    """`(filename, content)` of a `plot()` result, or None when there is nothing to save.

    Args:
        name: the analysis `NAME` (the file stem).
        value: a matplotlib Figure (or Axes), a JSON value, or None.
        owner: the analysis class name, for messages.

    Raises:
        AnalysisError: a non-finite number in a JSON value, or a type that is neither.
    """
    if value is None:
        return None
    figure = figure_of(value)
    if figure is not None:
        value = figure
        from theseus.plot import to_pdf

        content = to_pdf(value)
        _release(value)
        return f"{name}.pdf", content
    plain = _plain(value, owner, "plot()")
    return f"{name}.json", json.dumps(plain, indent=2, allow_nan=False).encode() + b"\n"


def figure_of(value: Any) -> Any:
    """The top-level matplotlib Figure `value` is or draws in (an Axes, a SubFigure); else None."""
    if "matplotlib" not in __import__("sys").modules:
        return None  # nothing returned can be a Figure, and importing matplotlib costs seconds
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure, SubFigure

    if isinstance(value, Axes):
        value = value.figure
    while isinstance(value, SubFigure):
        value = value.figure
    return value if isinstance(value, Figure) else None


def _release(figure: Any) -> None:
    """Close a pyplot-managed figure so a long run does not accumulate them."""
    import sys

    if "matplotlib.pyplot" in sys.modules:
        import matplotlib.pyplot as plt

        plt.close(figure)  # a no-op for a figure pyplot does not manage


def _plain(value: Any, owner: str, where: str) -> Any:
    """A JSON-ready copy of `value` (NumPy arrays and scalars become lists and numbers)."""
    if isinstance(value, np.ndarray | np.generic) or hasattr(value, "__jax_array__"):
        value = np.asarray(value).tolist()
    if isinstance(value, bool | str) or value is None:
        return value
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise AnalysisError(
                f"{owner}.plot() returned {value} at {where}; JSON has no NaN or infinity. "
                "Replace it (e.g. with None) or return a Figure instead."
            )
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise AnalysisError(
                    f"{owner}.plot() returned a dict with key {key!r} at {where}; JSON keys "
                    "are strings"
                )
            out[key] = _plain(item, owner, f"{where}[{key!r}]")
        return out
    if isinstance(value, list | tuple):
        return [_plain(item, owner, f"{where}[{i}]") for i, item in enumerate(value)]
    raise AnalysisError(
        f"{owner}.plot() returned {type(value).__name__} at {where}; return a matplotlib "
        "Figure (saved as PDF), a JSON value (dict, list, number, string; saved as JSON) "
        "or None (nothing saved)"
    )


def _process_umask() -> int:
    """The process's umask, read without changing it where the OS allows it (Linux).

    Elsewhere the only way to read it is to set it and set it back; that happens once,
    when this module is imported, not while orbax's save threads may be creating files.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_process_umask()  # what open() gives a new file (mkstemp makes 0600)


def write_atomic(path: Path, content: bytes) -> Path:
    """Write `content` to `path` through a temporary file and a rename; returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


class Publisher:
    """One background thread running tasks in submission order.

    Args:
        name: the thread's name (shown in tracebacks and thread dumps).
        depth: tasks that may wait; `submit` blocks while that many are queued, so a
            run whose plots are slower than its validations slows down instead of
            holding every pending result in memory.

    A task handles its own errors (records them where they belong); one that raises
    anyway is logged and the worker goes on.
    """

    def __init__(self, name: str, depth: int = 4) -> None:
        self._name = name
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=depth)
        self._thread: threading.Thread | None = None

    def submit(self, task: Callable[[], None]) -> None:
        """Queue `task`; the worker starts on the first one."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()
        self._queue.put(task)

    def drain(self) -> None:
        """Wait until every submitted task has finished."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        """Drain, then stop the worker (a later `submit` starts a new one)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.join()
        self._queue.put(None)
        thread.join()

    def _work(self) -> None:
        while True:
            task = self._queue.get()
            try:
                if task is None:
                    return
                task()
            except BaseException:
                log.exception("a publishing task failed in %s", self._name)
            finally:
                self._queue.task_done()


class PlotHelper:
    """`self.heatmap` etc.: theseus-plot's function itself, imported on first use.

    The helpers pull in seaborn (seconds to import); an analysis that never plots
    with them, and every host but zero, never pays for it.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        import theseus.plot

        return getattr(theseus.plot, self.name)
