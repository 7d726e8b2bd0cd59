"""`BaseTrainer`: declare a model, data, optimizer and schedule; train, validate, checkpoint.

A trainer is a job (`BasicJob`) whose declarations (`MODEL`, `CONFIG`, `DATASET`,
`OPTIMIZER`, `SCHEDULE`, `EVALUATION`, `ANALYSIS`) contribute their settings to one
composed configuration. Its overridable pieces are `batch`, `forward`, `train_step`,
`val_step` and `trace`; everything else is the fixed lifecycle:

    each step: batch -> train_step -> report (every `logging/report_interval`)
               -> validation, evaluations, tandem analyses (every `logging/validation_interval`)
               -> checkpoint (every `logging/checkpoint_interval`, and at the end) -> tick

"Every N steps" means after steps N, 2N, ... (and after the last step). The node at seq
`n` holds the metrics and checkpoint of the update that consumed its batch.

The data cursor is the position of a batch in the data plan. The live node's batch is
at `cursor = node.seq + offset` (the offset is 0 for a fresh run and is read from the
checkpoint on resume and branch), and `_next_cursor` is the position the next update
reads: while the live node's batch is still unread the two are equal; once it is spent
the loop ticks to a new node first.

This module is the lifecycle, top to bottom. Each part of a step's story is a module
of functions the trainer calls or binds as methods: `_steps` (a step's arithmetic and
its jitted programs), `_data` (node-cached batches), `_loop`, `_validation`, `_tandem`
(the `ANALYSIS` views), `_inspection` (`find`, `debug`, `generate`) and `_restore`
(a node's checkpoint); `state`, `sharding`, `checkpoints` and `keys` own the state's
layout, the mesh and strategies, the checkpoint lifecycle and every RNG key.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

from theseus.config import dump
from theseus.data.batches import Batch, MixturePlan
from theseus.data.datasets import Synthetic
from theseus.data.prepared import DataNotPreparedError
from theseus.data.tokenizer import Tokenizer, get_tokenizer
from theseus.job import BasicJob, Mode, is_primary, process_count, process_index
from theseus.model.models import GPT
from theseus.store import Node
from theseus.training import (
    _data,
    _inspection,
    _loop,
    _restore,
    _steps,
    _tandem,
    _validation,
    keys,
)
from theseus.training import checkpoints as ckpt
from theseus.training import state as train_state
from theseus.training._config import BaseTrainerConfig
from theseus.training._errors import TrainerError
from theseus.training.evaluation import Evaluation, TandemView
from theseus.training.flywheel.strategy import DatasetDeclaration, plan
from theseus.training.optimizers import AdamW, Optimizer
from theseus.training.schedules import Schedule, constant
from theseus.training.sharding import ParameterShardingContext

__all__ = ["BaseTrainer", "BaseTrainerConfig", "TrainerError"]

logger = logging.getLogger(__name__)


class BaseTrainer(BasicJob):
    """Trains `MODEL` on `DATASET` with `OPTIMIZER` and `SCHEDULE` (see the module docstring).

    Attributes (after setup):
        state: a `flax.training.train_state.TrainState` (params, opt_state, step).
        sharding: the `ParameterShardingContext` (mesh and logical-axis rules).
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
        self._tx: optax.GradientTransformation | None = None
        self._lr: optax.Schedule | None = None
        self._layout: train_state.StateLayout | None = None
        # data position of the live node's batch is node.seq + _cursor_offset; the next
        # update reads the batch at _next_cursor (see the module docstring)
        self._cursor_offset = 0
        self._next_cursor = 0
        self._batches = _data.NodeBatches()  # host batches of the live node
        self._val_index = 0  # which validation batch batch("val") returns
        self._compiled: dict[str, Any] = {}  # "train" and "val": their jitted programs
        self._keeper: ckpt.CheckpointKeeper | None = None
        self._config_text: str | None = None  # the configuration's YAML, for checkpoints
        self._views: list[TandemView] = []
        #: Tandem analyses that failed during this run: `(step, NAME, "Type: message")`.
        self.analysis_failures: list[tuple[int, str, str]] = []
        _tandem.check_analyses(type(self).__name__, self.ANALYSIS)

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
        return self.node.seq + self._cursor_offset

    # ------------------------------------------------------------ override points
    def batch(self, slice: str = "train") -> Batch:
        """Host arrays `x`, `y`, `padding_mask` `[rows_on_this_host, block_size]` for the live node.

        Cached per node: calling it again at the same node returns the same batch;
        ticking advances the cursor. `batch("val")` returns the validation batch that
        `validate()` is reading (the first one outside validation).
        """
        index = self._val_index if slice == "val" else 0
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

    # --------------------------------------------------------------- inspection
    def inspection_batch(self) -> dict[str, jax.Array]:
        """The live node's first micro-batch, placed on the devices.

        This is what `find`, `debug` and analyses trace: the rows `train_step` uses
        for its first micro-step (`batch("train")` itself when there is no
        gradient accumulation), from the node-cached batch. (An analysis traces its
        `inspection/prompt` instead when one is set.)
        """
        rows = _inspection.first_micro_batch(self.batch("train"), self.accumulate_steps)
        return self.sharding.place_batch(rows)

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer of the model's ids: `architecture/tokenizer` (`bytes` by default).

        A model without that setting uses its first dataset's tokenizer.
        """
        name = self.configuration.get("architecture/tokenizer")
        if name is None and self._plan is not None:
            return self._plan.sources[0].tokenizer
        return get_tokenizer(name or "bytes", root=self.spec.root)

    # the debugger's and sampling's entry points (code and documentation: _inspection)
    find = _inspection.find
    debug = _inspection.debug
    generate = _inspection.generate
    prompt_batch = _inspection.prompt_batch

    def step_key(self) -> jax.Array:
        """The RNG key of the live node's update: a pure function of seed and cursor."""
        return keys.step_key(self.args.seed, jnp.uint32(self.cursor))

    def inspection_key(self) -> jax.Array:
        """The dropout key of the live node's first micro-step (what `inspection_batch` saw)."""
        return keys.micro_key(self.step_key(), 0, self.accumulate_steps)

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
        self._tx, self._lr = self._optimizer()
        self._layout = train_state.layout(self.model, self._tx, self.block_size, self.sharding)
        if mode is Mode.FRESH:
            self.state = self.initial_state()
            self._cursor_offset, self._next_cursor = 0, 0
        else:
            assert self.base is not None
            self._take(self.read_checkpoint(self.checkpoint_path(self.base, mode)), mode)
        if self.args.analyze:  # the tandem views of ANALYSIS (each checks its selection now)
            self._views = [analysis.from_trainer(self) for analysis in self.ANALYSIS]

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
    checkpoint_path = _restore.checkpoint_path

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
        """Make a read checkpoint the live state, with the data cursor it sets."""
        self.state, meta = saved
        self._cursor_offset, self._next_cursor = _restore.cursors(meta, mode, self.node.seq)

    # --------------------------------------------------------------------- loop
    def before_run(self) -> None:
        """Refuse to resume training at a node whose lineage has later checkpoints.

        Resuming trains on in the base's own lineage, so that lineage must end there.
        Nodes after the base without checkpoints (a crashed run's last steps) are
        simply written again; registered checkpoints after it are never overwritten.
        """
        if int(self.state.step) >= self.total_steps:
            return
        # Take the lineage folder now (its writer lock, strays set aside), not at the
        # first save: a second process continuing this lineage stops before it logs.
        # The check for later checkpoints runs under the lock, so no other process can
        # register one between the check and the first save.
        refuse = self._refuse_training_over_later_checkpoints
        self._open_keeper(check=refuse if self.mode is Mode.RESUME else None)

    def _refuse_training_over_later_checkpoints(self) -> None:
        """Raise if the base's lineage has checkpoints after it (host zero, under the lock)."""
        _restore.refuse_later_checkpoints(self.store, self.node)

    def run(self) -> Any:
        """Train until `training/tokens` are consumed; returns the final state."""
        return _loop.run(self)

    def _compiled_train(self) -> Any:
        """`fn(state, batch, cursor) -> (state, loss, meta, grad_norm)`, compiled once."""
        if "train" not in self._compiled:
            assert self._layout is not None, "setup() builds the state layout"
            self._compiled["train"] = _steps.compile_train(
                type(self).train_step,
                self.args.seed,
                self.accumulate_steps,
                self.sharding,
                self._layout.shardings,
            )
        return self._compiled["train"]

    _after_step = _loop.after_step  # report, validate, checkpoint: each when due

    # ---------------------------------------- validation, evaluations, analyses
    def _compiled_val(self) -> Any:
        if "val" not in self._compiled:
            self._compiled["val"] = _steps.compile_val(type(self).val_step, self.sharding)
        return self._compiled["val"]

    def validate(self) -> dict[str, float]:
        """Validation loss (and `val_step` metadata) over `training/validation_steps` batches."""
        return _validation.validate(self)

    def evaluate_batch(self, rows: Batch) -> tuple[float, int]:
        """`(loss_sum, count)` of `val_step` on host rows (used by evaluations)."""
        loss_sum, count, _ = self._compiled_val()(self.state, self.sharding.place_batch(rows))
        return float(loss_sum), int(count)

    def _evaluate(self) -> None:
        _validation.evaluate(self)

    def _analyze(self) -> None:
        """Run each tandem view; a failure is logged and recorded, and training goes on."""
        _tandem.analyze(self, self._views)

    # -------------------------------------------------------------- checkpoints
    def _open_keeper(self, check: Callable[[], None] | None = None) -> ckpt.CheckpointKeeper:
        if self._keeper is None:
            directory = ckpt.checkpoint_dir(self.spec.root, self.node)
            store = self.store if is_primary() else None
            self._keeper = ckpt.CheckpointKeeper(directory, store, check=check)
        return self._keeper

    def _release_keeper(self) -> None:
        """After a failed run: finish and register started saves, free the lineage folder."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            try:
                keeper.close()
            except Exception:  # the run's own error is the one to report
                logger.warning(
                    "Closing the checkpoint keeper after a failed run failed", exc_info=True
                )

    def save_checkpoint(self, *, copy: bool = True) -> None:
        """Start an asynchronous checkpoint of the live node (registered once committed);
        `copy=False`: from the live state itself (it must not change until written)."""
        keeper = self._open_keeper()
        step = int(self.state.step)
        meta = {
            "cursor": self.cursor,
            "step": step,
            "seed": self.args.seed,
            "rng": np.asarray(jax.random.key_data(self.step_key())).tolist(),
            "node": self.node.serialize(),
            "config": self._configuration_text(),
        }
        keeper.save(step, self.node, train_state.checkpoint_arrays(self.state), meta, copy=copy)

    def _configuration_text(self) -> str:
        """The configuration as YAML, for every checkpoint's metadata (dumped once: the
        configuration is fixed at construction, and dumping it takes milliseconds that
        the training loop would wait for at every save)."""
        if self._config_text is None:
            self._config_text = dump(self.configuration)
        return self._config_text

    def on_finish(self) -> None:
        """Wait for checkpoints to commit and register them."""
        if self._keeper is not None:
            self._keeper.close()
            self._keeper = None
        for view in self._views:
            view.close()
        if self.analysis_failures:
            _tandem.summarize_failures(self.node, self.analysis_failures)
