"""The inspection entry points of a trainer: `find`, `debug`, `generate` (`Inspection`).

`BaseTrainer` inherits `Inspection`'s methods, and so does a tandem view (a subclass of
its trainer's class), whose `find` and `debug` then trace the analysis's `trace` on
the trainer's state and batch. Each method gathers what it uses (the object's class's
`trace` with the sharding bound, the live state, the placed batch) and hands it to a
function below that does the work knowing nothing of trainers: `find_paths` (abstract
discovery), `replay` (the eager debugger), `continue_prompts` (sampling with a KV
cache), `encode_prompt` (`inspection/prompt` as a batch) and `first_micro_batch` (the
rows `inspection_batch` traces).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import numpy as np

from theseus.data.batches import Batch
from theseus.data.tokenizer import Tokenizer
from theseus.model import debug as _debug
from theseus.training import keys
from theseus.training._errors import TrainerError

if TYPE_CHECKING:
    from theseus.store import Node
    from theseus.training.sharding import ParameterShardingContext

__all__ = [
    "Inspection",
    "Trace",
    "continue_prompts",
    "encode_prompt",
    "find_paths",
    "first_micro_batch",
    "replay",
]

#: `trace(state, batch, key)`: a trainer's `trace` with its sharding bound.
Trace = Callable[[Any, dict[str, Any], "jax.Array | None"], Any]


def first_micro_batch(rows: Batch, accumulate_steps: int) -> dict[str, Any]:
    """The rows of `rows` that `train_step`'s first micro-step uses (every `accumulate_steps`-th)."""
    first: dict[str, Any] = dict(rows)
    if accumulate_steps > 1:
        first = {name: value[::accumulate_steps] for name, value in first.items()}
    return first


def encode_prompt(tokenizer: Tokenizer, block_size: int, rows: int, text: str) -> Batch:
    """`text` as `rows` identical rows: `x` its ids, `y` the next ids (the last one ignored).

    Raises:
        TrainerError: the prompt encodes to no tokens or to more than `block_size`.
    """
    ids = tokenizer.encode(text).astype(np.int32)
    if not 1 <= ids.size <= block_size:
        raise TrainerError(
            f"inspection/prompt is {ids.size} tokens with tokenizer "
            f"{tokenizer.name!r}; it must be 1 to architecture/block_size = "
            f"{block_size} tokens"
        )
    y = np.append(ids[1:], -1).astype(np.int32)
    return {
        "x": np.tile(ids, (rows, 1)),
        "y": np.tile(y, (rows, 1)),
        "padding_mask": np.tile(y >= 0, (rows, 1)),
    }


def find_paths(
    trace: Trace, state: Any, batch: dict[str, Any], target: type | tuple[type, ...]
) -> list[str]:
    """Paths of every call to a `target` module in `trace(state, batch, None)`, in call
    order, each once; discovered abstractly (`jax.eval_shape`)."""
    _debug.check_target(target, "trainer.find()")
    found: list[str] = []

    def run(state: Any, batch: dict[str, Any]) -> None:
        found.extend(_debug.discover(lambda: trace(state, batch, None), target))

    jax.eval_shape(run, state, batch)
    return found


def replay(
    trace: Trace,
    state: Any,
    batch: dict[str, Any],
    path: str,
    key: jax.Array | None,
    paths: Sequence[str],
) -> _debug.DebugSession:
    """Replay `trace(state, batch, key)` eagerly up to the first call at `path`.

    Raises:
        UnknownPathError: `path` is not one of `paths` (the message lists them).
    """
    _debug.check_paths([path], list(paths), "trainer.debug()")
    [(module, inputs)] = _debug.capture(
        lambda: trace(state, batch, key), [path], keys.layer_rngs(key)
    )
    return _debug.DebugSession(_debug.DebugLayer(module, path), inputs)


def continue_prompts(
    model: nn.Module,
    params: Any,
    tokenizer: Tokenizer,
    prompts: str | Sequence[str] | Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    key: jax.Array,
    stream: Callable[[str], None] | None,
) -> Any:
    """Continue `prompts` with `model` at `params` (see `BaseTrainer.generate`, which
    documents the arguments; `key` is the sampling key).

    Raises:
        GenerationError: bad prompts or settings.
        TrainerError: a model without cached decoding, an empty prompt, or `stream`
            with several prompts.
    """
    from theseus.model.generation import generate as decode

    if not hasattr(model, "empty_cache"):
        raise TrainerError(
            f"{type(model).__name__} has no key-value cache (`empty_cache`, a call "
            "taking `cache=`); generate() needs a GPT-like model (see theseus.model.models.GPT)"
        )
    single = isinstance(prompts, str)
    given: list[Any] = [prompts] if single else list(prompts)
    as_text = all(isinstance(p, str) for p in given)
    ids = [tokenizer.encode(p).tolist() for p in given] if as_text else given
    if as_text and not all(ids):
        raise TrainerError(
            f"prompt {given[[len(i) for i in ids].index(0)]!r} encodes to no tokens; "
            "give at least one character to continue"
        )
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

    new = decode(
        model, params, ids, max_new_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, key=key, on_token=on_token,
        vocab=tokenizer.vocab_size,  # never an id the tokenizer cannot decode
    )  # fmt: skip
    if not as_text:
        return new
    decoded = [tokenizer.decode(tokens) for tokens in new]
    if stream is not None:
        show(decoded[0])  # what is still held back: bytes that never became a character
    return decoded[0] if single else decoded


class Inspection:
    """The debugger's and sampling's entry points: `find`, `debug`, `generate`,
    `prompt_batch`, and what they trace (`inspection_batch`, `inspection_key`).

    `BaseTrainer` inherits them, and so does a tandem view (a subclass of its trainer's
    class), whose `find` and `debug` then trace the analysis's `trace` on the trainer's
    state and batch. Each refuses with the fix before setup.
    """

    if TYPE_CHECKING:  # provided by the trainer
        args: Any
        model: Any
        state: Any

        @property
        def node(self) -> Node: ...
        @property
        def sharding(self) -> ParameterShardingContext: ...
        @property
        def tokenizer(self) -> Tokenizer: ...
        @property
        def block_size(self) -> int: ...
        @property
        def accumulate_steps(self) -> int: ...
        def batch(self, slice: str = "train") -> Batch: ...
        def step_key(self) -> jax.Array: ...
        @classmethod
        def trace(
            cls, state: Any, batch: dict[str, Any], key: jax.Array | None, *,
            sharding: ParameterShardingContext,
        ) -> Any: ...  # fmt: skip

    def inspection_batch(self) -> dict[str, jax.Array]:
        """The live node's first micro-batch, placed on the devices.

        This is what `find`, `debug` and analyses trace: the rows `train_step` uses
        for its first micro-step (`batch("train")` itself when there is no
        gradient accumulation), from the node-cached batch. (An analysis traces its
        `inspection/prompt` instead when one is set: theseus-analysis declares it.)
        """
        rows = first_micro_batch(self.batch("train"), self.accumulate_steps)
        return self.sharding.place_batch(rows)

    def prompt_batch(self, text: str) -> Batch:
        """`text` as a batch: `x` its ids, `y` the next ids (the last one ignored).

        Every data-parallel shard gets the same row (one row on one device), so a mean
        over the batch is the prompt's own value. The length is the prompt's: each new
        length compiles the traced programs once.

        Raises:
            TrainerError: the prompt encodes to no tokens or to more than the context.
        """
        rows = int(self.sharding.mesh.shape["batch"])
        return encode_prompt(self.tokenizer, self.block_size, rows, text)

    def find(self, target: type | tuple[type, ...]) -> list[str]:
        """Paths of every call to a `target` module in `trace`, in call order, each once.

        Discovery is abstract (`jax.eval_shape` of `trace` on the live node's batch).

        Args:
            target: a Flax module class (subclasses match too), or a tuple of them.

        Returns:
            Path strings such as `"blocks_0/attn"`; the root module is `""`.
        """
        _debug.check_target(target, "trainer.find()")
        state, batch = self._inspected(), self.inspection_batch()
        return find_paths(self._trace(), state, batch, target)

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
        paths = self.find(nn.Module)
        state, batch = self._inspected(), self.inspection_batch()
        return replay(self._trace(), state, batch, path, key, paths)

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
        params = self._inspected().params
        key = jax.random.key(self.args.seed) if key is None else key
        return continue_prompts(
            self.model, params, self.tokenizer, prompts, max_new_tokens,
            temperature=temperature, top_k=top_k, top_p=top_p, key=key, stream=stream,
        )  # fmt: skip

    def _inspected(self) -> Any:
        """The live state, or a clear error before setup."""
        self.node  # raises with the fix when the job is not set up  # noqa: B018
        if self.state is None:
            raise TrainerError(
                f"{type(self).__name__} has no state yet; call setup() before "
                "find()/debug()/generate()"
            )
        return self.state

    def _trace(self) -> Trace:
        """This object's class's `trace` with its sharding bound (a tandem view's class is
        its analysis, so the analysis's override is the one traced)."""
        return functools.partial(type(self).trace, sharding=self.sharding)

    def inspection_key(self) -> jax.Array:
        """The dropout key of the live node's first micro-step (what `inspection_batch` saw)."""
        return keys.micro_key(self.step_key(), 0, self.accumulate_steps)
