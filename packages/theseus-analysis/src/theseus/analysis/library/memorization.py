"""Memorization over training (Biderman et al. 2023): which of the training sequences a
node has seen greedy decoding reproduces, by the step each was seen.

    the steps the node has seen (`_replay.Seen`) -> `library/memorization/sequences` of their
    sequences drawn (`_replay.draw`) -> their first prefix + continuation tokens,
    replayed exactly (the data plan, or `library/memorization/order` for an imported suite)
    -> greedy decoding of each prefix with the model's key-value cache, batched
    (`theseus.model.generation.generate`, `temperature=0`) -> memorized when the
    continuation is reproduced exactly

A sequence counts as memorized when greedy decoding of its first `library/memorization/prefix`
tokens (32) reproduces its next `library/memorization/continuation` tokens (32) exactly; `match`
is the share of those tokens reproduced (the first mismatch does not stop the count:
each token is decoded from the model's own earlier ones).

What the node has seen: with the data plan, the last `state.step` batches up to the
node's cursor (a fresh lineage: steps 0 .. seq); with `library/memorization/order` (a prepared
dataset of the training sequences in order, `order_length` tokens each and `order_rows`
a step), steps 0 .. seq - 1, as an imported suite numbers a checkpoint by the updates
before it. Weights that were imported (state step 0 on a resumed node) were not trained
on this configuration's plan: without an order that is a one-line error.

Values on the node: `dynamics/memorization/share` (memorized / tested),
`dynamics/memorization/match` (mean share of continuation tokens reproduced),
`dynamics/memorization/sequences` (tested), `dynamics/memorization/first_step` and
`last_step` (the steps seen); the artifact `NAME/sequences.json` (each sequence's step,
row, whether memorized and its match); and the plot `NAME` (memorized share by the step
the sequences were seen).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import flax.linen as nn
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
from theseus.model.generation import decoding_params, generate
from theseus.store import Artifact, Node
from theseus.training.base import TrainerError

__all__ = ["Memorization", "MemorizationBase", "MemorizationSettings", "greedy_continuations"]

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
        "library/memorization/batch", default=64, ge=1, help="sequences decoded together"
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


def greedy_continuations(
    model: Any, params: Any, prefixes: np.ndarray, steps: int, batch: int, vocab: int
) -> np.ndarray:
    """Greedy continuations `[n, steps]` of `prefixes [n, length]`, `batch` rows at a time.

    Runs `theseus.model.generation.generate` with `temperature=0` (the model's
    key-value cache, as long as the prefixes plus `steps`, not the model's context: one
    prefill, then one compiled step a token); the last batch is filled up with copies of
    its first row, so one program serves every batch.
    """
    out = np.zeros((prefixes.shape[0], steps), np.int32)
    params = decoding_params(model, params)  # once, not once a batch
    for begin in range(0, prefixes.shape[0], batch):
        rows = prefixes[begin : begin + batch]
        filled = np.concatenate([rows, np.repeat(rows[:1], batch - rows.shape[0], axis=0)])
        new = generate(
            model, params, filled.tolist(), steps, temperature=0.0, vocab=vocab,
            cache_slots=prefixes.shape[1] + steps,
        )  # fmt: skip
        out[begin : begin + rows.shape[0]] = np.asarray(new, np.int32)[: rows.shape[0]]
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
        """Not used: the analysis decodes with the whole model (nothing is discovered)."""
        return paths[0]

    def analyze(self, layer: Any, inputs: Any) -> Any:
        """Not used: the sequences are decoded with the model's key-value cache."""
        raise AnalysisError(f"{type(self).__name__} decodes sequences; it has no analyze()")

    def plot(self, results: Any) -> Any:
        """Memorized share by the step the sequences were seen (bins of steps)."""
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
        figure = self.line(
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
        """Draw, replay and greedily decode the sequences. Every host must call it.

        Returns:
            `{"node", "first_step", "last_step", "prefix", "continuation", "step" [k],
            "row" [k], "tokens" [k, prefix + continuation], "decoded" [k, continuation],
            "memorized" [k] bool, "match" [k], "partial"}` for the `k` sequences tested
            (`partial`: those drawn whose tokens ran into padding).
        """
        st = self.settings()
        length = self._checked_lengths()
        seen = self._seen()
        steps, rows = draw(seen, st.sequences, st.seed)
        tokens, real = self._tokens(seen, steps, rows, length)
        steps, rows, tokens = steps[real], rows[real], tokens[real]
        if tokens.shape[0]:
            vocab = min(int(self.tokenizer.vocab_size), int(self.model.config.vocab_size))
            prefixes = tokens[:, : st.prefix]
            decoded = greedy_continuations(
                self.model, self.state.params, prefixes, st.continuation, st.batch, vocab
            )
        else:
            decoded = np.zeros((0, st.continuation), np.int32)
        same = decoded == tokens[:, st.prefix :]
        return {
            "node": self.node,
            "first_step": seen.first,
            "last_step": seen.last,
            "prefix": st.prefix,
            "continuation": st.continuation,
            "step": steps,
            "row": rows,
            "tokens": tokens,
            "decoded": decoded,
            "memorized": same.all(axis=1),
            "match": same.mean(axis=1),
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
                {"step": int(s), "row": int(r), "memorized": bool(m), "match": float(f)}
                for s, r, m, f in zip(
                    values["step"], values["row"], values["memorized"], values["match"], strict=True
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
        sequences`, `first_step`, `last_step`, and with any sequence tested `share`, `match`."""
        tested = int(results["step"].size)
        logged: dict[str, Any] = {
            "dynamics/memorization/sequences": tested,
            "dynamics/memorization/first_step": int(results["first_step"]),
            "dynamics/memorization/last_step": int(results["last_step"]),
        }
        if tested:
            logged["dynamics/memorization/share"] = float(results["memorized"].mean())
            logged["dynamics/memorization/match"] = float(results["match"].mean())
        return logged


class Memorization(MemorizationBase, PretrainGPT):
    """Memorization over training: the seen training sequences greedy decoding reproduces."""
