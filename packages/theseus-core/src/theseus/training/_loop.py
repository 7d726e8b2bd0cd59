"""The training loop: node by node, one compiled update each, then what is due after it.

`run` ticks to a new node once the live node's batch is spent, places the node's batch,
runs the compiled `train_step` and hands the result to the trainer's `_after_step`.
`after_step` is what happens between updates, each at its cadence (`due`): the report,
then validation, evaluations and tandem analyses, then a checkpoint, and always the
checkpoint keeper's `poll()`. A run that fails closes the keeper (saves already started
still commit and register) and publishes the analyses' pending results before the
error propagates. Each step runs whole under `deferred_stop`: a stop signal (SIGTERM,
SIGHUP; see `theseus.job._signals`) ends the run at the next step boundary, where the
last update is checkpointed first (`save_before_stopping`), so a preempted run resumes
from where it stopped.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from theseus.job import Preempted, StopSignal, deferred_stop, process_count
from theseus.training import _tandem
from theseus.training._errors import TrainerError
from theseus.training._preempt import StopVote
from theseus.training._steps import scalar_keys
from theseus.training.reporting import Reporter
from theseus.training.sharding import state_bytes

if TYPE_CHECKING:
    from theseus.training.base import BaseTrainer

__all__ = ["after_step", "describe_memory", "due", "run", "save_before_stopping"]

# The trainer's own logger, as for the tandem analyses' records.
logger = logging.getLogger("theseus.training.base")


def due(step: int, interval: int, total: int) -> bool:
    """Whether an every-`interval`-steps action runs after `step` (always after the last)."""
    return step % interval == 0 or step == total


def run(trainer: BaseTrainer) -> Any:
    """Train `trainer` until `training/tokens` are consumed; returns the final state."""
    total, step = trainer.total_steps, int(trainer.state.step)
    if trainer._missing_data is not None and step < total:
        raise trainer._missing_data
    tokens_per_step = trainer.args.batch_size * trainer.block_size
    reporter = Reporter(total, step, tokens_per_step, trainer.node.name)
    if step >= total:
        reporter.say(
            f"{trainer.node.name} is at step {step} of {total} (training/tokens = "
            f"{trainer.args.tokens}): nothing to train. Raise training/tokens to train on."
        )
        reporter.close()
        return trainer.state
    reporter.say(describe_memory(trainer))
    train, start = trainer._compiled_train(), step
    vote = StopVote()  # a scheduler's warning: every process stops after the same step
    try:
        while step < total:
            with deferred_stop():  # a stop signal ends the run between steps, never inside
                if trainer.cursor < trainer._next_cursor:
                    trainer.tick()  # the live node's batch is spent: the update gets a new node
                placed = trainer.sharding.place_batch(trainer.batch("train"))
                trainer.state, loss, meta, grad_norm = train(
                    trainer.state, placed, np.uint32(trainer.cursor)
                )
                trainer._next_cursor = trainer.cursor + 1
                step += 1
                trainer._after_step(step, total, loss, meta, grad_norm, reporter)
                if step < total and vote.stop_now():
                    assert vote.signal is not None
                    raise Preempted(int(vote.signal))
    except BaseException as failure:
        with deferred_stop(raise_at_end=False):  # a stop signal now waits; `failure` goes on
            saved = isinstance(failure, StopSignal) and save_before_stopping(
                trainer, start, step, together=isinstance(failure, Preempted)
            )
            trainer._release_keeper()  # saves already started still commit and register
            _tandem.drain(trainer._views)  # results already computed are still published
        if isinstance(failure, StopSignal):
            kept = "its checkpoint is" if saved else "the checkpoints it began are"
            then = (
                "A job of theseus submit requeues itself while requeues are left; else continue"
                if isinstance(failure, Preempted)
                else "Continue"
            )
            logger.warning(
                "%s stopped by %s after step %d of %d; %s registered. %s the lineage "
                "with theseus run ... --resume %s~%s (in Python q.find()...resume()).",
                trainer.node.serialize(),
                failure.signal_name,
                step,
                total,
                kept,
                then,
                trainer.node.name,
                trainer.node.nonce,
            )
        raise
    finally:
        reporter.close()
    return trainer.state


def save_before_stopping(
    trainer: BaseTrainer, start: int, step: int, together: bool = False
) -> bool:
    """After a stop signal, at a step boundary: checkpoint the last update if it is not saved.

    Preemption then loses no step. A process alone saves; on several hosts orbax's save
    is a collective, and each host may stop after a different step, so there only the
    saves already started are kept, unless the hosts stopped ``together`` (a scheduler's
    warning, on which they voted: see ``theseus.training._preempt``). A failed save is
    logged, and the stop goes on.

    Args:
        start: the step the run began at (nothing new to save when no update ran).
        step: the last completed update's step (the state's).
        together: every process stopped after ``step`` (and saves with this one).

    Returns:
        Whether a checkpoint of `step` exists now (saved here, or due at `step`).
    """
    if step == start:
        return False
    if due(step, trainer.args.checkpoint_interval, trainer.total_steps):
        return True  # `after_step` saved it
    if process_count() > 1 and not together:
        return False
    try:
        trainer.save_checkpoint()
    except Exception:
        logger.warning("Saving a checkpoint after a stop signal failed", exc_info=True)
        return False
    return True


def describe_memory(trainer: BaseTrainer) -> str:
    """One line: the parameters' and optimizer state's bytes, and what one device keeps.

    Read from the arrays' own shardings, so it shows what `training/strategy` and
    `training/shard` really did (e.g. `fsdp` on 4 devices: each keeps a quarter).
    """
    sharding = trainer.sharding
    parts = []
    for label, tree in (
        ("parameters", trainer.state.params),
        ("optimizer state", trainer.state.opt_state),
    ):
        if tree is None:  # imported weights, not trained here
            continue
        size = state_bytes(tree)
        parts.append(
            f"{label} {_megabytes(size.whole)}, each device keeps {_megabytes(size.device)} "
            f"({size.share:.0%})"
        )
    return (
        f"{trainer.node.name} state on {sharding.mesh.size} device(s) (training/strategy = "
        f"{sharding.strategy}, training/shard = {sharding.mesh.shape['shard']}): {'; '.join(parts)}"
    )


def _megabytes(count: int) -> str:
    return f"{count / 1e6:,.2f} MB"


def after_step(
    trainer: BaseTrainer,
    step: int,
    total: int,
    loss: Any,
    meta: dict[str, Any],
    grad_norm: Any,
    reporter: Reporter,
) -> None:
    """Report, validate (with evaluations and tandem analyses) and checkpoint when due."""
    cfg = trainer.args
    lr = trainer._lr
    assert lr is not None, "setup() builds the optimizer and its schedule"
    if due(step, cfg.report_interval, total):
        loss_value = float(loss)
        rate = reporter.throughput(step)
        values = {
            "train/loss": loss_value,
            "train/step": step,
            "train/tokens": step * cfg.batch_size * trainer.block_size,
            "train/lr": float(lr(step - 1)),
            "train/grad_norm": float(grad_norm),
            "train/tokens_per_second": rate,
        }
        values.update({f"train/{k}": float(meta[k]) for k in scalar_keys(meta)})
        trainer.log(values)
        reporter.report(step, loss_value, rate)
        if not np.isfinite(loss_value):
            raise TrainerError(
                f"The training loss is {loss_value} at step {step} of {total} (train/grad_norm "
                f"{float(grad_norm)}, train/lr {values['train/lr']}): the run diverged. Lower "
                f"optimization/lr (now {cfg.lr}) or clip gradients (optimization/clip_norm), "
                "and resume from an earlier checkpoint or start again."
            )
    else:
        reporter.advance(step)
    if due(step, cfg.validation_interval, total):
        validated = trainer.validate()
        trainer.log(validated)
        shown = [f"{k.removeprefix('val/')} {float(v):.4f}" for k, v in validated.items()]
        reporter.event(step, f"validation {', '.join(shown)}")
        trainer._evaluate()
        trainer._analyze()
    if due(step, cfg.checkpoint_interval, total):
        trainer.save_checkpoint()
        if trainer._keeper is not None:
            reporter.event(step, f"checkpoint saving to {trainer._keeper.directory / str(step)}")
    if trainer._keeper is not None:
        trainer._keeper.poll()
