"""`Analyzer`: what a standalone analysis and a trainer's tandem view share.

Both kinds run one pipeline on a trainer's state and batch:

    discover (abstract trace) -> select(paths) -> compiled trace + analyze(layer, inputs)
        -> results on every host -> plot(results) on host zero -> PDF/JSON file + artifact

`AnalysisBase` (`_base.py`, the class users subclass) is an `Analyzer` that is also a
job; `TrainerView` (`_view.py`) is an `Analyzer` that holds the trainer it is borrowed
from. Both derive from this class, and neither module imports the other's class through
it, so the three modules import one another without a cycle.
"""

from __future__ import annotations

import abc
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import flax.linen as nn
import numpy as np

from theseus.analysis import _comet, _over
from theseus.analysis._engine import Selection, compile_analysis, to_host
from theseus.analysis._errors import AnalysisError, AnalysisSelectionError
from theseus.analysis._publish import PlotHelper, figure_of, render, write_atomic
from theseus.analysis._result import AnalysisResult
from theseus.job import is_primary, process_count
from theseus.store import Artifact, Node

if TYPE_CHECKING:
    from theseus.config import Tree
    from theseus.job import JobSpec, Mode
    from theseus.store import Store
    from theseus.training.sharding import ParameterShardingContext

__all__ = ["Analyzer"]

log = logging.getLogger("theseus.analysis")


class Analyzer(abc.ABC):
    """Discovery, `select()`, the compiled `analyze()`, `compute()` and `run()` (publish).

    Not subclassed by users: list `AnalysisBase` before a trainer instead. The trainer
    (or, for a view, the trainer it forwards to) provides the attributes declared below
    for type checkers.

    Attributes:
        traces: how many times the compiled function was traced (1 after any
            number of runs on the same shapes; a second trace is a recompilation).
        borrowed: whether this is a trainer's tandem view.
    """

    TARGET: ClassVar[type | tuple[type, ...]]
    NAME: ClassVar[str]
    STOCHASTIC: ClassVar[bool] = False

    heatmap = PlotHelper("heatmap")
    bar = PlotHelper("bar")
    line = PlotHelper("line")
    scatter = PlotHelper("scatter")

    if TYPE_CHECKING:  # provided by the trainer this analysis extends
        spec: JobSpec
        base: Node | None
        configuration: Tree
        args: Any
        model: Any

        @property
        def mode(self) -> Mode | None: ...
        @property
        def node(self) -> Node: ...
        @property
        def sharding(self) -> ParameterShardingContext: ...
        @property
        def store(self) -> Store: ...
        @property
        def cursor(self) -> int: ...
        @property
        def accumulate_steps(self) -> int: ...
        @property
        def tokenizer(self) -> Any: ...
        def read_batch(self, position: int, slice: str = "train") -> dict[str, Any]: ...
        def configure(self, cls: type[Any]) -> Any: ...
        def find(self, target: type | tuple[type, ...]) -> list[str]: ...
        def prompt_batch(self, text: str) -> dict[str, Any]: ...
        def step_key(self) -> Any: ...
        def inspection_key(self) -> Any: ...
        def checkpoint_path(self, node: Node, mode: Mode = Mode.RESUME) -> str: ...
        def read_checkpoint(self, path: str | os.PathLike[str]) -> tuple[Any, dict[str, Any]]: ...
        def restore_node(
            self, node: Node, saved: tuple[Any, dict[str, Any]] | None = None
        ) -> None: ...

    def _init_engine(self) -> None:
        """The engine's own fields (a standalone job's, or a tandem view's)."""
        self._in_analyze: str | bool = False  # the method running under jit, if any
        self._analysis_fn: Any = None
        self._selection: Selection | None = None
        self.traces = 0

    @classmethod
    def _check_declarations(cls) -> None:
        missing = [n for n in ("TARGET", "NAME") if not hasattr(cls, n)]
        if missing:
            raise TypeError(
                f"{cls.__name__} must declare {' and '.join(missing)}: TARGET = the module "
                "type to inspect (e.g. SelfAttention), NAME = the result's file name stem"
            )

    # ----------------------------------------------------------- the user's part
    @abc.abstractmethod
    def select(self, paths: list[str]) -> str | list[str]:
        """Choose from the discovered paths of `TARGET` calls: one path or a nonempty list."""

    @abc.abstractmethod
    def analyze(self, layer: Any, inputs: Any) -> Any:
        """Inspect the selected call(s) under jit; return a pytree of arrays, numbers or None."""

    @abc.abstractmethod
    def plot(self, results: Any) -> Any:
        """Turn the gathered results (NumPy) into a Figure, a JSON value or None (host zero)."""

    @property
    def borrowed(self) -> bool:
        """Whether this is a trainer's tandem view (False for a standalone analysis)."""
        return False

    @property
    def state(self) -> Any:
        """The train state being analyzed (the trainer's live state, for a borrowed view)."""
        self._not_while_analyzing("self.state")
        return self.__dict__.get("_own_state")

    @state.setter
    def state(self, value: Any) -> None:
        self.__dict__["_own_state"] = value

    def batch(self, slice: str = "train") -> Any:
        """The live node's batch (a borrowed view reads the trainer's node-cached batch)."""
        self._not_while_analyzing("self.batch()")
        return super().batch(slice)  # type: ignore[misc]

    def inspection_batch(self) -> dict[str, Any]:
        """What the analysis (and its `find`/`debug`) traces: `inspection/prompt` when it
        is set (one row per data shard; no data is read), else the trainer's first
        micro-batch of the live node."""
        return self._prompt_batch() or super().inspection_batch()  # type: ignore[misc]

    def _prompt_batch(self) -> dict[str, Any] | None:
        """`inspection/prompt` placed as a batch, or None when it is '' (or, for a trainer
        whose `config()` left out its analyses' settings, not declared)."""
        declared = "inspection/prompt" in self.configuration
        prompt = self.configuration.get("inspection/prompt", "") if declared else ""
        placed = self.__dict__.get("_placed_prompt")  # a walk's nodes share it: encode once
        if prompt and (placed is None or placed[0] != prompt):
            placed = (prompt, self.sharding.place_batch(self.prompt_batch(prompt)))
            self.__dict__["_placed_prompt"] = placed
        return placed[1] if prompt and placed is not None else None

    def _not_while_analyzing(self, what: str) -> None:
        method = self.__dict__.get("_in_analyze")
        if method:
            raise AnalysisError(
                f"{type(self).__name__}.{method}() read {what}. {method}() is compiled once and "
                "reused, so it would see the first state and batch forever: compute from the "
                "supplied layer(s) and inputs instead (read fixed settings from self.args)"
            )

    def _call(self, method: str, *args: Any) -> Any:
        """Call the user's `method`; an exception it raises gets a note naming it."""
        try:
            return getattr(self, method)(*args)
        except Exception as exc:
            if not isinstance(exc, AnalysisError):
                exc.add_note(f"(raised in {type(self).__name__}.{method}())")
            raise

    def _analyze_traced(self, layer: Any, inputs: Any) -> Any:
        """`analyze`, with reads of the mutable state and batch turned into errors."""
        self._in_analyze = "analyze"
        try:
            return self._call("analyze", layer, inputs)
        finally:
            self._in_analyze = False

    def result_digest(self) -> str:
        """What "made with the same configuration" means for a walk's skip: the digest of
        the settings and job key (an analysis with settings of its own adds them)."""
        return _over.configuration_digest(self.configuration)

    # ------------------------------------------------------------------ engine
    def _prepare(self) -> Selection:
        """Discover `TARGET` calls and check `select()` (before anything compiles)."""
        if self._selection is None:
            owner = type(self).__name__
            discovered = self.find(self.TARGET)
            if not discovered:
                raise AnalysisError(
                    f"{owner}: the trace calls no module of type {_names(self.TARGET)} (TARGET); "
                    "set TARGET to a module class the model uses"
                )
            chosen = self._call("select", list(discovered))
            try:
                self._selection = Selection.check(chosen, discovered, owner)
            except AnalysisSelectionError:
                self._explain_other_type(chosen, discovered)
                raise
            _comet.check(self.configuration)
        return self._selection

    def _explain_other_type(self, chosen: Any, discovered: list[str]) -> None:
        """A selected path that is a call of another module type gets its own message."""
        paths = chosen if isinstance(chosen, list | tuple) else [chosen]
        strings = [p for p in paths if isinstance(p, str) and p not in discovered]
        if not strings:
            return
        everything = self.find(nn.Module)
        for path in strings:
            if path in everything:
                raise AnalysisSelectionError(
                    f"{type(self).__name__}.select() returned {path!r}, a call of another module "
                    f"type than TARGET ({_names(self.TARGET)}); choose among the TARGET calls: "
                    f"{', '.join(repr(p) for p in discovered)}, or change TARGET"
                )

    def _compiled_analysis(self) -> Any:
        if self._analysis_fn is None:
            selection = self._prepare()

            def count() -> None:
                self.traces += 1

            self._analysis_fn = compile_analysis(
                type(self).trace,  # type: ignore[attr-defined]
                self._analyze_traced,
                selection,
                self.sharding,
                type(self).__name__,
                on_trace=count,
            )
        return self._analysis_fn

    def compute(self) -> Any:
        """Run the compiled analysis on the live node's batch; the results on this host.

        Every host must call it (the results are gathered across hosts).
        """
        fn = self._compiled_analysis()
        key = self.inspection_key() if self.STOCHASTIC else None
        batch = self.inspection_batch()
        return to_host(fn(self.state, batch, key))

    def run(self) -> AnalysisResult:
        """Compute, then on host zero plot, write `NAME.pdf`/`NAME.json` and record the artifact.

        Returns:
            An `AnalysisResult`.

        Raises:
            AnalysisError: on every host when `plot()` or the write failed on host zero.
        """
        values = self.compute()
        node = self.node
        path: Path | None = None
        artifact: Artifact | None = None
        figure: Any = None
        error: BaseException | None = None
        if is_primary():
            try:
                path, artifact, figure = self._publish(values, node)
            except BaseException as exc:
                error = exc
        _agree_on_failure(error, type(self).__name__)
        return AnalysisResult(values, node, path, artifact, figure)

    def _publish(self, values: Any, node: Node) -> tuple[Path | None, Artifact | None, Any]:
        drawn = self.__dict__.pop("_drawn", None)  # drawn elsewhere (`LibraryBase`): a callable
        if drawn is None:
            plotted = self._call("plot", values)
            figure = figure_of(plotted)
            rendered = render(self.NAME, plotted, type(self).__name__)
        else:
            figure, rendered = None, drawn()
        if rendered is None:
            return None, None, None
        filename, content = rendered
        path = write_atomic(self.spec.result(filename), content)
        with self.store.batch():  # the artifact and its stamp: durable together, one commit
            artifact = self.store.put(node, self.NAME, filename, content)
            if not self.borrowed:  # which configuration made it: a walk skips such nodes
                _over.stamp(self.store, node, self.result_digest(), artifact)
        try:
            _comet.publish(self.configuration, node, self.NAME, filename, content)
        except Exception as exc:  # the file and the artifact are saved; Comet is a copy
            log.warning("%s: not sent to Comet: %s", type(self).__name__, exc)
        return path, artifact, figure


def _names(target: type | tuple[type, ...]) -> str:
    return ", ".join(t.__name__ for t in (target if isinstance(target, tuple) else (target,)))


def _agree_on_failure(error: BaseException | None, owner: str) -> None:
    """Raise on every host when host zero failed (so no host waits at a later collective)."""
    failed = error is not None
    if process_count() > 1:
        from jax.experimental import multihost_utils

        flag = np.asarray([1 if failed else 0], dtype=np.int32)
        failed = bool(np.asarray(multihost_utils.broadcast_one_to_all(flag))[0])
    if error is not None:
        raise error
    if failed:
        raise AnalysisError(
            f"{owner}.plot() or writing its result failed on host zero; its log has the error"
        )
