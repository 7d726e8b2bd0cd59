"""`AnalysisBase`: a trainer whose `run()` inspects instead of training.

`class A(AnalysisBase, SomeTrainer)` keeps everything of the trainer (configuration,
model, data, setup from fresh weights or a checkpoint, surgery) and replaces `run()`
with the pipeline of `Analyzer` (`_analyzer.py`):

    discover (abstract trace) -> select(paths) -> compiled trace + analyze(layer, inputs)
        -> results on every host -> plot(results) on host zero -> PDF/JSON file + artifact

A standalone analysis is a job: `A(spec)` or `A(spec, base=node)`, then call it; this
module is that job's part (declarations checked at class definition, settings, setup,
the walk over checkpoints). A tandem analysis is a borrowed view, `A.from_trainer(trainer)`
(a `TrainerView`, in `_view.py`), that the trainer runs at validation cadence on its own
node, state and batch.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, Self, TypeVar

import flax.linen as nn

from theseus.analysis import _comet, _over
from theseus.analysis._analyzer import Analyzer
from theseus.analysis._errors import AnalysisError
from theseus.analysis._result import AnalysisResult
from theseus.analysis._settings import AnalysisSettings
from theseus.analysis._view import view_class
from theseus.job import Mode
from theseus.store import Node

__all__ = ["AnalysisBase", "AnalysisResult"]

C = TypeVar("C")
M = TypeVar("M")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class AnalysisBase(Analyzer, Generic[C, M]):
    """Base of analyses: list it before a trainer, `class A(AnalysisBase, MyTrainer)`.

    Declare `TARGET` (the module type to look for), `NAME` (the file and artifact
    name) and implement `select`, `analyze` and `plot`. Set `STOCHASTIC = True` to
    run the trace with the node's RNG key (dropout active); by default analyses run
    deterministically.

    Attributes:
        traces: how many times the compiled function was traced (1 after any
            number of runs on the same shapes; a second trace is a recompilation).
        borrowed: whether this is a trainer's tandem view.
    """

    SETTINGS: ClassVar[tuple[type, ...]] = ()  # schemas read beside CONFIG (see config())
    RESUME_ATTACHES: ClassVar[bool] = True  # a resumed node is another run's checkpoint

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for klass in cls.__mro__:
            if klass is AnalysisBase:
                break
            if "run" in vars(klass) and not issubclass(klass, Analyzer):
                others = ", ".join(b.__name__ for b in cls.__bases__ if b is not AnalysisBase)
                raise TypeError(
                    f"{cls.__name__}: run() resolves to {klass.__name__}.run, so this class "
                    f"would train instead of analyze; list AnalysisBase first: "
                    f"class {cls.__name__}(AnalysisBase, {others})"
                )
        target = vars(cls).get("TARGET")
        targets = target if isinstance(target, tuple) else (target,)
        if target is not None and (
            not targets
            or not all(isinstance(t, type) and issubclass(t, nn.Module) for t in targets)
        ):
            hint = (
                f"import it and write TARGET = {target}"
                if isinstance(target, str)
                else ("e.g. TARGET = SelfAttention")
            )
            raise TypeError(
                f"{cls.__name__}.TARGET = {target!r} must be a Flax module class (or a tuple "
                f"of them) whose calls the analysis looks for; {hint}"
            )
        name = vars(cls).get("NAME")
        if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
            raise TypeError(
                f"{cls.__name__}.NAME = {name!r} names the result file and artifact; use "
                "letters, digits, '_', '-' or '.', e.g. NAME = 'activations'"
            )

    @classmethod
    def analysis_config(cls) -> list[type]:
        """The configuration classes this analysis reads beyond its trainer's: `CONFIG`,
        `AnalysisSettings` (`inspection/prompt`, `logging/comet`) and `SETTINGS` (its
        kind's own, such as an SAE's `sae/NAME/...`).

        The one hook through which an analysis adds settings: `config()` composes them
        after the trainer's, and a trainer composes them for each `ANALYSIS` entry.
        """
        own = getattr(cls, "CONFIG", None)
        return list(dict.fromkeys([*([own] if own else []), AnalysisSettings, *cls.SETTINGS]))

    @classmethod
    def config(cls) -> list[type]:
        """The trainer's schemas, then `analysis_config()`."""
        return list(dict.fromkeys([*super().config(), *cls.analysis_config()]))  # type: ignore[misc]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._check_declarations()
        self._init_engine()
        self._walk: tuple[list[Node], bool] | None = None  # planned by over()
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------- borrowed view
    @classmethod
    def from_trainer(cls, trainer: Any) -> Self:
        """A view of this analysis that holds `trainer` (a `TrainerView`, see its docstring).

        The view is not constructed as a job and allocates nothing: the trainer's
        spec, store, configuration, model, sharding, node, state, cursor, keys and
        batches are read from the trainer itself. It checks its selection now, so a
        bad `select()` fails before training goes on. It never sets up, ticks or
        cleans up (those raise `AnalysisError`), and its state cannot be assigned.
        """
        cls._check_declarations()
        view = view_class(cls)(trainer)
        view._prepare()
        return view

    def setup(self, resume: bool = False) -> Node:
        """Set up as the trainer does (fresh weights, or the base checkpoint); idempotent."""
        return super().setup(resume)  # type: ignore[misc]

    def tick(self) -> Node:
        """Analyses never move the node; this always raises."""
        raise AnalysisError(
            f"{type(self).__name__} is an analysis: results attach to the node it was set up "
            "on, and analyses never tick"
        )

    def finish(self) -> None:
        """Finish as a job does, and end the Comet experiment (its files are sent or written)."""
        super().finish()  # type: ignore[misc]
        _comet.close()

    def __call__(self, resume: bool = False) -> Any:
        """Run as a job on the node it is set up at; after `over()`, on each planned node.

        Returns:
            An `AnalysisResult`, or after `over()` an `OverResult` (one result per node).
        """
        if self._walk is not None:
            nodes, force = self._walk
            self._walk = None  # a later call runs on the live node alone again
            run_one = functools.partial(super().__call__, True)  # type: ignore[misc]
            return _over.walk(self, nodes, force, run_one)
        return super().__call__(resume)  # type: ignore[misc]

    def over(self, nodes: Sequence[Node], *, force: bool = False) -> None:
        """Make the next call walk `nodes`, checkpoints of one lineage, on this one instance.

        `q.find()...over()` plans it for you (and `theseus run --over`). Each node is
        restored into this instance (`restore_node`, the next one read while the
        current one is analyzed), so the compiled analysis is traced once for a
        lineage of one shape; each result attaches to its own node as a `--resume`
        run would. Nodes that already hold this analysis's result for the same
        configuration are skipped unless `force` (then a new version is written).

        Args:
            nodes: the checkpointed nodes, in seq order; the job is resumed at the first.
            force: recompute the nodes that would be skipped.

        Raises:
            AnalysisError: the job is not resumed at `nodes[0]`, or `nodes` are not one
                lineage's in increasing seq order.
        """
        self._walk = (_over.check_plan(self, nodes), force)

    def outcome(self, result: Any) -> list[str]:
        """The file this run wrote and its artifact (for `theseus run`)."""
        if isinstance(result, _over.OverResult):
            return _over.outcome_lines(self, result)
        if not isinstance(result, AnalysisResult) or result.artifact is None:
            return [f"{self.NAME}: plot() returned None, so no file and no artifact were written"]
        artifact = result.artifact
        return [
            f"{self.NAME}: wrote {result.path}",
            f"  artifact {artifact.name!r} version {artifact.version} on node {result.node} "
            f"(read it back: "
            f"{_over.read_back(self.spec.root, result.node, artifact.name, result.path)})",
        ]

    def status_key(self, what: str) -> str:
        """`job/...` on the job's own nodes; `analysis/NAME/...` on a resumed node.

        A resumed node belongs to the run that made it: the analysis attaches its
        result there without replacing that run's `job/name` and `job/status`.
        """
        if self.mode is Mode.RESUME:
            return f"analysis/{self.NAME}/{what}"
        return super().status_key(what)  # type: ignore[misc]

    # --------------------------------------------------------------- as a job
    def on_setup(self, mode: Mode) -> None:
        """The trainer's setup (initialize or restore), then discovery and `select()`."""
        super().on_setup(mode)  # type: ignore[misc]
        self._prepare()

    def _attach_analyses(self) -> None:
        """An analysis job runs no tandem analyses of its own."""

    def before_run(self) -> None:
        """Nothing to refuse: an analysis never trains, so any checkpointed node will do
        (the trainer's own check refuses to train on from a node with later checkpoints)."""
        return None

    def close(self) -> None:
        """End the Comet experiment (if any) and close the store if this job opened it."""
        _comet.close()
        super().close()  # type: ignore[misc]
