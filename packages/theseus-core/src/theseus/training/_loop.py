"""`TrainingLoop`: a trainer's steps, and everything that lives from one step to the next.

A trainer (`BaseTrainer`) says what is trained and what one step computes; its loop
runs the steps and owns their state:

* `cursor`: where the live node's batch lies in the data plan, and where the next
  update reads (`Cursor`);
* the compiled programs: the jitted train and validation steps, compiled once and kept
  when a resumed trainer moves to another node (`compiled_train`, `compiled_val`);
* `keeper`: the lineage's checkpoint folder, locked, and its asynchronous saves;
* `views`: the tandem views of `ANALYSIS`, run at validation cadence;
* `validation_index`: which validation batch `validate()` is reading (the trainer's
  `batch("val")` returns that one; its override takes only the slice).

`run` reads top to bottom: each step ticks to a new node once the live node's batch is
spent, places the batch, runs the compiled `train_step`, then does what is due after
it, each at its cadence ("every N steps" means after steps N, 2N, ... and after the
last): the report, validation with the evaluations and tandem analyses, a checkpoint,
and always the keeper's `poll()`. Each step runs whole under `deferred_stop`: a stop
signal (Ctrl-C, SIGTERM, SIGHUP, a scheduler's warning; see `theseus.job._signals`)
ends the run at the next step boundary, where the last update is checkpointed first
(`save_before_stopping`), so a stopped run resumes from where it stopped. A run that
fails closes the keeper (saves already started still commit and register) and
publishes the analyses' pending results before the error propagates.

The loop reads its trainer only through the public interface `Trainer` declares.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import jax
import numpy as np

from theseus.config import Tree, dump
from theseus.data.batches import Batch
from theseus.job import (
    JobSpec,
    Mode,
    Preempted,
    StopSignal,
    deferred_stop,
    is_primary,
    process_count,
)
from theseus.store import Node, Store
from theseus.training import _restore, _steps, _tandem, _validation
from theseus.training import checkpoints as ckpt
from theseus.training import state as train_state
from theseus.training._errors import TrainerError
from theseus.training._memory import describe_memory
from theseus.training._preempt import StopVote
from theseus.training.evaluation import TandemView
from theseus.training.reporting import Reporter
from theseus.training.sharding import ParameterShardingContext

__all__ = ["Cursor", "Trainer", "TrainingLoop", "due"]

# The trainer's own logger, as for the tandem analyses' records.
logger = logging.getLogger("theseus.training.base")


def due(step: int, interval: int, total: int) -> bool:
    """Whether an every-`interval`-steps action runs after `step` (always after the last)."""
    return step % interval == 0 or step == total


@dataclass
class Cursor:
    """Where the data the live node and the next update read lies in the data plan.

    The live node at seq `s` holds the batch at `s + offset` (0 for a fresh run; read
    from the checkpoint on resume and branch). `next` is the position the next update
    reads: equal while the live node's batch is unread; once it is spent, one more, and
    the loop ticks to a new node first.
    """

    offset: int = 0
    next: int = 0

    def at(self, seq: int) -> int:
        """The data position of the batch of the node at `seq`."""
        return seq + self.offset

    def spent(self, seq: int) -> bool:
        """Whether the batch of the node at `seq` was consumed by an update already."""
        return self.at(seq) < self.next

    @classmethod
    def restored(cls, meta: dict[str, Any], mode: Mode, seq: int) -> Cursor:
        """The cursor of a live node at `seq` restored from a checkpoint's `meta`."""
        offset, following = _restore.cursors(meta, mode, seq)
        return cls(offset, following)


class Trainer(Protocol):
    """What the loop uses of its trainer: `BaseTrainer`'s public interface."""

    EVALUATION: ClassVar[list[Any]]
    ANALYSIS: ClassVar[list[Any]]
    args: Any
    spec: JobSpec
    configuration: Tree
    state: Any
    analysis_failures: list[tuple[int, str, str]]

    @property
    def node(self) -> Node: ...
    @property
    def mode(self) -> Mode | None: ...
    @property
    def store(self) -> Store: ...
    @property
    def sharding(self) -> ParameterShardingContext: ...
    @property
    def layout(self) -> train_state.StateLayout: ...
    @property
    def block_size(self) -> int: ...
    @property
    def total_steps(self) -> int: ...
    @property
    def accumulate_steps(self) -> int: ...
    @property
    def cursor(self) -> int: ...
    def batch(self, slice: str = "train") -> Batch: ...
    def tick(self) -> Node: ...
    def log(self, values: dict[str, Any]) -> None: ...
    def validate(self) -> dict[str, float]: ...
    def learning_rate(self, step: int) -> float: ...
    def step_key(self) -> jax.Array: ...
    def save_checkpoint(self, *, copy: bool = True) -> None: ...
    def data_record(self) -> dict[str, dict[str, Any]]: ...
    @classmethod
    def train_step(
        cls, state: Any, batch: dict[str, Any], key: jax.Array, accumulate_steps: int, *,
        sharding: ParameterShardingContext,
    ) -> tuple[Any, jax.Array, dict[str, Any], jax.Array]: ...  # fmt: skip
    @classmethod
    def val_step(
        cls, state: Any, batch: dict[str, Any], *, sharding: ParameterShardingContext
    ) -> tuple[jax.Array, jax.Array, dict[str, Any]]: ...


class TrainingLoop:
    """The steps of one trainer, and their state (see the module docstring).

    Args:
        trainer: the trainer whose steps these are (it makes its loop when constructed).
    """

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.cursor = Cursor()
        self.keeper: ckpt.CheckpointKeeper | None = None
        self.views: list[TandemView] = []
        self.validation_index = 0
        self._train: Any = None  # the compiled programs, made at first use
        self._val: Any = None
        self._config_text: str | None = None

    # ------------------------------------------------------------------- the loop
    def run(self) -> Any:
        """Train until `training/tokens` are consumed; returns the final state."""
        trainer, total = self.trainer, self.trainer.total_steps
        start = step = int(trainer.state.step)
        reporter = Reporter(
            total, step, trainer.args.batch_size * trainer.block_size, trainer.node.name
        )
        try:
            if step >= total:
                reporter.say(self._nothing_to_train(step, total))
                return trainer.state
            reporter.say(describe_memory(trainer.state, trainer.sharding, trainer.node.name))
            train, vote = self.compiled_train(), StopVote()  # vote: a scheduler's warning
            while step < total:
                with deferred_stop():  # a stop signal ends the run between steps, never inside
                    if self.cursor.spent(trainer.node.seq):
                        trainer.tick()  # the live node's batch is spent: the update gets a new node
                    placed = trainer.sharding.place_batch(trainer.batch("train"))
                    trainer.state, loss, meta, grad_norm = train(
                        trainer.state, placed, np.uint32(trainer.cursor)
                    )
                    self.cursor.next, step = trainer.cursor + 1, step + 1
                    self._report(step, total, loss, meta, grad_norm, reporter)
                    if due(step, trainer.args.validation_interval, total):
                        self._validate(step, reporter)
                    if due(step, trainer.args.checkpoint_interval, total):
                        self._checkpoint(step, reporter)
                    if self.keeper is not None:
                        self.keeper.poll()  # register the saves orbax has committed
                    if step < total and vote.stop_now():  # every process stops after `step`
                        raise vote.preempted()
        except BaseException as failure:
            self._stopped(failure, start, step, total)
            raise
        finally:
            reporter.close()
        return trainer.state

    # ------------------------------------------------------------ after each step
    def _report(
        self, step: int, total: int, loss: Any, meta: dict[str, Any], grad_norm: Any,
        reporter: Reporter,
    ) -> None:  # fmt: skip
        """Log `train/...` and print the step's line when due (every `logging/report_interval`).

        Raises:
            TrainerError: the loss is not finite (the run diverged).
        """
        trainer, cfg = self.trainer, self.trainer.args
        if not due(step, cfg.report_interval, total):
            reporter.advance(step)
            return
        loss_value, rate = float(loss), reporter.throughput(step)
        values = {
            "train/loss": loss_value,
            "train/step": step,
            "train/tokens": step * cfg.batch_size * trainer.block_size,
            "train/lr": trainer.learning_rate(step),
            "train/grad_norm": float(grad_norm),
            "train/tokens_per_second": rate,
        }
        values.update({f"train/{k}": float(meta[k]) for k in _steps.scalar_keys(meta)})
        trainer.log(values)
        reporter.report(step, loss_value, rate)
        if not np.isfinite(loss_value):
            raise TrainerError(
                f"The training loss is {loss_value} at step {step} of {total} (train/grad_norm "
                f"{float(grad_norm)}, train/lr {values['train/lr']}): the run diverged. Lower "
                f"optimization/lr (now {cfg.lr}) or clip gradients (optimization/clip_norm), "
                "and resume from an earlier checkpoint or start again."
            )

    def _validate(self, step: int, reporter: Reporter) -> None:
        """Validation, then the evaluations, then the tandem analyses, each logged."""
        trainer = self.trainer
        validated = trainer.validate()
        trainer.log(validated)
        shown = [f"{k.removeprefix('val/')} {float(v):.4f}" for k, v in validated.items()]
        reporter.event(step, f"validation {', '.join(shown)}")
        _validation.evaluate(trainer.EVALUATION, trainer, trainer.log)
        _tandem.analyze(
            self.views,
            [analysis.NAME for analysis in trainer.ANALYSIS],
            errors=trainer.args.analysis_errors,
            step=step,
            node=trainer.node,
            log=trainer.log,
            failures=trainer.analysis_failures,
        )

    def _checkpoint(self, step: int, reporter: Reporter) -> None:
        """Start the checkpoint of the live node (`trainer.save_checkpoint`)."""
        self.trainer.save_checkpoint()
        if self.keeper is not None:
            reporter.event(step, f"checkpoint saving to {self.keeper.directory / str(step)}")

    def _stopped(self, failure: BaseException, start: int, step: int, total: int) -> None:
        """After a run that failed or was stopped: save the last update if a signal stopped
        it, let started saves finish, publish what the analyses hold, say how to resume."""
        stopped = isinstance(failure, StopSignal)
        with deferred_stop(raise_at_end=False):  # a stop signal now waits; `failure` goes on
            together = isinstance(failure, Preempted)
            saved = stopped and self.save_before_stopping(start, step, total, together)
            self.release_keeper()  # saves already started still commit and register
            _tandem.drain(self.views)  # results already computed are still published
        if not isinstance(failure, StopSignal):
            return
        node = self.trainer.node
        kept = "its checkpoint is" if saved else "the checkpoints it began are"
        then = (
            "A job of theseus submit requeues itself while requeues are left; else continue"
            if isinstance(failure, Preempted)
            else "Continue"
        )
        logger.warning(
            "%s stopped by %s after step %d of %d; %s registered. %s the lineage "
            "with theseus run ... --resume %s~%s (in Python q.find()...resume()).",
            node.serialize(), failure.signal_name, step, total, kept, then, node.name, node.nonce,
        )  # fmt: skip

    def save_before_stopping(self, start: int, step: int, total: int, together: bool) -> bool:
        """After a stop signal, at a step boundary: checkpoint the last update if it is not saved.

        Preemption then loses no step. A process alone saves; on several hosts orbax's save
        is a collective, and each host may stop after a different step, so there only the
        saves already started are kept, unless the hosts stopped ``together`` (a scheduler's
        warning, on which they voted: see ``theseus.training._preempt``). A failed save is
        logged, and the stop goes on.

        Args:
            start: the step the run began at (nothing new to save when no update ran).
            step: the last completed update's step (the state's).
            total: the run's last step.
            together: every process stopped after ``step`` (and saves with this one).

        Returns:
            Whether a checkpoint of `step` exists now (saved here, or due at `step`).
        """
        if step == start:
            return False
        if due(step, self.trainer.args.checkpoint_interval, total):
            return True  # the step's own checkpoint was started
        if process_count() > 1 and not together:
            return False
        try:
            self.trainer.save_checkpoint()
        except Exception:
            logger.warning("Saving a checkpoint after a stop signal failed", exc_info=True)
            return False
        return True

    def _nothing_to_train(self, step: int, total: int) -> str:
        trainer = self.trainer
        return (
            f"{trainer.node.name} is at step {step} of {total} (training/tokens = "
            f"{trainer.args.tokens}): nothing to train. Raise training/tokens to train on."
        )

    # ------------------------------------------------------------------- programs
    def compiled_train(self) -> Any:
        """`fn(state, batch, cursor) -> (state, loss, meta, grad_norm)`, compiled once."""
        if self._train is None:
            trainer = self.trainer
            self._train = _steps.compile_train(
                type(trainer).train_step,
                trainer.args.seed,
                trainer.accumulate_steps,
                trainer.sharding,
                trainer.layout.shardings,
            )
        return self._train

    def compiled_val(self) -> Any:
        """`fn(state, batch) -> (loss_sum, count, meta)`, compiled once."""
        if self._val is None:
            trainer = self.trainer
            self._val = _steps.compile_val(
                type(trainer).val_step,
                trainer.sharding,
            )
        return self._val

    def validate(self) -> dict[str, float]:
        """`val/loss` (and `val/KEY` of `val_step`'s scalars) over `training/validation_steps` batches."""
        trainer = self.trainer
        return _validation.validate(
            self.validation_batch,
            trainer.args.validation_steps,
            lambda rows: self.compiled_val()(trainer.state, trainer.sharding.place_batch(rows)),
        )

    def validation_batch(self, index: int) -> Batch:
        """The trainer's `batch("val")` for validation batch `index`.

        A trainer's `batch(slice)` override is public API with that one argument, so the
        index reaches the base method through `validation_index` for this call.
        """
        self.validation_index = index
        try:
            return self.trainer.batch("val")
        finally:
            self.validation_index = 0

    # ---------------------------------------------------------------- checkpoints
    def open_keeper(self, check: Callable[[], None] | None = None) -> ckpt.CheckpointKeeper:
        """The lineage's checkpoint keeper, opened (its folder locked) at first use.

        Args:
            check: run on host zero under the folder's lock before anything changes.
        """
        if self.keeper is None:
            trainer = self.trainer
            directory = ckpt.checkpoint_dir(trainer.spec.root, trainer.node)
            store = trainer.store if is_primary() else None
            self.keeper = ckpt.CheckpointKeeper(directory, store, check=check)
        return self.keeper

    def save(self, *, copy: bool = True, step: int | None = None) -> None:
        """Start an asynchronous checkpoint of the live node (registered once committed).

        Args:
            copy: False saves from the live state itself (it must not change until written).
            step: the folder's step; default the state's.
        """
        trainer = self.trainer
        keeper = self.open_keeper()
        step = int(trainer.state.step) if step is None else step
        meta = {
            "cursor": trainer.cursor,
            "step": step,
            "seed": trainer.args.seed,
            "rng": np.asarray(jax.random.key_data(trainer.step_key())).tolist(),
            "node": trainer.node.serialize(),
            "config": self._configuration_text(),
            "data": trainer.data_record(),  # the tokens it trained on (a resume compares)
        }
        keeper.save(
            step, trainer.node, train_state.checkpoint_arrays(trainer.state), meta, copy=copy
        )

    def _configuration_text(self) -> str:
        """The configuration as YAML, for every checkpoint's metadata (dumped once: the
        configuration is fixed at construction, and dumping it takes milliseconds that
        the loop would wait for at every save)."""
        if self._config_text is None:
            self._config_text = dump(self.trainer.configuration)
        return self._config_text

    def release_keeper(self) -> None:
        """After a failed run: finish and register started saves, free the lineage folder."""
        keeper, self.keeper = self.keeper, None
        if keeper is not None:
            try:
                keeper.close()
            except Exception:  # the run's own error is the one to report
                logger.warning(
                    "Closing the checkpoint keeper after a failed run failed", exc_info=True
                )

    def close(self) -> None:
        """After the run: wait for checkpoints to commit and register them, close the views,
        and warn once of the tandem analyses that failed."""
        if self.keeper is not None:
            self.keeper.close()
            self.keeper = None
        for view in self.views:
            view.close()
        _tandem.summarize_failures(self.trainer.node, self.trainer.analysis_failures)
