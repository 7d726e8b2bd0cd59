"""The inspection entry points: `find`, `debug` and `generate` on the live state.

`BaseTrainer` binds `find`, `debug`, `generate` and `prompt_batch` as its methods
(`find = _inspection.find`), so their code and documentation live here, and its
`inspection_batch` uses `first_micro_batch`.
Each entry point works on any object with the trainer's interface (a tandem view
included), calls `trace` through the object's class so an analysis's override is the
one traced, and refuses with the fix before setup (`inspected`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import numpy as np

from theseus.data.batches import Batch
from theseus.model import debug as _debug
from theseus.training import keys
from theseus.training._errors import TrainerError

if TYPE_CHECKING:
    from theseus.training.base import BaseTrainer

__all__ = ["debug", "find", "first_micro_batch", "generate", "inspected", "prompt_batch"]


def inspected(trainer: BaseTrainer) -> Any:
    """The live state, or a clear error before setup."""
    trainer.node  # raises with the fix when the job is not set up  # noqa: B018
    if trainer.state is None:
        raise TrainerError(
            f"{type(trainer).__name__} has no state yet; call setup() before "
            "find()/debug()/generate()"
        )
    return trainer.state


def first_micro_batch(rows: Batch, accumulate_steps: int) -> dict[str, Any]:
    """The rows of `rows` that `train_step`'s first micro-step uses (every `accumulate_steps`-th)."""
    first: dict[str, Any] = dict(rows)
    if accumulate_steps > 1:
        first = {name: value[::accumulate_steps] for name, value in first.items()}
    return first


def prompt_batch(trainer: BaseTrainer, text: str) -> Batch:
    """`text` as a batch: `x` its ids, `y` the next ids (the last one ignored).

    Every data-parallel shard gets the same row (one row on one device), so a mean
    over the batch is the prompt's own value. The length is the prompt's: each new
    length compiles the traced programs once.

    Raises:
        TrainerError: the prompt encodes to no tokens or to more than the context.
    """
    tokenizer, block_size = trainer.tokenizer, trainer.block_size
    ids = tokenizer.encode(text).astype(np.int32)
    if not 1 <= ids.size <= block_size:
        raise TrainerError(
            f"inspection/prompt is {ids.size} tokens with tokenizer "
            f"{tokenizer.name!r}; it must be 1 to architecture/block_size = "
            f"{block_size} tokens"
        )
    rows = int(trainer.sharding.mesh.shape["batch"])
    y = np.append(ids[1:], -1).astype(np.int32)
    return {
        "x": np.tile(ids, (rows, 1)),
        "y": np.tile(y, (rows, 1)),
        "padding_mask": np.tile(y >= 0, (rows, 1)),
    }


def find(trainer: BaseTrainer, target: type | tuple[type, ...]) -> list[str]:
    """Paths of every call to a `target` module in `trace`, in call order, each once.

    Discovery is abstract (`jax.eval_shape` of `trace` on the live node's batch).

    Args:
        target: a Flax module class (subclasses match too), or a tuple of them.

    Returns:
        Path strings such as `"blocks_0/attn"`; the root module is `""`.
    """
    _debug.check_target(target, "trainer.find()")
    state, batch, cls = inspected(trainer), trainer.inspection_batch(), type(trainer)
    sharding = trainer.sharding
    found: list[str] = []

    def run(state: Any, batch: dict[str, Any]) -> None:
        found.extend(
            _debug.discover(lambda: cls.trace(state, batch, None, sharding=sharding), target)
        )

    jax.eval_shape(run, state, batch)
    return found


def debug(trainer: BaseTrainer, path: str, key: jax.Array | None = None) -> _debug.DebugSession:
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
    _debug.check_paths([path], trainer.find(nn.Module), "trainer.debug()")
    state, batch, cls = inspected(trainer), trainer.inspection_batch(), type(trainer)
    sharding = trainer.sharding
    [(module, inputs)] = _debug.capture(
        lambda: cls.trace(state, batch, key, sharding=sharding), [path], keys.layer_rngs(key)
    )
    return _debug.DebugSession(_debug.DebugLayer(module, path), inputs)


def generate(
    trainer: BaseTrainer,
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
    from theseus.model.generation import generate as decode

    state = inspected(trainer)
    if not hasattr(trainer.model, "empty_cache"):
        raise TrainerError(
            f"{type(trainer.model).__name__} has no key-value cache (`empty_cache`, a call "
            "taking `cache=`); generate() needs a GPT-like model (see theseus.model.models.GPT)"
        )
    tokenizer = trainer.tokenizer
    single = isinstance(prompts, str)
    given: list[Any] = [prompts] if single else list(prompts)
    as_text = all(isinstance(p, str) for p in given)
    ids = [tokenizer.encode(p).tolist() for p in given] if as_text else given
    if as_text and not all(ids):
        raise TrainerError(
            f"prompt {given[[len(i) for i in ids].index(0)]!r} encodes to no tokens; "
            "give at least one character to continue"
        )
    key = jax.random.key(trainer.args.seed) if key is None else key
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
        trainer.model, state.params, ids, max_new_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, key=key, on_token=on_token,
        vocab=tokenizer.vocab_size,  # never an id the tokenizer cannot decode
    )  # fmt: skip
    if not as_text:
        return new
    decoded = [tokenizer.decode(tokens) for tokens in new]
    if stream is not None:
        show(decoded[0])  # what is still held back: bytes that never became a character
    return decoded[0] if single else decoded
