"""`TrainerView`: a tandem analysis, made as a view that holds its trainer.

`A.from_trainer(trainer)` returns an instance of `TrainerView[A]`, a subclass of the
analysis `A` with this mixin first. The view is built by one constructor that takes
the trainer, never by `BasicJob.__init__`, and it copies none of the trainer's fields:
every attribute the trainer documents is either forwarded to the trainer (read-only),
computed by the analysis on the trainer's state (`find`, `debug`, `run`, ...), or
refused with an `AnalysisError` (setting up, ticking, finishing, checkpointing). So no
attribute of a view can be missing; `FORWARDED`, `OWN` and `REFUSED` list them.

`TrainerView` derives from `Analyzer` (`_analyzer.py`, the pipeline it shares with a
standalone analysis), not from `AnalysisBase`: `_base` imports this module to make views,
and this module imports nothing of `_base`.
"""

from __future__ import annotations

import functools
import logging
import traceback
import weakref
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar, cast

from theseus.analysis import _comet
from theseus.analysis._analyzer import Analyzer
from theseus.analysis._errors import AnalysisError
from theseus.analysis._publish import Publisher
from theseus.analysis._result import AnalysisResult
from theseus.config import configure
from theseus.job import is_primary

if TYPE_CHECKING:
    from theseus.store import Node

AnalysisT = TypeVar("AnalysisT", bound=Analyzer)

log = logging.getLogger("theseus.analysis")

__all__ = ["TrainerView", "view_class"]


def _forwarded(name: str, doc: str) -> Any:
    """A read-only property that returns `trainer.<name>`; assigning it is an `AnalysisError`."""

    def get(self: TrainerView) -> Any:
        return getattr(self.trainer, name)

    def refuse(self: TrainerView, value: Any) -> None:
        self._refuse_assignment(name)

    return property(get, refuse, doc=f"{doc} (the trainer's, read-only).")


class TrainerView(Analyzer):
    """A tandem analysis: a view of the trainer it is borrowed from.

    Forwarded to the trainer (`view.X` is `trainer.X`; assigning one raises
    `AnalysisError`): `spec`, `base`, `mode`, `configuration`, `model`, `store`,
    `sharding`, `node`, `state`, `cursor`, `block_size`, `total_steps`,
    `accumulate_steps`, `analysis_failures`, `tokenizer`, `scheduled` (the SLURM job
    the trainer runs in, or None), `layout`, and the methods
    `batch_geometry()`, `batch(slice)`, `read_batch(position, slice)`, `inspection_batch()`
    (`inspection/prompt`'s batch instead when it is set), `prompt_batch(text)`,
    `step_key()`, `inspection_key()`, `validate()`, `evaluate_batch(rows)`,
    `generate(...)`, `log(values)`, `learning_rate(step)`, `data_record()`.

    The view's own: `trainer` (the trainer itself), `borrowed` (True), `args` (the
    analysis's `CONFIG` read from the trainer's configuration), `traces`, and the
    methods `find`, `debug` (the analysis's `trace` on the trainer's state and batch),
    `configure`, `activated` (the trainer's configuration), `status_key`, `compute`,
    `run` (`background=True` publishes on the trainer's publishing thread), `drain`
    (waits for it), `outcome` (what a result wrote) and `close` (publishes what is
    pending and ends the Comet experiment; the store stays the trainer's).

    Refused with `AnalysisError` (the trainer owns them): its `loop`, `setup`, `on_setup`,
    `before_run`, `tick`, `finish`, `on_finish`, `save_checkpoint`, `data_required`,
    `initial_state`, moving to another checkpoint (`resume_at`, `restore_node`,
    `checkpoint_path`, `read_checkpoint`, `over`) and `__call__` (running the view as
    a job).
    """

    FORWARDED: ClassVar[tuple[str, ...]] = (
        "spec",
        "base",
        "mode",
        "configuration",
        "model",
        "store",
        "sharding",
        "node",
        "state",
        "cursor",
        "block_size",
        "total_steps",
        "accumulate_steps",
        "analysis_failures",
        "batch_geometry",
        "batch",
        "read_batch",
        "inspection_batch",
        "step_key",
        "inspection_key",
        "validate",
        "evaluate_batch",
        "generate",
        "tokenizer",
        "scheduled",
        "prompt_batch",
        "log",
        "layout",
        "learning_rate",
        "data_record",
    )
    OWN: ClassVar[tuple[str, ...]] = (
        "trainer",
        "borrowed",
        "args",
        "traces",
        "find",
        "debug",
        "configure",
        "activated",
        "status_key",
        "compute",
        "run",
        "drain",
        "outcome",
        "close",
    )
    REFUSED: ClassVar[tuple[str, ...]] = (
        "loop",
        "setup",
        "on_setup",
        "before_run",
        "tick",
        "finish",
        "on_finish",
        "save_checkpoint",
        "data_required",
        "initial_state",
        "resume_at",
        "restore_node",
        "checkpoint_path",
        "read_checkpoint",
        "over",
        "__call__",
    )

    def __init__(self, trainer: Any) -> None:  # not a job: BasicJob.__init__ never runs
        self._check_declarations()
        self._init_engine()
        self._trainer = trainer
        schema = getattr(type(self), "CONFIG", None)
        self.args = configure(schema, trainer.configuration) if schema is not None else None

    # ------------------------------------------------------------------ own
    @property
    def trainer(self) -> Any:
        """The trainer this view is borrowed from."""
        return self._trainer

    @property
    def borrowed(self) -> bool:
        """Always True: this is a trainer's tandem view."""
        return True

    def run(self, background: bool = False) -> AnalysisResult:
        """Compute on the trainer's state and batch, then publish (see `AnalysisBase.run`).

        With `background=True` (the trainer's cadence when `training/analysis_errors`
        is `log`) only the compiled computation happens here; `plot()`, the file, the
        artifact and Comet run on the trainer's publishing thread, in cadence order,
        and the result's `path`, `artifact` and `figure` are None. A failure there is
        logged and recorded on the node it was computed at, as `analysis/NAME/error`.
        """
        if not background:
            return super().run()
        values = self.compute()
        node = self.node
        if is_primary():
            step = int(self._trainer.state.step)
            _publisher(self._trainer).submit(
                functools.partial(self._publish_later, values, node, step)
            )
        return AnalysisResult(values, node, None, None, None)

    def _publish_later(self, values: Any, node: Node, step: int) -> None:
        try:
            self._publish(values, node)
        except Exception as err:  # recorded like a failure on the step path
            message = f"{type(err).__name__}: {err}"
            log.error(
                "Tandem analysis %r failed to publish its result of step %d (%s); training "
                "went on:\n%s",
                self.NAME,
                step,
                node.serialize(),
                "".join(traceback.format_exception(err)).rstrip(),
            )
            self._trainer.store.log(node, {f"analysis/{self.NAME}/error": message})
            self._trainer.analysis_failures.append((step, self.NAME, message))

    def drain(self) -> None:
        """Wait until every result this trainer's views submitted is published."""
        publisher = _PUBLISHERS.get(self._trainer)
        if publisher is not None:
            publisher.drain()

    def close(self) -> None:
        """Publish what is pending, then end the Comet experiment (if any); the store is
        the trainer's and stays open."""
        publisher = _PUBLISHERS.pop(self._trainer, None)
        if publisher is not None:
            publisher.close()
        _comet.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} view of {self._trainer!r}>"

    # ------------------------------------------------------------ forwarded
    spec = _forwarded("spec", "Who the run is and where it writes")
    base = _forwarded("base", "The node the trainer branched from or resumed")
    mode = _forwarded("mode", "How the trainer's setup chose its node")
    configuration = _forwarded("configuration", "The composed configuration")
    model = _forwarded("model", "The Flax model")
    store = _forwarded("store", "The store")
    sharding = _forwarded("sharding", "The mesh and logical-axis rules")
    node = _forwarded("node", "The live node")
    cursor = _forwarded("cursor", "Position of the live node's batch in the data plan")
    block_size = _forwarded("block_size", "Sequence length of a batch row")
    total_steps = _forwarded("total_steps", "Optimizer steps of the whole run")
    accumulate_steps = _forwarded("accumulate_steps", "Micro-steps per optimizer step")
    analysis_failures = _forwarded("analysis_failures", "Tandem analyses that failed")
    tokenizer = _forwarded("tokenizer", "The tokenizer of the model's ids")
    scheduled = _forwarded("scheduled", "The scheduler job the run is, or None")
    layout = _forwarded("layout", "Where every part of the state lives")

    @property
    def state(self) -> Any:
        """The trainer's live state (read-only; not readable inside `analyze`)."""
        self._not_while_analyzing("self.state")
        return self._trainer.state

    @state.setter
    def state(self, value: Any) -> None:
        self._refuse_assignment("state")

    def batch(self, slice: str = "train") -> Any:
        """The trainer's node-cached batch (not readable inside `analyze`)."""
        self._not_while_analyzing("self.batch()")
        return self._trainer.batch(slice)

    def read_batch(self, position: int, slice: str = "train") -> Any:
        """The trainer's data plan at `position` (nothing cached, its cursor unmoved)."""
        return self._trainer.read_batch(position, slice)

    def batch_geometry(self) -> dict[str, int]:
        """The trainer's `MixturePlan.batch` arguments for this process."""
        return self._trainer.batch_geometry()

    def inspection_batch(self) -> dict[str, Any]:
        """`inspection/prompt` as a batch when it is set, else the trainer's first
        micro-batch of the live node, placed on the devices."""
        return self._prompt_batch() or self._trainer.inspection_batch()

    def prompt_batch(self, text: str) -> Any:
        """The trainer's batch of one prompt (`inspection/prompt`'s form)."""
        return self._trainer.prompt_batch(text)

    def step_key(self) -> Any:
        """The RNG key of the trainer's update at the live node."""
        return self._trainer.step_key()

    def inspection_key(self) -> Any:
        """The dropout key of the trainer's first micro-step at the live node."""
        return self._trainer.inspection_key()

    def validate(self) -> dict[str, float]:
        """The trainer's validation loss on its live state (its compiled program)."""
        return self._trainer.validate()

    def evaluate_batch(self, rows: Any) -> tuple[float, int]:
        """The trainer's `(loss_sum, count)` of `val_step` on host rows."""
        return self._trainer.evaluate_batch(rows)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The trainer's `generate()` on its live state (not inside `analyze`)."""
        self._not_while_analyzing("self.generate()")
        return self._trainer.generate(*args, **kwargs)

    def log(self, values: dict[str, Any]) -> None:
        """Record scalar values on the trainer's live node (host zero only)."""
        self._trainer.log(values)

    def learning_rate(self, step: int) -> float:
        """The trainer's learning rate of the update that makes `step`."""
        return float(self._trainer.learning_rate(step))

    def data_record(self) -> dict[str, dict[str, Any]]:
        """What the trainer's checkpoints record of each dataset's tokens, by name."""
        return dict(self._trainer.data_record())

    # -------------------------------------------------------------- refused
    @property
    def loop(self) -> Any:
        """Refused: the trainer's loop runs the view at validation cadence."""
        self._refuse("its loop", "it runs the view at validation cadence")

    # Refused methods take any arguments, so every call gets the one-line refusal.
    def setup(self, *args: Any, **kwargs: Any) -> Node:
        self._refuse("setup", "it was set up with the trainer", standalone=True)

    def on_setup(self, *args: Any, **kwargs: Any) -> None:
        self._refuse("setup", "it was set up with the trainer", standalone=True)

    def before_run(self) -> None:
        self._refuse("running", "the trainer calls view.run() at validation", standalone=True)

    def tick(self) -> Node:
        self._refuse("ticking", "the view always reads trainer.node; tick the trainer")

    def finish(self) -> None:
        self._refuse("finishing", "the trainer calls view.close() when it finishes")

    def on_finish(self) -> None:
        self._refuse("finishing", "the trainer calls view.close() when it finishes")

    def save_checkpoint(self) -> None:
        self._refuse("checkpoints", "call trainer.save_checkpoint()")

    def data_required(self, *args: Any, **kwargs: Any) -> bool:
        self._refuse("setup", "it was set up with the trainer", standalone=True)

    def initial_state(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("setup", "it was set up with the trainer", standalone=True)

    def resume_at(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("its node", "the view always reads trainer.node", standalone=True)

    def restore_node(self, *args: Any, **kwargs: Any) -> None:
        self._refuse("its node and state", "the view analyzes the live state", standalone=True)

    def checkpoint_path(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("restoring", "the view analyzes the live state", standalone=True)

    def read_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("restoring", "the view analyzes the live state", standalone=True)

    def over(self, *args: Any, **kwargs: Any) -> None:
        self._refuse(
            "its node", "walk a lineage with q.find()...over() or theseus run --over instead"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse("running as a job", "call view.run() to analyze now", standalone=True)

    def _refuse(self, what: str, instead: str, *, standalone: bool = False) -> NoReturn:
        name = type(self).__name__
        alone = f", or run {name}(spec, base=node)() as its own job" if standalone else ""
        raise AnalysisError(
            f"{name} is a view borrowed from {type(self._trainer).__name__}, and the trainer "
            f"owns {what}: {instead}{alone}"
        )

    def _refuse_assignment(self, name: str) -> NoReturn:
        raise AnalysisError(
            f"{type(self).__name__} is a view borrowed from {type(self._trainer).__name__}; "
            f"its {name} is the trainer's and cannot be replaced here"
        )


# One publishing thread per trainer, shared by its views: results publish in cadence order.
_PUBLISHERS: weakref.WeakKeyDictionary[Any, Publisher] = weakref.WeakKeyDictionary()


def _publisher(trainer: Any) -> Publisher:
    publisher = _PUBLISHERS.get(trainer)
    if publisher is None:
        publisher = _PUBLISHERS[trainer] = Publisher(f"theseus-publish-{trainer.node.name}")
    return publisher


@functools.cache
def view_class(cls: type[AnalysisT]) -> type[AnalysisT]:
    """`TrainerView[cls]`: the analysis `cls` (an `AnalysisBase` subclass) with the view's
    attributes first (made once); a subclass of both `cls` and `TrainerView`."""
    if issubclass(cls, TrainerView):
        return cls
    namespace = {
        "__module__": cls.__module__,
        "__qualname__": f"TrainerView[{cls.__qualname__}]",
        "__doc__": cls.__doc__,
    }
    return cast("type[AnalysisT]", type(cls.__name__, (TrainerView, cls), namespace))
