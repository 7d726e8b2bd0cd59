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
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from theseus.config import dump, field
from theseus.data.batches import Batch, MixturePlan
from theseus.data.datasets import Synthetic
from theseus.data.prepared import DataNotPreparedError
from theseus.data.tokenizer import Tokenizer, get_tokenizer
from theseus.errors import TheseusError
from theseus.job import BasicJob, Mode, from_host_zero, is_primary, process_count, process_index
from theseus.model import debug as _debug
from theseus.model.models import GPT
from theseus.store import Node
from theseus.training import checkpoints as ckpt
from theseus.training import keys
from theseus.training import state as train_state
from theseus.training.evaluation import Evaluation, TandemAnalysis, TandemView
from theseus.training.flywheel.strategy import DatasetDeclaration, plan
from theseus.training.optimizers import AdamW, Optimizer
from theseus.training.reporting import Reporter
from theseus.training.schedules import Schedule, constant
from theseus.training.sharding import ParameterShardingContext

__all__ = ["BaseTrainer", "BaseTrainerConfig", "TrainerError"]

logger = logging.getLogger(__name__)


class TrainerError(TheseusError, ValueError):
    """A trainer configuration or setup that cannot work, with the fix in the message."""


@dataclass
class BaseTrainerConfig:
    """Settings every trainer reads (extend it with your own `field(...)`s)."""

    batch_size: int = field("training/batch_size", default=16, help="global batch, in sequences")
    per_device_batch_size: int = field(
        "training/per_device_batch_size",
        default=0,
        help="sequences per device per micro-step; gradient accumulation fills the rest (0: no accumulation)",
    )
    tokens: int = field("training/tokens", default=1_048_576, help="total training tokens")
    analyze: bool = field("training/analyze", default=True, help="run ANALYSIS in tandem")
    analysis_errors: Literal["log", "raise"] = field(
        "training/analysis_errors",
        default="log",
        help="a failing tandem analysis: 'log' it and train on, or 'raise' and stop the run",
    )
    validation_steps: int = field("training/validation_steps", default=4, help="validation batches")
    seed: int = field("training/seed", default=0, help="parameter init and dropout seed")
    shard: int = field("training/shard", default=1, help="devices each parameter is split over")
    strategy: Literal["dp", "zero1", "fsdp"] = field(
        "training/strategy",
        default="dp",
        help="where the state is kept: 'dp' whole on every device, 'zero1' the optimizer "
        "state split over the data-parallel devices, 'fsdp' parameters, gradients and "
        "optimizer state split",
    )
    lr: float = field("optimization/lr", default=1e-3, help="peak learning rate")
    report_interval: int = field("logging/report_interval", default=10, help="steps per report")
    checkpoint_interval: int = field(
        "logging/checkpoint_interval", default=1000, help="steps per checkpoint (and the last step)"
    )
    validation_interval: int = field(
        "logging/validation_interval", default=100, help="steps per validation"
    )
    data_seed: int = field("data/seed", default=0, help="seed of the batch plan")
    prompt: str = field(
        "inspection/prompt",
        default="",
        help="text that find/debug/analyses trace instead of the node's batch ('' = the batch)",
    )
    comet: str = field(
        "logging/comet",
        default="",
        help="Comet project that analysis figures and JSON also go to ('' = off)",
    )


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
        """`CONFIG`, the model's schemas, then optimizer, schedule, evaluations and analyses."""
        classes: list[type] = [*super().config(), *cls.MODEL.gather(), cls.OPTIMIZER.config]
        if cls.SCHEDULE is not None:
            classes.append(cls.SCHEDULE.config)
        classes += [e.CONFIG for e in cls.EVALUATION if e.CONFIG is not None]
        classes += [a.CONFIG for a in cls.ANALYSIS if getattr(a, "CONFIG", None) is not None]
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
        # host batches of the live node, by (node, slice, validation index)
        self._batches: dict[tuple[Any, ...], Batch] = {}
        self._val_index = 0  # which validation batch batch("val") returns
        self._compiled: dict[str, Any] = {}  # "train" and "val": their jitted programs
        self._keeper: ckpt.CheckpointKeeper | None = None
        self._config_text: str | None = None  # the configuration's YAML, for checkpoints
        self._views: list[TandemView] = []
        #: Tandem analyses that failed during this run: `(step, NAME, "Type: message")`.
        self.analysis_failures: list[tuple[int, str, str]] = []
        self._check_analyses()

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
        per_device = self.args.per_device_batch_size
        parallel = self.sharding.data_parallel
        if self.args.batch_size % parallel:
            raise TrainerError(
                f"training/batch_size = {self.args.batch_size} must be divisible by the "
                f"{parallel} data-parallel devices; use a multiple of {parallel}"
            )
        if per_device <= 0:
            return 1
        micro = per_device * parallel
        if self.args.batch_size % micro:
            raise TrainerError(
                f"training/batch_size = {self.args.batch_size} is not divisible by "
                f"training/per_device_batch_size ({per_device}) x {parallel} devices = {micro}; "
                f"choose a batch size that is a multiple of {micro}"
            )
        return self.args.batch_size // micro

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
        key = (self.node, slice, self._val_index if slice == "val" else 0)
        if key not in self._batches:
            if self._missing_data is not None:
                raise self._missing_data
            if self._plan is None:
                raise TrainerError(
                    f"{type(self).__name__} declares DATASET = [] (custom batching) and must "
                    "override batch(slice)"
                )
            step = self.cursor if slice == "train" else self._val_index
            self._batches = {k: v for k, v in self._batches.items() if k[0] == self.node}
            self._batches[key] = self._plan.batch(step, slice, **self.batch_geometry())  # type: ignore[arg-type]
        return self._batches[key]

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

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        with sharding.rules():
            if accumulate_steps == 1:
                (loss, meta), grads = grad_fn(state.params, batch, key)
            else:
                micro = jax.tree_util.tree_map(
                    lambda a: a.reshape(
                        a.shape[0] // accumulate_steps, accumulate_steps, *a.shape[1:]
                    ).swapaxes(0, 1),
                    batch,
                )

                def body(carry: Any, inputs: Any) -> Any:
                    grads_sum, loss_sum = carry
                    piece, index = inputs
                    (loss, meta), grads = grad_fn(
                        state.params, piece, keys.micro_key(key, index, accumulate_steps)
                    )
                    grads_sum = jax.tree_util.tree_map(jnp.add, grads_sum, grads)
                    return (grads_sum, loss_sum + loss), meta

                zeros = jax.tree_util.tree_map(jnp.zeros_like, state.params)
                (grads, loss), metas = jax.lax.scan(
                    body, (zeros, jnp.zeros((), jnp.float32)), (micro, jnp.arange(accumulate_steps))
                )
                grads = jax.tree_util.tree_map(lambda g: g / accumulate_steps, grads)
                loss = loss / accumulate_steps
                meta = jax.tree_util.tree_map(lambda m: m.mean(0), metas)
            grad_norm = jnp.sqrt(
                sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads))
            )
            state = state.apply_gradients(grads=grads)
        return state, loss, meta, grad_norm

    @classmethod
    def val_step(
        cls, state: Any, batch: dict[str, Any], *, sharding: ParameterShardingContext
    ) -> tuple[jax.Array, jax.Array, dict[str, Any]]:
        """Loss summed over counted targets, how many were counted, and metadata."""
        with sharding.rules():
            _, loss, meta = cls.forward(state, state.params, batch, deterministic=True)
        count = jnp.sum((batch["y"] >= 0) & batch["padding_mask"].astype(bool))
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
        gradient accumulation), from the node-cached batch. With `inspection/prompt`
        set, the prompt instead (`prompt_batch`), and no data is read.
        """
        if self.args.prompt:
            return self.sharding.place_batch(self.prompt_batch(self.args.prompt))
        rows: dict[str, Any] = dict(self.batch("train"))
        every = self.accumulate_steps
        if every > 1:
            rows = {name: value[::every] for name, value in rows.items()}
        return self.sharding.place_batch(rows)

    def prompt_batch(self, text: str) -> Batch:
        """`text` as a batch: `x` its ids, `y` the next ids (the last one ignored).

        Every data-parallel shard gets the same row (one row on one device), so a mean
        over the batch is the prompt's own value. The length is the prompt's: each new
        length compiles the traced programs once.

        Raises:
            TrainerError: the prompt encodes to no tokens or to more than the context.
        """
        ids = self.tokenizer.encode(text).astype(np.int32)
        if not 1 <= ids.size <= self.block_size:
            raise TrainerError(
                f"inspection/prompt is {ids.size} tokens with tokenizer "
                f"{self.tokenizer.name!r}; it must be 1 to architecture/block_size = "
                f"{self.block_size} tokens"
            )
        rows = int(self.sharding.mesh.shape["batch"])
        y = np.append(ids[1:], -1).astype(np.int32)
        return {
            "x": np.tile(ids, (rows, 1)),
            "y": np.tile(y, (rows, 1)),
            "padding_mask": np.tile(y >= 0, (rows, 1)),
        }

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer of the model's ids: `architecture/tokenizer` (`bytes` by default).

        A model without that setting uses its first dataset's tokenizer.
        """
        name = self.configuration.get("architecture/tokenizer")
        if name is None and self._plan is not None:
            return self._plan.sources[0].tokenizer
        return get_tokenizer(name or "bytes", root=self.spec.root)

    def find(self, target: type | tuple[type, ...]) -> list[str]:
        """Paths of every call to a `target` module in `trace`, in call order, each once.

        Discovery is abstract (`jax.eval_shape` of `trace` on the live node's batch).

        Args:
            target: a Flax module class (subclasses match too), or a tuple of them.

        Returns:
            Path strings such as `"blocks_0/attn"`; the root module is `""`.
        """
        _debug.check_target(target, "trainer.find()")
        state, batch, cls = self._inspected(), self.inspection_batch(), type(self)
        sharding = self.sharding
        found: list[str] = []

        def run(state: Any, batch: dict[str, Any]) -> None:
            found.extend(
                _debug.discover(lambda: cls.trace(state, batch, None, sharding=sharding), target)
            )

        jax.eval_shape(run, state, batch)
        return found

    def debug(self, path: str, key: jax.Array | None = None) -> _debug.DebugSession:
        """Replay the live node's batch eagerly up to the first call at `path`.

        Args:
            path: a module path as `find()` returns it (`"blocks_0/attn"`, `""` for the root).
            key: an RNG key for `trace` and the returned layer (dropout active);
                `None` (the default) runs deterministically.

        Returns:
            A `DebugSession`: unpack it as `layer, inputs` (the module bound to its real
            parameters, and the call's arguments by name), or use it in a `with` block.

        Raises:
            UnknownPathError: `path` is not a module path the trace calls (the message
                lists them).
        """
        _debug.check_paths([path], self.find(nn.Module), "trainer.debug()")
        state, batch, cls = self._inspected(), self.inspection_batch(), type(self)
        sharding = self.sharding
        [(module, inputs)] = _debug.capture(
            lambda: cls.trace(state, batch, key, sharding=sharding), [path], keys.layer_rngs(key)
        )
        return _debug.DebugSession(_debug.DebugLayer(module, path), inputs)

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        key: jax.Array | None = None,
        stream: Callable[[str], None] | None = None,
    ) -> Any:
        """Continue prompts with the live state's model (a KV cache; see `theseus.model.generation`).

        Args:
            prompts: a string, a list of strings (encoded with the dataset's tokenizer),
                or a list of token-id lists.
            max_new_tokens: tokens to add to each prompt (prompt + new <= block_size).
            temperature: 0 is greedy.
            top_k, top_p: restrict sampling to the most likely tokens.
            key: the sampling key (default `jax.random.key(training/seed)`).
            stream: for one string prompt, called with each new piece of the decoded
                continuation as soon as its token is drawn.

        Returns:
            The continuation(s), in the prompts' form: a string for a string, a list of
            strings for strings, a list of token-id lists for token ids.

        Raises:
            GenerationError: bad prompts or settings.
            TrainerError: before setup, or a model without cached decoding.
        """
        from theseus.model.generation import generate

        state = self._inspected()
        if not hasattr(self.model, "cached"):
            raise TrainerError(
                f"{type(self.model).__name__} has no cached forward (`cached`, `empty_caches`); "
                "generate() needs a GPT-like model (see theseus.model.models.GPT.cached)"
            )
        tokenizer = self.tokenizer
        single = isinstance(prompts, str)
        given: list[Any] = [prompts] if single else list(prompts)
        as_text = all(isinstance(p, str) for p in given)
        ids = [tokenizer.encode(p).tolist() for p in given] if as_text else given
        if as_text and not all(ids):
            raise TrainerError(
                f"prompt {given[[len(i) for i in ids].index(0)]!r} encodes to no tokens; "
                "give at least one character to continue"
            )
        key = jax.random.key(self.args.seed) if key is None else key
        on_token = None
        if stream is not None:
            if not (single and as_text):
                raise TrainerError("generate(stream=...) streams one string prompt; got several")
            drawn: list[int] = []
            shown = [""]

            def show(text: str) -> None:
                if text.startswith(shown[0]) and len(text) > len(shown[0]):
                    stream(text[len(shown[0]) :])
                    shown[0] = text

            def on_token(tokens: np.ndarray) -> None:
                drawn.append(int(tokens[0]))
                # A character split over tokens decodes to U+FFFD until its last byte
                # comes: hold such an ending back, so it is shown once, whole.
                show(tokenizer.decode(drawn).rstrip("\ufffd"))

        new = generate(
            self.model, state.params, ids, max_new_tokens,
            temperature=temperature, top_k=top_k, top_p=top_p, key=key, on_token=on_token,
        )  # fmt: skip
        if not as_text:
            return new
        decoded = [tokenizer.decode(tokens) for tokens in new]
        if stream is not None:
            show(decoded[0])  # what is still held back: bytes that never became a character
        return decoded[0] if single else decoded

    def _inspected(self) -> Any:
        """The live state, or a clear error before setup."""
        self.node  # raises with the fix when the job is not set up  # noqa: B018
        if self.state is None:
            raise TrainerError(
                f"{type(self).__name__} has no state yet; call setup() before "
                "find()/debug()/generate()"
            )
        return self.state

    # -------------------------------------------------------------------- setup
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

    def _check_data(self) -> None:
        """Every dataset speaks the model's tokenizer, within its vocabulary."""
        if self._plan is None:
            return
        vocab = int(self.configuration["architecture/vocab_size"])
        model = self.configuration.get("architecture/tokenizer")
        for source, style in zip(self._plan.sources, self._plan.styles, strict=True):
            for split, count in source.header["count"].items():
                if style == "pmd" and count <= self.block_size:
                    raise TrainerError(
                        f"dataset {source.name!r} has {count:,} {split} tokens, too few for "
                        f"one window of architecture/block_size = {self.block_size} (+1 "
                        "target); prepare it from more text, or lower block_size"
                    )
            used = source.header["tokenizer"]
            if model is not None and used != model:
                raise TrainerError(
                    f"dataset {source.name!r} was prepared with tokenizer {used!r}, but the "
                    f"model reads {model!r} ids (architecture/tokenizer); prepare it again: "
                    f"theseus data prepare {source.name} --root ROOT --source DIR "
                    f"--tokenizer {model}"
                )
            needed = source.tokenizer.vocab_size
            if vocab < needed:
                raise TrainerError(
                    f"architecture/vocab_size = {vocab} is smaller than the {source.tokenizer.name} "
                    f"tokenizer's {needed} ids used by dataset {source.name!r}; set "
                    f"architecture/vocab_size={needed} or larger"
                )

    def on_setup(self, mode: Mode) -> None:
        """Open the data, then initialize (fresh) or restore (resume, branch) the state.

        A resumed node whose data is not under the root still sets up (to sample,
        debug, or analyze `inspection/prompt`); reading a batch raises the missing
        dataset's error, and so does training.
        """
        try:
            self._plan = plan(self.DATASET, self.spec.root, self.args.data_seed)
        except DataNotPreparedError as missing:
            if self.data_required(mode):
                raise
            self._plan, self._missing_data = None, missing
        self._check_data()
        self.accumulate_steps  # validate the batch geometry before any work  # noqa: B018
        self._tx, self._lr = self._optimizer()
        self._layout = train_state.layout(self.model, self._tx, self.block_size, self.sharding)
        if mode is Mode.FRESH:
            self.state = self.initial_state()
            self._cursor_offset, self._next_cursor = 0, 0
        else:
            assert self.base is not None
            self._take(self.read_checkpoint(self.checkpoint_path(self.base, mode)), mode)
        self._attach_analyses()

    def checkpoint_path(self, node: Node, mode: Mode = Mode.RESUME) -> str:
        """The folder of `node`'s (last) checkpoint: host zero reads the store, every host
        receives it.

        Raises:
            TrainerError: `node` has no checkpoint; the message names the closest one
                of its lineage (`mode` words it: resume or branch from).
        """
        saved = from_host_zero(lambda: self.store.checkpoints(node))
        if not saved:
            raise TrainerError(from_host_zero(lambda: self._no_checkpoint_message(node, mode)))
        return saved[-1].path

    def read_checkpoint(self, path: str | os.PathLike[str]) -> tuple[Any, dict[str, Any]]:
        """`(state, meta)` of the checkpoint folder `path`, laid out as this trainer's state.

        Reads only the folder (never the store), with `surgery` when the trainer has
        one; on one process it may run on a background thread while the live state is
        used (`restore_node` then takes what it read).
        """
        assert self._layout is not None, "setup() builds the state layout"
        return train_state.restore(path, self._layout, getattr(self, "surgery", None))

    def _take(self, saved: tuple[Any, dict[str, Any]], mode: Mode) -> None:
        """Make a restored checkpoint the live state, and set the data cursor from it."""
        self.state, meta = saved
        spent = int(meta["cursor"])  # the checkpointed update consumed this batch
        # Resume continues the checkpoint's own node (its batch is spent); a branch
        # starts a new lineage whose first node reads the batch after it.
        live = spent if mode is Mode.RESUME else spent + 1
        self._cursor_offset, self._next_cursor = live - self.node.seq, spent + 1

    def restore_node(self, node: Node, saved: tuple[Any, dict[str, Any]] | None = None) -> None:
        """Move a resumed trainer to another checkpointed node, as resuming it would.

        The live node becomes `node` (`BasicJob.resume_at`), and its checkpoint is
        restored through the same path as setup (`checkpoint_path`, `read_checkpoint`)
        into the same layout, so programs compiled for the previous node are reused
        (an analysis walking a lineage compiles once).

        Args:
            node: a checkpointed node.
            saved: what `read_checkpoint(checkpoint_path(node))` returned, when it was
                read ahead; None reads it now.

        Raises:
            JobError: the trainer is not set up in resume mode.
            TrainerError: `node` has no checkpoint.
        """
        self._check_resumed()  # before anything is read
        if saved is None:
            saved = self.read_checkpoint(self.checkpoint_path(node))
        self.resume_at(node)
        self._take(saved, Mode.RESUME)

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

    def _no_checkpoint_message(self, base: Any, mode: Mode) -> str:
        """Name the closest checkpointed node of `base`'s lineage, in both spellings."""
        found = [
            c.node
            for c in self.store.query().nonce(base.nonce).checkpoints()
            if c.node.name == base.name and c.node.seq <= base.seq
        ]
        message = f"node {base.serialize()} has no checkpoint to {mode.value} from"
        if not found:
            return (
                f"{message}, and neither has any node of its lineage before it. Start a "
                "fresh run, or pick a checkpointed node (`theseus-store runs ROOT/store` "
                "lists lineages with their checkpoints; in Python "
                "q.find().spec(run=...).checkpoint().latest())"
            )
        closest = max(found, key=lambda n: n.seq)
        flag = "--resume" if mode is Mode.RESUME else "--branch"
        return (
            f"{message}; the closest checkpoint of its lineage is at {closest.serialize()}. "
            f"Use that node: theseus run ... {flag} {closest.serialize()}, or in Python "
            f"q.find().nonce({closest.nonce!r}).seq({closest.seq}).{mode.value}()"
        )

    # --------------------------------------------------------------------- loop
    def step_key(self) -> jax.Array:
        """The RNG key of the live node's update: a pure function of seed and cursor."""
        return keys.step_key(self.args.seed, jnp.uint32(self.cursor))

    def inspection_key(self) -> jax.Array:
        """The dropout key of the live node's first micro-step (what `inspection_batch` saw)."""
        return keys.micro_key(self.step_key(), 0, self.accumulate_steps)

    def _compiled_train(self) -> Any:
        """`fn(state, batch, cursor) -> (state, loss, meta, grad_norm)`, compiled once.

        The step's key is derived inside the program from the cursor (a uint32), so the
        host never waits on a separate key computation between steps.
        """
        if "train" not in self._compiled:
            accumulate, sharding, cls = self.accumulate_steps, self.sharding, type(self)
            seed = self.args.seed
            assert self._layout is not None, "setup() builds the state layout"
            out = (self._layout.shardings, None, None, None)
            self._compiled["train"] = jax.jit(
                lambda state, batch, cursor: cls.train_step(
                    state, batch, keys.step_key(seed, cursor), accumulate, sharding=sharding
                ),
                out_shardings=out,
                donate_argnums=0,
            )
        return self._compiled["train"]

    def _compiled_val(self) -> Any:
        if "val" not in self._compiled:
            sharding, cls = self.sharding, type(self)
            self._compiled["val"] = jax.jit(
                lambda state, batch: cls.val_step(state, batch, sharding=sharding)
            )
        return self._compiled["val"]

    def evaluate_batch(self, rows: Batch) -> tuple[float, int]:
        """`(loss_sum, count)` of `val_step` on host rows (used by evaluations)."""
        loss_sum, count, _ = self._compiled_val()(self.state, self.sharding.place_batch(rows))
        return float(loss_sum), int(count)

    def validate(self) -> dict[str, float]:
        """Validation loss (and `val_step` metadata) over `training/validation_steps` batches."""
        total, count, metas = 0.0, 0, []
        for index in range(self.args.validation_steps):
            placed = self.sharding.place_batch(self._validation_batch(index))
            loss_sum, n, meta = self._compiled_val()(self.state, placed)
            total, count = total + float(loss_sum), count + int(n)
            metas.append(meta)
        values = {"val/loss": total / max(count, 1)}
        for key in _scalar_keys(metas[0] if metas else {}):
            values[f"val/{key}"] = float(np.mean([float(m[key]) for m in metas]))
        return values

    def _validation_batch(self, index: int) -> Batch:
        """`batch("val")` for validation batch `index`.

        A trainer's `batch(slice)` override is public API with that one argument, so the
        index reaches the base method through `_val_index` for the length of this call.
        """
        self._val_index = index
        try:
            return self.batch("val")
        finally:
            self._val_index = 0

    def run(self) -> Any:
        """Train until `training/tokens` are consumed; returns the final state."""
        total, step = self.total_steps, int(self.state.step)
        if self._missing_data is not None and step < total:
            raise self._missing_data
        tokens_per_step = self.args.batch_size * self.block_size
        reporter = Reporter(total, step, tokens_per_step, self.node.name)
        if step >= total:
            reporter.say(
                f"{self.node.name} is at step {step} of {total} (training/tokens = "
                f"{self.args.tokens}): nothing to train. Raise training/tokens to train on."
            )
            reporter.close()
            return self.state
        train = self._compiled_train()
        try:
            while step < total:
                if self.cursor < self._next_cursor:
                    self.tick()  # the live node's batch is spent: the update gets a new node
                placed = self.sharding.place_batch(self.batch("train"))
                self.state, loss, meta, grad_norm = train(
                    self.state, placed, np.uint32(self.cursor)
                )
                self._next_cursor = self.cursor + 1
                step += 1
                self._after_step(step, total, loss, meta, grad_norm, reporter)
        except BaseException:
            self._release_keeper()  # saves already started still commit and register
            self._drain_analyses()  # results already computed are still published
            raise
        finally:
            reporter.close()
        return self.state

    def _drain_analyses(self) -> None:
        for view in self._views:
            try:
                view.drain()
            except Exception:  # the run's own error is the one to report
                logger.warning(
                    "Publishing tandem analyses after a failed run failed", exc_info=True
                )

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
        base = self.node
        later = [
            c
            for c in self.store.query().nonce(base.nonce).checkpoints()
            if c.node.name == base.name and c.node.seq > base.seq
        ]
        if later:
            last = max(later, key=lambda c: c.node.seq)
            lineage = f"{base.name}~{base.nonce}"
            raise TrainerError(
                f"cannot train on from {base.serialize()}: its lineage {lineage} already has "
                f"{len(later)} later checkpoint(s), the last at {last.node.serialize()} (step "
                f"{last.step}), and resuming would train over them. Branch from this node to "
                f"train a new lineage (q.find()...branch(), or theseus run --branch "
                f"{base.serialize()}), or resume the lineage's last checkpoint "
                f"(--resume {lineage})."
            )

    def _after_step(
        self,
        step: int,
        total: int,
        loss: Any,
        meta: dict[str, Any],
        grad_norm: Any,
        reporter: Reporter,
    ) -> None:
        cfg = self.args
        assert self._lr is not None, "setup() builds the optimizer and its schedule"
        if _due(step, cfg.report_interval, total):
            loss_value = float(loss)
            rate = reporter.throughput(step)
            values = {
                "train/loss": loss_value,
                "train/step": step,
                "train/tokens": step * cfg.batch_size * self.block_size,
                "train/lr": float(self._lr(step - 1)),
                "train/grad_norm": float(grad_norm),
                "train/tokens_per_second": rate,
            }
            values.update({f"train/{k}": float(meta[k]) for k in _scalar_keys(meta)})
            self.log(values)
            reporter.report(step, loss_value, rate)
        else:
            reporter.advance(step)
        if _due(step, cfg.validation_interval, total):
            validated = self.validate()
            self.log(validated)
            shown = [f"{k.removeprefix('val/')} {float(v):.4f}" for k, v in validated.items()]
            reporter.event(step, f"validation {', '.join(shown)}")
            self._evaluate()
            self._analyze()
        if _due(step, cfg.checkpoint_interval, total):
            self.save_checkpoint()
            if self._keeper is not None:
                reporter.event(step, f"checkpoint saving to {self._keeper.directory / str(step)}")
        if self._keeper is not None:
            self._keeper.poll()

    def _evaluate(self) -> None:
        for evaluation in self.EVALUATION:
            result = evaluation().evaluate(self)
            if isinstance(result, dict):
                self.log({f"eval/{evaluation.NAME}/{k}": float(v) for k, v in result.items()})
            else:
                self.log({f"eval/{evaluation.NAME}": float(result)})

    def _check_analyses(self) -> None:
        """`ANALYSIS` entries are analysis classes with distinct `NAME`s (checked at construction)."""
        names: dict[str, Any] = {}
        for analysis in self.ANALYSIS:
            if not isinstance(analysis, TandemAnalysis):
                raise TrainerError(
                    f"ANALYSIS entry {analysis!r} of {type(self).__name__} is not an analysis "
                    "class (it needs NAME and from_trainer()); subclass "
                    "theseus.analysis.AnalysisBase"
                )
            if analysis.NAME in names:
                raise TrainerError(
                    f"{type(self).__name__}.ANALYSIS has two analyses named "
                    f"{analysis.NAME!r} ({_name(names[analysis.NAME])} and "
                    f"{_name(analysis)}); their files and artifacts would collide. Give "
                    "each a distinct NAME."
                )
            names[analysis.NAME] = analysis

    def _attach_analyses(self) -> None:
        """Create the tandem views of `ANALYSIS` (each checks its selection now)."""
        if self.args.analyze:
            self._views = [analysis.from_trainer(self) for analysis in self.ANALYSIS]

    def _analyze(self) -> None:
        """Run each tandem view; a failure is logged and recorded, and training goes on.

        The compiled computation runs here; with `training/analysis_errors = "log"` its
        `plot()`, file, artifact and Comet copy are published on a background thread in
        cadence order (the views drain it when the run finishes or fails), so a slow
        plot never stalls training. A typo in an analysis's `plot()` must not end a run
        of many days: the error is logged with its traceback, kept on the live node as the string value
        `analysis/NAME/error`, listed in the run's closing summary, and the analysis
        is tried again at the next validation. `training/analysis_errors = "raise"`
        stops the run instead.
        """
        if not self._views:  # training/analyze = false, or not attached on this setup
            return
        background = self.args.analysis_errors == "log"  # "raise" must raise right here
        for analysis, view in zip(self.ANALYSIS, self._views, strict=True):
            try:
                view.run(background=background)
            except Exception as err:
                if self.args.analysis_errors == "raise":
                    raise
                step, message = int(self.state.step), f"{type(err).__name__}: {err}"
                logger.error(
                    "Tandem analysis %r failed at step %d of %s; training goes on and it runs "
                    "again at the next validation (training/analysis_errors=raise stops the "
                    "run instead):\n%s",
                    analysis.NAME,
                    step,
                    self.node.serialize(),
                    "".join(traceback.format_exception(err)).rstrip(),
                )
                self.log({f"analysis/{analysis.NAME}/error": message})
                self.analysis_failures.append((step, analysis.NAME, message))

    def _open_keeper(self, check: Callable[[], None] | None = None) -> ckpt.CheckpointKeeper:
        if self._keeper is None:
            directory = ckpt.checkpoint_dir(self.spec.root, self.node)
            store = self.store if is_primary() else None
            self._keeper = ckpt.CheckpointKeeper(directory, store, check=check)
        return self._keeper

    def save_checkpoint(self) -> None:
        """Start an asynchronous checkpoint of the live node (registered once committed)."""
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
        keeper.save(step, self.node, train_state.checkpoint_arrays(self.state), meta)

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
            logger.warning(
                "%s finished with %d failed tandem analysis run(s):\n%s",
                self.node.serialize(),
                len(self.analysis_failures),
                "\n".join(
                    f"  {name} at step {step}: {message}"
                    for step, name, message in self.analysis_failures
                ),
            )


def _name(cls: Any) -> str:
    return str(getattr(cls, "__name__", cls))


def _due(step: int, interval: int, total: int) -> bool:
    """Whether an every-`interval`-steps action runs after `step` (always after the last)."""
    return step % interval == 0 or step == total


def _scalar_keys(meta: dict[str, Any]) -> list[str]:
    return [
        k for k, v in meta.items() if getattr(v, "ndim", None) == 0 or isinstance(v, int | float)
    ]
