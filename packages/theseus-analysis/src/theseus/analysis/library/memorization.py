"""Memorization over training (Biderman et al. 2023): which of the training sequences a
node has seen greedy decoding reproduces, by the step each was seen.

    the steps the node has seen (`_replay.Seen`) -> `library/memorization/sequences` of their
    sequences drawn (`_replay.draw`) -> their first prefix + continuation tokens,
    replayed exactly (the data plan, or `library/memorization/order` for an imported suite)
    -> one forward of each whole sequence, batched (teacher forcing) -> at each
    continuation position, whether the model's top token is the true next one

A sequence counts as memorized when greedy decoding of its first `library/memorization/prefix`
tokens (32) reproduces its next `library/memorization/continuation` tokens (32) exactly.
Greedy decoding reproduces them exactly when, and only when, the model's top token after
every true prefix of the sequence is the true next token: up to the first miss greedy
decoding reads the true tokens, and at the first miss it leaves them. So one forward of
the whole sequence decides it, with no decoding: the same verdict as the model's
key-value cache decoding token by token (tested against `generate`), except where two
tokens' logits tie within rounding. The same forward gives `accuracy`, the share of
continuation tokens that are the model's top token after the true tokens before them
(Tirumala et al. 2022), and `extracted`, the share of the continuation greedy decoding
reproduces before its first miss.

What the node has seen: with the data plan, the last `state.step` batches up to the
node's cursor (a fresh lineage: steps 0 .. seq); with `library/memorization/order` (a prepared
dataset of the training sequences in order, `order_length` tokens each and `order_rows`
a step), steps 0 .. seq - 1, as an imported suite numbers a checkpoint by the updates
before it. Weights that were imported (state step 0 on a resumed node) were not trained
on this configuration's plan: without an order that is a one-line error.

Values on the node: `dynamics/memorization/share` (memorized / tested),
`dynamics/memorization/accuracy` and `extracted` (means over the sequences),
`dynamics/memorization/sequences` (tested), `dynamics/memorization/first_step` and
`last_step` (the steps seen); the artifact `NAME/sequences.json` (each sequence's step,
row, whether memorized, its accuracy and extracted share); and the plot `NAME`
(memorized share by the step the sequences were seen).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from theseus.analysis import _comet
from theseus.analysis._base import AnalysisBase, C, M
from theseus.analysis._engine import Selection
from theseus.analysis._errors import AnalysisError
from theseus.analysis.library._figures import note, short
from theseus.analysis.library._replay import Seen, draw, order_sequences, plan_sequences
from theseus.config import field
from theseus.data.prepared import DataNotPreparedError, PreparedData
from theseus.experiments.models.gpt import PretrainGPT
from theseus.job import Mode, process_count, process_index
from theseus.store import Artifact, Node
from theseus.training.base import TrainerError

__all__ = ["Memorization", "MemorizationBase", "MemorizationSettings", "top_token_agreement"]

_BINS = 20  # most bins of steps in the plot


@dataclass(frozen=True)
class MemorizationSettings:
    """`library/memorization/...`: how many sequences, how long, where their tokens are."""

    sequences: int = field(
        "library/memorization/sequences",
        default=512,
        ge=1,
        help="training sequences tested per node",
    )
    prefix: int = field(
        "library/memorization/prefix",
        default=32,
        ge=1,
        help="tokens of each sequence given to the model",
    )
    continuation: int = field(
        "library/memorization/continuation",
        default=32,
        ge=1,
        help="tokens after the prefix that greedy decoding must reproduce exactly",
    )
    batch: int = field(
        "library/memorization/batch", default=64, ge=1, help="sequences in one forward"
    )
    seed: int = field(
        "library/memorization/seed", default=0, ge=0, help="draws the sequences tested"
    )
    order: str = field(
        "library/memorization/order",
        default="",
        help="a prepared dataset of the training sequences in the order they were trained "
        "on (an imported suite's data order); empty: replay this configuration's data plan",
    )
    order_rows: int = field(
        "library/memorization/order_rows",
        default=0,
        ge=0,
        help="sequences per step in library/memorization/order; 0: training/batch_size",
    )
    order_length: int = field(
        "library/memorization/order_length",
        default=0,
        ge=0,
        help="tokens per sequence in library/memorization/order; 0: architecture/block_size + 1",
    )


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _agreement(model: Any, params: Any, tokens: jax.Array, prefix: int, vocab: int) -> jax.Array:
    logits, _ = model.apply({"params": params}, tokens[:, :-1])
    top = jnp.argmax(logits[:, prefix - 1 :, :vocab], axis=-1)
    return top == tokens[:, prefix:]


def top_token_agreement(
    model: Any, params: Any, tokens: np.ndarray, prefix: int, batch: int, vocab: int
) -> np.ndarray:
    """`[n, continuation]` booleans: at each position after the first `prefix` tokens of
    `tokens [n, prefix + continuation]`, whether the model's top token (among ids below
    `vocab`) after the true tokens before it is the true token.

    One forward of each sequence (less its last token), `batch` rows at a time; the last
    batch is filled up with copies of its first row, so one program serves every batch.
    A row is all true exactly when greedy decoding of its prefix reproduces the rest.
    """
    out = np.zeros((tokens.shape[0], tokens.shape[1] - prefix), bool)
    for begin in range(0, tokens.shape[0], batch):
        rows = tokens[begin : begin + batch]
        filled = np.concatenate([rows, np.repeat(rows[:1], batch - rows.shape[0], axis=0)])
        agree = _agreement(model, params, jnp.asarray(filled, jnp.int32), prefix, vocab)
        out[begin : begin + rows.shape[0]] = np.asarray(agree)[: rows.shape[0]]
    return out


class MemorizationBase(AnalysisBase[C, M]):
    """Memorized share of the training sequences a node has seen (see the module
    docstring): `class MyMemorization(MemorizationBase, MyTrainer)`.

    Runs in tandem (the live state at validation), on one checkpoint and `--over` a
    lineage. Settings: `MemorizationSettings`.
    """

    TARGET: ClassVar[type | tuple[type, ...]] = nn.Module
    NAME: ClassVar[str] = "memorization"
    SETTINGS: ClassVar[tuple[type, ...]] = (MemorizationSettings,)

    def settings(self) -> MemorizationSettings:
        """The `library/memorization/...` settings as the configuration has them."""
        return self.configure(MemorizationSettings)

    # ----------------------------------------------------------- the user's part
    def select(self, paths: list[str]) -> str | list[str]:
        """Not used: the analysis runs the whole model (nothing is discovered)."""
        return paths[0]

    def analyze(self, layer: Any, inputs: Any) -> Any:
        """Not used: the analysis runs the whole model on the sequences."""
        raise AnalysisError(
            f"{type(self).__name__} runs the whole model on sequences; it has no analyze()"
        )

    def plot(self, results: Any) -> Any:
        """The figure (`figure(results)`)."""
        return self.figure(results)

    @classmethod
    def figure(cls, results: Any) -> Any:
        """Memorized share by the step the sequences were seen (bins of steps). A set that runs this analysis beside it draws it in a worker process
        (`theseus.analysis._renderers`) unless a subclass overrides `plot()`."""
        steps, memorized = results["step"], results["memorized"]
        title = f"Memorized at {short(results['node'])}"
        if steps.size == 0:
            return note(title, "no training sequence seen yet")
        first, last = int(results["first_step"]), int(results["last_step"])
        edges = np.unique(
            np.linspace(first, last + 1, min(_BINS, last - first + 1) + 1).astype(int)
        )
        which = np.searchsorted(edges, steps, side="right") - 1
        x, y = [], []
        for b in range(edges.size - 1):
            inside = which == b
            if inside.any():
                x.append(int(edges[b]))
                y.append(float(memorized[inside].mean()))
        figure = cls.line(
            x=x,
            y=y,
            marker="o",
            errorbar=None,
            title=title,
            xlabel="Step the sequence was seen (first of its bin)",
            ylabel=f"Memorized share ({int(results['prefix'])} + {int(results['continuation'])})",
        )
        figure.axes[0].set_ylim(-0.02, 1.02)  # one scale at every node
        return figure

    # ------------------------------------------------------------------- engine
    def _prepare(self) -> Selection:
        """No discovery: the analysis calls the whole model (so an imported suite needs no
        inspection batch), only the engine's other checks."""
        if self._selection is None:
            _comet.check(self.configuration)
            self._selection = Selection(("",), many=False)
        return self._selection

    def before_run(self) -> None:
        """Refuse, before anything is written, a node whose batches cannot be replayed."""
        length = self._checked_lengths()
        seen = self._seen()
        if seen.steps:  # one sequence read as compute() reads them: the plan or the order
            self._tokens(seen, np.asarray([seen.last]), np.asarray([0]), length)

    def _context(self) -> int:
        """The model's context, `architecture/block_size`."""
        return int(self.model.config.block_size)

    def _checked_lengths(self) -> int:
        st = self.settings()
        need = st.prefix + st.continuation
        if need > self._context():
            raise AnalysisError(
                f"{type(self).__name__}: library/memorization/prefix + continuation = {need} "
                f"tokens, but the model's context (architecture/block_size) is "
                f"{self._context()}; lower library.memorization.prefix or "
                "library.memorization.continuation"
            )
        return need

    def _seen(self) -> Seen:
        """The steps this node has seen (see the module docstring).

        Raises:
            AnalysisError: imported weights without `library/memorization/order` (one line).
        """
        st = self.settings()
        if st.order:
            rows = st.order_rows or int(self.args.batch_size)
            return Seen(0, self.node.seq - 1, rows)
        rows = int(self.args.batch_size)
        taken = int(self.state.step)
        if taken == 0 and self.mode is not Mode.FRESH:
            raise AnalysisError(
                f"{type(self).__name__}: cannot replay the batches {self.node} saw: its weights "
                "were not trained on this configuration's data plan (state step 0: an import); "
                "give the data order as a prepared dataset, library.memorization.order=DATASET"
            )
        if taken == 0:  # fresh weights: nothing seen yet
            return Seen(0, -1, rows)
        return Seen(max(0, self.cursor - taken + 1), self.cursor, rows)

    def _tokens(
        self, seen: Seen, steps: np.ndarray, rows: np.ndarray, length: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The drawn sequences' first `length` tokens, and whether each is all real."""
        st = self.settings()
        owner = type(self).__name__
        if st.order:
            try:
                stream = PreparedData.open(self.spec.root, st.order).tokens("train")
            except DataNotPreparedError as exc:
                first = str(exc).splitlines()[0]
                raise AnalysisError(f"{owner}: library/memorization/order: {first}") from None
            order_length = st.order_length or self._context() + 1
            need = (seen.last + 1) * seen.rows * order_length
            if order_length < length or stream.size < need:
                raise AnalysisError(
                    f"{owner}: library/memorization/order {st.order!r} holds {stream.size} tokens; "
                    f"{self.node} has seen {seen.last + 1} steps of {seen.rows} sequences of "
                    f"{order_length} tokens ({need} tokens, each sequence at least {length}); "
                    "check library.memorization.order_rows and library.memorization.order_length"
                )
            tokens = order_sequences(stream, steps, rows, seen.rows, order_length, length)
            return tokens, np.ones(tokens.shape[0], bool)
        gather = None
        if process_count() > 1:
            from jax.experimental import multihost_utils

            gather = multihost_utils.process_allgather
        try:
            return plan_sequences(
                self.read_batch,
                steps,
                rows,
                length,
                seen.rows // process_count(),
                process_index(),
                gather,
            )
        except (DataNotPreparedError, TrainerError) as exc:
            first = str(exc).splitlines()[0]
            raise AnalysisError(
                f"{owner}: cannot replay the batches {self.node} saw: {first}"
            ) from None

    def compute(self) -> Any:
        """Draw and replay the sequences, and run the model on them. Every host must call it.

        Returns:
            `{"node", "first_step", "last_step", "prefix", "continuation", "step" [k],
            "row" [k], "tokens" [k, prefix + continuation], "top" [k, continuation]
            (whether each continuation token is the model's top token after the true
            ones before it), "memorized" [k] bool, "accuracy" [k], "extracted" [k],
            "partial"}` for the `k` sequences tested (`partial`: those drawn whose tokens
            ran into padding).
        """
        st = self.settings()
        length = self._checked_lengths()
        seen = self._seen()
        steps, rows = draw(seen, st.sequences, st.seed)
        tokens, real = self._tokens(seen, steps, rows, length)
        steps, rows, tokens = steps[real], rows[real], tokens[real]
        if tokens.shape[0]:
            vocab = min(int(self.tokenizer.vocab_size), int(self.model.config.vocab_size))
            top = top_token_agreement(
                self.model, self.state.params, tokens, st.prefix, st.batch, vocab
            )
        else:
            top = np.zeros((0, st.continuation), bool)
        return {
            "node": self.node,
            "first_step": seen.first,
            "last_step": seen.last,
            "prefix": st.prefix,
            "continuation": st.continuation,
            "step": steps,
            "row": rows,
            "tokens": tokens,
            "top": top,
            "memorized": top.all(axis=1),
            "accuracy": top.mean(axis=1),
            "extracted": np.cumprod(top, axis=1).sum(axis=1) / st.continuation,
            "partial": int((~real).sum()),
        }

    def _publish(self, values: Any, node: Node) -> tuple[Path | None, Artifact | None, Any]:
        """Host zero: the values and `NAME/sequences.json`, then the plot (`NAME`)."""
        name = type(self).NAME
        document = {
            "node": node.serialize(),
            "prefix": int(values["prefix"]),
            "continuation": int(values["continuation"]),
            "first_step": int(values["first_step"]),
            "last_step": int(values["last_step"]),
            "partial": int(values["partial"]),
            "sequences": [
                {
                    "step": int(s),
                    "row": int(r),
                    "memorized": bool(m),
                    "accuracy": float(a),
                    "extracted": float(e),
                }
                for s, r, m, a, e in zip(
                    values["step"],
                    values["row"],
                    values["memorized"],
                    values["accuracy"],
                    values["extracted"],
                    strict=True,
                )
            ],
        }
        content = json.dumps(document, separators=(",", ":")).encode()
        self.store.put(node, f"{name}/sequences.json", "sequences.json", content)
        self.store.log(node, self.node_values(values))
        return super()._publish(values, node)

    @classmethod
    def node_values(cls, results: Any) -> dict[str, Any]:
        """The values `compute()`'s results leave on the node: `dynamics/memorization/
        sequences`, `first_step`, `last_step`, and with any sequence tested `share`,
        `accuracy` and `extracted`."""
        tested = int(results["step"].size)
        logged: dict[str, Any] = {
            "dynamics/memorization/sequences": tested,
            "dynamics/memorization/first_step": int(results["first_step"]),
            "dynamics/memorization/last_step": int(results["last_step"]),
        }
        if tested:
            logged["dynamics/memorization/share"] = float(results["memorized"].mean())
            logged["dynamics/memorization/accuracy"] = float(results["accuracy"].mean())
            logged["dynamics/memorization/extracted"] = float(results["extracted"].mean())
        return logged


class Memorization(MemorizationBase, PretrainGPT):
    """Memorization over training: the seen training sequences greedy decoding reproduces."""
