"""`BaseTrainer`: declare a model, data, optimizer and schedule; train, validate, checkpoint.

A trainer is a job (`BasicJob`) whose declarations (`MODEL`, `CONFIG`, `DATASET`,
`OPTIMIZER`, `SCHEDULE`, `EVALUATION`, `ANALYSIS`) contribute their settings to one
composed configuration. Its overridable pieces are `batch`, `forward`, `train_step`,
`val_step` and `trace`; everything else is the fixed lifecycle, in this module's order:

    construct: the configuration and the model (nothing allocated)
    setup (on_setup): open the data; build the optimizer and the state's layout; refuse a
        state that cannot fit; initialize (fresh) or restore (resume, branch) the state
        and the data cursor; attach the tandem views of ANALYSIS
    run: the loop (`self.loop`, a `TrainingLoop`), each step:
        batch -> train_step -> report (every `logging/report_interval`)
              -> validation, evaluations, tandem analyses (every `logging/validation_interval`)
              -> checkpoint (every `logging/checkpoint_interval`, and at the end) -> tick
    finish (on_finish): checkpoints committed and registered, views closed

"Every N steps" means after steps N, 2N, ... (and after the last step). The node at seq
`n` holds the metrics and checkpoint of the update that consumed its batch.

The trainer owns its configuration, model, live state and the state's layout; its loop
(`_loop.py`) owns what lives from one step to the next: the data cursor (the live
node's batch is at `cursor = node.seq + offset`), the compiled programs, the
checkpoint keeper, the tandem views. The helper modules take what they use as
arguments: `_steps` (a step's arithmetic and its jitted programs), `_data`
(node-cached batches), `_validation`, `_tandem` (the `ANALYSIS` views), `_inspection`
(`find`, `debug`, `generate`), `_restore` (a node's checkpoint) and `_memory`; `state`,
`sharding`, `checkpoints` and `keys` own the state's layout, the mesh and strategies,
the checkpoint lifecycle and every RNG key.
"""

from __future__ import annotations

import logging
import os
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax

from theseus.data.batches import Batch, MixturePlan
from theseus.data.datasets import Synthetic
from theseus.data.prepared import DataNotPreparedError
from theseus.data.tokenizer import Tokenizer, get_tokenizer
from theseus.job import BasicJob, Mode, is_primary, process_count, process_index
from theseus.model.models import GPT
from theseus.store import Node
from theseus.training import _data, _memory, _restore, _steps, _tandem, keys
from theseus.training import state as train_state
from theseus.training._config import BaseTrainerConfig
from theseus.training._errors import TrainerError
from theseus.training._inspection import Inspection
from theseus.training._loop import Cursor, TrainingLoop
from theseus.training.evaluation import Evaluation
from theseus.training.flywheel.strategy import DatasetDeclaration, plan
from theseus.training.optimizers import AdamW, Optimizer
from theseus.training.schedules import Schedule, constant
from theseus.training.sharding import ParameterShardingContext

__all__ = ["BaseTrainer", "BaseTrainerConfig", "TrainerError"]

logger = logging.getLogger(__name__)


class BaseTrainer(Inspection, BasicJob):
    """Trains `MODEL` on `DATASET` with `OPTIMIZER` and `SCHEDULE` (see the module docstring).

    Attributes (after setup):
        state: a `flax.training.train_state.TrainState` (params, opt_state, step).
        sharding: the `ParameterShardingContext` (mesh and logical-axis rules).
        loop: the `TrainingLoop` that runs the steps and owns their state (the data
            cursor, the compiled programs, the checkpoint keeper, the tandem views).
        node, spec, store, args: from `BasicJob`.
    """

    CONFIG: ClassVar[type | None] = BaseTrainerConfig
    MODEL: ClassVar[Any] = GPT
    DATASET: ClassVar[DatasetDeclaration] = Synthetic
    OPTIMIZER: ClassVar[Optimizer[Any]] = AdamW
    SCHEDULE: ClassVar[Schedule[Any] | None] = None
    EVALUATION: ClassVar[list[type[Evaluation]]] = []
    ANALYSIS: ClassVar[list[Any]] = []

    # ---------------------------------------------------------------- configuration
    @classmethod
    def config(cls) -> list[type]:
        """`CONFIG`, the model's schemas, then optimizer, schedule, evaluations and analyses
        (what each tandem analysis adds, `analysis_config()`)."""
        classes: list[type] = [*super().config(), *cls.MODEL.gather(), cls.OPTIMIZER.config]
        if cls.SCHEDULE is not None:
            classes.append(cls.SCHEDULE.config)
        classes += [e.CONFIG for e in cls.EVALUATION if e.CONFIG is not None]
        _tandem.check_analyses(cls.__name__, cls.ANALYSIS)  # before asking them for theirs
        classes += [c for a in cls.ANALYSIS for c in a.analysis_config()]
        return list(dict.fromkeys(classes))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        with self.activated():
            self.model = self.MODEL.build()
        self.state: Any = None
        self._sharding: ParameterShardingContext | None = None
        # set up by on_setup()
        self._plan: MixturePlan | None = None
        self._missing_data: DataNotPreparedError | None = None  # resumed without its data
        # a resumed checkpoint trained on other tokens than the root's datasets hold now
        self._changed_tokens: str | None = None
        self._warned_tokens: set[str] = set()  # said once per trainer, not at every node
        self._lr: optax.Schedule | None = None
        self._layout: train_state.StateLayout | None = None
        self._batches = _data.NodeBatches()  # host batches of the live node
        #: Tandem analyses that failed during this run: `(step, NAME, "Type: message")`.
        self.analysis_failures: list[tuple[int, str, str]] = []
        _tandem.check_analyses(type(self).__name__, self.ANALYSIS)
        self.loop = TrainingLoop(self)

    # ------------------------------------------------------------------- geometry
    @property
    def sharding(self) -> ParameterShardingContext:
        """The mesh and logical-axis rules (created on first use)."""
        if self._sharding is None:
            self._sharding = ParameterShardingContext.create(self.args.shard, self.args.strategy)
        return self._sharding

    @property
    def block_size(self) -> int:
        """Sequence length of a batch row (`architecture/block_size`)."""
        return int(self.configuration["architecture/block_size"])

    @property
    def total_steps(self) -> int:
        """`training/tokens / (batch_size * block_size)` optimizer steps."""
        return max(1, self.args.tokens // (self.args.batch_size * self.block_size))

    @property
    def accumulate_steps(self) -> int:
        """Micro-steps per optimizer step (gradient accumulation)."""
        cfg = self.args
        return _steps.accumulate_steps(
            cfg.batch_size, cfg.per_device_batch_size, self.sharding.data_parallel
        )

    def batch_geometry(self) -> dict[str, int]:
        """Arguments of `MixturePlan.batch` for this process: rows, block size, host split."""
        return {
            "rows": self.args.batch_size,
            "block_size": self.block_size,
            "host": process_index(),
            "n_hosts": process_count(),
        }

    @property
    def cursor(self) -> int:
        """Position of the live node's batch in the data plan (survives resume and branch)."""
        return self.loop.cursor.at(self.node.seq)

    @property
    def layout(self) -> train_state.StateLayout:
        """Where every part of the state lives (`StateLayout`); built by setup."""
        if self._layout is None:
            raise TrainerError(f"{type(self).__name__} has no state layout yet; call setup() first")
        return self._layout

    def learning_rate(self, step: int) -> float:
        """The learning rate of the update that makes `step` (1 for the first update)."""
        if self._lr is None:
            raise TrainerError(f"{type(self).__name__} has no optimizer yet; call setup() first")
        return float(self._lr(step - 1))

    # ------------------------------------------------------------ override points
    def batch(self, slice: str = "train") -> Batch:
        """Host arrays `x`, `y`, `padding_mask` `[rows_on_this_host, block_size]` for the live node.

        Cached per node: calling it again at the same node returns the same batch;
        ticking advances the cursor. `batch("val")` returns the validation batch that
        `validate()` is reading (the first one outside validation).
        """
        index = self.loop.validation_index if slice == "val" else 0
        position = self.cursor if slice == "train" else index
        return self._batches.get(
            (self.node, slice, index), lambda: self.read_batch(position, slice)
        )

    def read_batch(self, position: int, slice: str = "train") -> Batch:
        """Host rows of the data plan at `position`, as `batch()` would hold them there.

        `train` positions are steps (the batch the update at that cursor reads), `val`
        positions index the validation batches. Nothing is cached and the cursor does
        not move: an analysis that streams many batches (an SAE) reads with this.
        """
        if self._missing_data is not None:
            raise self._missing_data
        if self._plan is None:
            raise TrainerError(
                f"{type(self).__name__} declares DATASET = [] (custom batching) and must "
                "override batch(slice)"
            )
        if self._changed_tokens is not None:  # a resumed node read on other tokens: say so
            self._warn_changed_tokens()
        return self._plan.batch(position, slice, **self.batch_geometry())  # type: ignore[arg-type]

    @staticmethod
    def forward(
        state: Any,
        params: Any,
        batch: dict[str, Any],
        key: jax.Array | None = None,
        deterministic: bool = False,
        intermediates: bool = False,
    ) -> tuple[jax.Array, jax.Array, dict[str, Any]]:
        """Run the model on a batch: `(logits [B, T, V], loss, metadata)`.

        Dropout is active when `deterministic` is false and a `key` is given.
        With `intermediates`, values sown under `intermediates` are in the metadata.
        """
        rngs = {"dropout": key} if key is not None and not deterministic else {}
        mutable = ["intermediates"] if intermediates else False
        out = state.apply_fn(
            {"params": params},
            batch["x"],
            batch["y"],
            batch["padding_mask"],
            deterministic=deterministic or key is None,
            rngs=rngs,
            mutable=mutable,
        )
        (logits, loss), extra = out if intermediates else (out, {})
        meta = {"intermediates": extra["intermediates"]} if intermediates else {}
        return logits, loss, meta

    @classmethod
    def train_step(
        cls,
        state: Any,
        batch: dict[str, Any],
        key: jax.Array,
        accumulate_steps: int,
        *,
        sharding: ParameterShardingContext,
    ) -> tuple[Any, jax.Array, dict[str, Any], jax.Array]:
        """One optimizer update over `accumulate_steps` micro-batches: `(state, loss, meta, grad_norm)`."""

        def loss_fn(params: Any, micro: dict[str, Any], micro_key: jax.Array) -> Any:
            _, loss, meta = cls.forward(state, params, micro, key=micro_key)
            return loss, meta

        with _steps.step_context(sharding):
            loss, meta, grads = _steps.gradients(
                loss_fn, state.params, batch, key, accumulate_steps
            )
            grad_norm = _steps.global_norm(grads)
            state = state.apply_gradients(grads=grads)
        return state, loss, meta, grad_norm

    @classmethod
    def val_step(
        cls, state: Any, batch: dict[str, Any], *, sharding: ParameterShardingContext
    ) -> tuple[jax.Array, jax.Array, dict[str, Any]]:
        """Loss summed over counted targets, how many were counted, and metadata."""
        with _steps.step_context(sharding):
            _, loss, meta = cls.forward(state, state.params, batch, deterministic=True)
        count = _steps.counted_targets(batch)
        return loss * count, count, meta

    @classmethod
    def trace(
        cls,
        state: Any,
        batch: dict[str, Any],
        key: jax.Array | None,
        *,
        sharding: ParameterShardingContext,
    ) -> Any:
        """The pure model call used by debugging and analysis (default: `forward`).

        `key` is None when the caller wants a deterministic run (the debugger and
        analyses, unless asked otherwise): `forward` then applies no dropout.
        """
        with jax.sharding.use_abstract_mesh(sharding.mesh.abstract_mesh), sharding.rules():
            return cls.forward(state, state.params, batch, key=key)

    # ------------------------------------------------------------ data, keys
    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer of the model's ids: `architecture/tokenizer` (`bytes` by default).

        A model without that setting uses its first dataset's tokenizer.
        """
        name = self.configuration.get("architecture/tokenizer")
        if name is None and self._plan is not None:
            return self._plan.sources[0].tokenizer
        return get_tokenizer(name or "bytes", root=self.spec.root)

    def step_key(self) -> jax.Array:
        """The RNG key of the live node's update: a pure function of seed and cursor."""
        return keys.step_key(self.args.seed, jnp.uint32(self.cursor))

    # -------------------------------------------------------------------- setup
    def on_setup(self, mode: Mode) -> None:
        """Open the data, then initialize (fresh) or restore (resume, branch) the state.

        A resumed node whose data is not under the root still sets up (to sample,
        debug, or analyze `inspection/prompt`); reading a batch raises the missing
        dataset's error, and so does training.
        """
        try:
            tokenizer = self.configuration.get("architecture/tokenizer")  # named in hints
            self._plan = plan(self.DATASET, self.spec.root, self.args.data_seed, tokenizer)
        except DataNotPreparedError as missing:
            if self.data_required(mode):
                raise
            self._plan, self._missing_data = None, missing
        _data.check_data(self._plan, self.configuration, self.block_size)
        self.accumulate_steps  # validate the batch geometry before any work  # noqa: B018
        tx, self._lr = self._optimizer()
        self._layout = train_state.layout(self.model, tx, self.block_size, self.sharding)
        # nothing is allocated yet: a state that cannot fit is refused here, in one line
        _memory.check_fits(self._layout.abstract, self.args.strategy, self.args.shard)
        if mode is Mode.FRESH:
            self.state = self.initial_state()
            self.loop.cursor = Cursor()
        else:
            assert self.base is not None
            self._take(self.read_checkpoint(self.checkpoint_path(self.base, mode)), mode)
        if self.args.analyze:  # the tandem views of ANALYSIS (each checks its selection now)
            self.loop.views = [analysis.from_trainer(self) for analysis in self.ANALYSIS]

    def _optimizer(self) -> tuple[optax.GradientTransformation, optax.Schedule]:
        """`(tx, lr)`: `OPTIMIZER` built with `SCHEDULE` (constant `optimization/lr` if None)."""
        with self.activated():
            settings = self.configure(self.OPTIMIZER.config)
            if self.SCHEDULE is None:
                lr: optax.Schedule = constant(self.args.lr)
            else:
                lr = self.SCHEDULE.build(
                    self.configure(self.SCHEDULE.config), self.args.lr, self.total_steps
                )
        return self.OPTIMIZER.build(settings, lr), lr

    def data_required(self, mode: Mode) -> bool:
        """Whether setup in `mode` fails on a dataset that is not prepared.

        Default: a new lineage (fresh or branch) will train, so yes; a resumed node may
        only be looked at, so its data can be missing until a batch is read.
        """
        return mode is not Mode.RESUME

    def initial_state(self) -> Any:
        """The state of a fresh run: parameters initialized from `training/seed`."""
        assert self._layout is not None
        return train_state.initialize(self._layout, self.args.seed)

    # ------------------------------------------------------------------ restore
    # where a resumed or branched state comes from (the details: _restore)
    def checkpoint_path(self, node: Node, mode: Mode = Mode.RESUME) -> str:
        """The folder of `node`'s (last) checkpoint: host zero reads the store, every host
        receives it.

        Raises:
            TrainerError: `node` has no checkpoint; the message names the closest one
                of its lineage (`mode` words it: resume or branch from).
        """
        return _restore.checkpoint_path(lambda: self.store, node, mode)

    def read_checkpoint(self, path: str | os.PathLike[str]) -> tuple[Any, dict[str, Any]]:
        """`(state, meta)` of the checkpoint folder `path` in this trainer's layout (and `surgery`)."""
        assert self._layout is not None, "setup() builds the state layout"
        return _restore.read_checkpoint(path, self._layout, getattr(self, "surgery", None))

    def restore_node(self, node: Node, saved: tuple[Any, dict[str, Any]] | None = None) -> None:
        """Move a resumed trainer to `node`'s checkpoint as resuming it would, reusing its
        compiled programs; `saved` is that checkpoint when read ahead. Raises `JobError`
        unless set up in resume mode, `TrainerError` when `node` has no checkpoint."""
        self._check_resumed()  # before anything is read
        if saved is None:
            saved = self.read_checkpoint(self.checkpoint_path(node))
        self.resume_at(node)
        self._take(saved, Mode.RESUME)

    def _take(self, saved: tuple[Any, dict[str, Any]], mode: Mode) -> None:
        """Make a read checkpoint the live state, with the data cursor it sets.

        Resumed where the root's datasets now hold other tokens than the checkpoint was
        trained on (`_changed_tokens`), training on is refused (`before_run`) and reading
        its batches is warned once (`read_batch`, `_warn_changed_tokens`): they are not
        the ones the lineage read. A branch starts a new lineage and may read other
        tokens on purpose."""
        self.state, meta = saved
        self.loop.cursor = Cursor.restored(meta, mode, self.node.seq)
        changed = _data.changed_tokens(meta.get("data"), self._plan)
        self._changed_tokens = changed if mode is Mode.RESUME else None

    def _warn_changed_tokens(self) -> None:
        """Say once per trainer that the restored node's checkpoint read other tokens."""
        changed = self._changed_tokens
        if changed is None or changed in self._warned_tokens or not is_primary():
            return
        self._warned_tokens.add(changed)
        logger.warning(
            "%s: the tokens of %s under %s are not the ones its checkpoint trained on "
            "(prepared again with --replace since), so the batches read at its nodes "
            "(trainer.batch(), replays, memorization) are not the ones it read",
            self.node.serialize(), changed, self.spec.root,
        )  # fmt: skip

    def data_record(self) -> dict[str, dict[str, Any]]:
        """What a checkpoint records of each dataset's tokens, by name: their sha256
        (`digest`), `tokenizer`, `count` and the dataset's settings (`meta`)."""
        return _data.records(self._plan)

    # --------------------------------------------------------------------- loop
    def before_run(self) -> None:
        """Refuse to resume training at a node whose lineage has later checkpoints.

        Resuming trains on in the base's own lineage, so that lineage must end there.
        Nodes after the base without checkpoints (a crashed run's last steps) are
        simply written again; registered checkpoints after it are never overwritten.
        """
        if int(self.state.step) >= self.total_steps:
            return
        if self._changed_tokens is not None:
            assert self.base is not None
            base = self.base.serialize()
            raise TrainerError(
                f"cannot resume training from {base}: the tokens of {self._changed_tokens} "
                f"under {self.spec.root} are not the ones its checkpoint trained on, so its "
                "lineage would read other batches than it did; prepare those again (theseus "
                "data prepare with the settings it had, and --replace), or branch from it to "
                f"train a new lineage on these (theseus run ... --branch {base})"
            )
        # Take the lineage folder now (its writer lock, strays set aside), not at the
        # first save: a second process continuing this lineage stops before it logs.
        # The check for later checkpoints runs under the lock, so no other process can
        # register one between the check and the first save.
        refuse = self._refuse_training_over_later_checkpoints
        self.loop.open_keeper(check=refuse if self.mode is Mode.RESUME else None)

    def _refuse_training_over_later_checkpoints(self) -> None:
        """Raise if the base's lineage has checkpoints after it (host zero, under the lock)."""
        _restore.refuse_later_checkpoints(self.store, self.node)

    def run(self) -> Any:
        """Train until `training/tokens` are consumed (`self.loop`); returns the final state."""
        if self._missing_data is not None and int(self.state.step) < self.total_steps:
            raise self._missing_data
        return self.loop.run()

    def validate(self) -> dict[str, float]:
        """Validation loss (and `val_step` metadata) over `training/validation_steps` batches."""
        return self.loop.validate()

    def evaluate_batch(self, rows: Batch) -> tuple[float, int]:
        """`(loss_sum, count)` of `val_step` on host rows (used by evaluations)."""
        loss_sum, count, _ = self.loop.compiled_val()(self.state, self.sharding.place_batch(rows))
        return float(loss_sum), int(count)

    def save_checkpoint(self, *, copy: bool = True) -> None:
        """Start an asynchronous checkpoint of the live node (registered once committed);
        `copy=False`: from the live state itself (it must not change until written)."""
        self.loop.save(copy=copy)

    def on_finish(self) -> None:
        """Wait for checkpoints to commit and register them; close the tandem views."""
        self.loop.close()
