"""Representation drift: linear CKA between each layer's residual stream at this node and
at the previous node of the lineage (and at a reference node), on one fixed batch.

    the fixed batch (validation batch 0, its first micro-batch) -> every block's output at
    `library/drift/tokens` positions drawn once from `library/drift/seed` ([layers, tokens, d], one
    compiled program per instance) -> kept centered, unit RMS, float16 (`_cka.kept`)
    -> the previous node's residuals: the instance's memory, else the latest earlier
    node along the stitched lineage that holds them (artifact `NAME/residuals.npy`)
    or has a checkpoint (recomputed from it, never by walking the lineage again)
    -> linear CKA per layer (`_cka.linear_cka`, float64)

Values on the node: `dynamics/cka/L{l}` and `dynamics/cka/previous` (the node compared
with), with `library/drift/reference` set `dynamics/cka_reference/L{l}` and
`dynamics/cka_reference/node`, and `analysis/NAME/residuals` (which tokens the stored
residuals belong to); the artifact `NAME/residuals.npy` (what the next node compares
with); and the plot `NAME` (CKA by layer). The first node of a lineage has no previous
node: its plot says so and it records only its residuals.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from theseus.analysis._base import AnalysisBase, C, M
from theseus.analysis._engine import to_host
from theseus.analysis._errors import AnalysisError
from theseus.analysis.library._cka import kept, linear_cka
from theseus.analysis.library._figures import note, short
from theseus.analysis.library._residuals import (
    Source,
    earlier_source,
    from_bytes,
    node_source,
    picks,
    residual_program,
    to_bytes,
    tokens_digest,
)
from theseus.config import field
from theseus.experiments.models.gpt import PretrainGPT
from theseus.job import from_host_zero
from theseus.model.models import Block
from theseus.store import Artifact, Node

__all__ = ["DriftBase", "DriftSettings", "RepresentationDrift"]

# (result key, the result holding the node compared with, the value naming it): each
# comparison's values are dynamics/KEY/L{l} and dynamics/KEY/NAMING
_COMPARISONS = (("cka", "previous", "previous"), ("cka_reference", "reference", "node"))


@dataclass(frozen=True)
class DriftSettings:
    """`library/drift/...`: which tokens are compared, and the reference node."""

    tokens: int = field(
        "library/drift/tokens",
        default=512,
        ge=2,
        help="token positions of the fixed batch whose residual streams are compared",
    )
    seed: int = field(
        "library/drift/seed", default=0, ge=0, help="draws the compared positions, once"
    )
    reference: str = field(
        "library/drift/reference",
        default="",
        help="a node (name~nonce~seq) every node is also compared with; empty: none",
    )


class DriftBase(AnalysisBase[C, M]):
    """Linear CKA of every block's output against the previous node's (see the module
    docstring): `class MyDrift(DriftBase, MyTrainer)`.

    Runs in tandem (the previous node is the previous validation's), on one checkpoint
    (the previous node is the latest earlier one analyzed or checkpointed) and `--over`
    a lineage (the previous checkpoint, from memory). Settings: `DriftSettings`.
    """

    TARGET: ClassVar[type | tuple[type, ...]] = Block
    NAME: ClassVar[str] = "drift"
    SETTINGS: ClassVar[tuple[type, ...]] = (DriftSettings,)

    def _init_engine(self) -> None:
        super()._init_engine()
        self._drift_program: tuple[bytes, Any] | None = None
        self._memory: tuple[Node, str, np.ndarray] | None = None  # the last node computed
        self._reference_at: Node | None = None
        self._reference_memory: tuple[Node, str, np.ndarray] | None = None

    def settings(self) -> DriftSettings:
        """The `library/drift/...` settings as the configuration has them."""
        return self.configure(DriftSettings)

    # ----------------------------------------------------------- the user's part
    def select(self, paths: list[str]) -> str | list[str]:
        """Every block, in call order (override to compare fewer)."""
        return list(paths)

    def analyze(self, layer: Any, inputs: Any) -> Any:
        """Not used: the residual streams are read by the drift's own program."""
        raise AnalysisError(f"{type(self).__name__} compares residual streams; it has no analyze()")

    def plot(self, results: Any) -> Any:
        """The figure (`figure(results)`)."""
        return self.figure(results)

    @classmethod
    def figure(cls, results: Any) -> Any:
        """CKA by layer, one line per comparison (a note on a node with none). A set that runs this analysis beside it draws it in a worker process
        (`theseus.analysis._renderers`) unless a subclass overrides `plot()`."""
        curves: dict[str, list[Any]] = {"layer": [], "CKA": [], "compared with": []}
        for key, at, _ in _COMPARISONS:
            if results[key] is None:
                continue
            label = f"{at}: {short(results[at])}"
            for layer, value in enumerate(results[key]):
                curves["layer"].append(layer)
                curves["CKA"].append(float(value))
                curves["compared with"].append(label)
        title = f"Linear CKA of the residual stream at {short(results['node'])}"
        if not curves["layer"]:
            return note(title, "no earlier node analyzed or checkpointed to compare with")
        figure = cls.line(
            curves,
            x="layer",
            y="CKA",
            hue="compared with",
            marker="o",
            errorbar=None,
            title=title,
            xlabel="Layer (block output)",
            ylabel="Linear CKA",
        )
        axes = figure.axes[0]
        axes.set_xticks(sorted(set(curves["layer"])))
        axes.set_ylim(0.0, 1.02)  # one scale at every node (the slider compares them)
        return figure

    # ------------------------------------------------------------------- engine
    def _prepare(self) -> Any:
        first = self._selection is None
        selection = super()._prepare()
        if first:
            self._reference_node()  # a bad drift/reference fails before anything is written
        return selection

    def _reference_node(self) -> Node | None:
        text = self.settings().reference.strip()
        if not text or self._reference_at is not None:
            return self._reference_at
        store = self.store

        def resolve() -> Node | str:
            try:
                return store.resolve(text)
            except (KeyError, ValueError) as exc:
                return str(exc).strip("'\"")

        found = from_host_zero(resolve)
        if isinstance(found, str):
            raise AnalysisError(
                f"{type(self).__name__}: drift/reference = {text!r} names no node of this store "
                f"({found}); set library.drift.reference=NAME~NONCE~SEQ (theseus-store runs "
                "ROOT lists the lineages) or leave it empty"
            )
        self._reference_at = found
        return found

    def _fixed_batch(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Validation batch 0's first micro-batch: host rows and placed."""
        every = self.accumulate_steps
        rows = {k: v[0::every] for k, v in self.read_batch(0, "val").items()}
        return rows, self.sharding.place_batch(rows)

    def _residual_fn(self, chosen: np.ndarray) -> Any:
        key = chosen.tobytes()
        if self._drift_program is None or self._drift_program[0] != key:

            def count() -> None:
                self.traces += 1

            fn = residual_program(
                type(self).trace,  # type: ignore[attr-defined]
                self._prepare().paths,
                chosen,
                self.sharding,
                type(self).__name__,
                count,
            )
            self._drift_program = (key, fn)
        return self._drift_program[1]

    def _residuals(self, program: Any, state: Any, batch: dict[str, Any]) -> np.ndarray:
        """`[layers, tokens, d]` float16, each layer as `_cka.kept` keeps it."""
        return np.stack([kept(h) for h in to_host(program(state, batch, None))])

    def _read(self, source: Source, program: Any, batch: dict[str, Any]) -> np.ndarray:
        """The residuals `source` names (every host: a checkpoint is read by all)."""
        if source.kind == "memory":
            assert self._memory is not None
            return self._memory[2]
        if source.kind == "store":
            assert source.content is not None
            return from_bytes(source.content)
        owner = self.trainer if self.borrowed else self  # type: ignore[attr-defined]
        state, _ = owner.read_checkpoint(owner.checkpoint_path(source.node))
        return self._residuals(program, state, batch)

    def compared_blocks(self) -> tuple[str, ...]:
        """The paths of the blocks whose outputs are compared (`select`), in call order."""
        return tuple(self._prepare().paths)

    def fixed_tokens(self) -> tuple[dict[str, np.ndarray], dict[str, Any], np.ndarray]:
        """The fixed batch (this host's rows, and placed) and the flat positions of it
        whose residual streams are compared (`library/drift/tokens`, `library/drift/seed`)."""
        st = self.settings()
        rows, batch = self._fixed_batch()
        chosen = picks(int(batch["x"].shape[0]), int(batch["x"].shape[1]), st.tokens, st.seed)
        return rows, batch, chosen

    def compute(self) -> Any:
        """Residuals at the live node, and their CKA with the previous node's (and the
        reference's). Every host must call it.

        Returns:
            `{"node", "digest", "residuals" [layers, tokens, d] float16, "previous",
            "cka" [layers] or None, "reference", "cka_reference" [layers] or None}`.
        """
        return self.compute_from(None)

    def compute_from(self, recorded: np.ndarray | None) -> Any:
        """`compute()`, given the live node's residual streams when another program
        already recorded them: `recorded [layers, tokens, d]` (float32, every selected
        block at the positions `fixed_tokens()` names; a `library/first` set's program
        records them in the forward its members share). None: this analysis's own
        program computes them. An earlier node's residuals that must be recomputed
        from its checkpoint still come from its own program."""
        node = self.node
        name = type(self).NAME
        rows, batch, chosen = self.fixed_tokens()
        digest = tokens_digest(rows["x"], chosen, len(self.compared_blocks()))
        program = self._residual_fn(chosen)  # traced only where it is called
        if recorded is None:
            current = self._residuals(program, self.state, batch)
        else:
            current = np.stack([kept(h) for h in recorded])

        artifact, marker = f"{name}/residuals.npy", f"analysis/{name}/residuals"
        memory = self._memory[0] if self._memory and self._memory[1] == digest else None
        # In tandem the previous node is the previous validation's; beside another
        # analysis (a companion of `library/first`: a view of that job) as alone.
        store = self.store
        owner = self.trainer if self.borrowed else self  # type: ignore[attr-defined]
        tandem = not isinstance(owner, AnalysisBase)
        source = from_host_zero(
            lambda: earlier_source(
                store, node, artifact, marker, digest, memory, checkpoints=not tandem
            )
        )
        previous = None if source is None else self._read(source, program, batch)
        self._memory = (node, digest, current)

        at = self._reference_node()
        compared = None
        if at is not None:
            if at == node:
                compared = current
            elif self._reference_memory and self._reference_memory[:2] == (at, digest):
                compared = self._reference_memory[2]
            else:
                found = from_host_zero(lambda: node_source(store, at, artifact, marker, digest))
                if found is None:
                    raise AnalysisError(
                        f"{type(self).__name__}: the reference node {at} holds neither this "
                        "analysis's residuals for these tokens nor a checkpoint to recompute "
                        "them from; name a checkpointed node in library.drift.reference"
                    )
                compared = self._read(found, program, batch)
            self._reference_memory = (at, digest, compared)
        return {
            "node": node,
            "digest": digest,
            "residuals": current,
            "previous": None if source is None else source.node,
            "cka": None if previous is None else _cka_by_layer(current, previous),
            "reference": at,
            "cka_reference": None if compared is None else _cka_by_layer(current, compared),
        }

    def _publish(self, values: Any, node: Node) -> tuple[Path | None, Artifact | None, Any]:
        """Host zero: the residuals artifact, the values, then the plot (`NAME`)."""
        name = type(self).NAME
        content = to_bytes(values["residuals"])
        self.store.put(node, f"{name}/residuals.npy", "residuals.npy", content)
        # after the bytes: the marker says they are complete
        self.store.log(node, self.node_values(values))
        return super()._publish(values, node)

    @classmethod
    def node_values(cls, results: Any) -> dict[str, Any]:
        """The values `compute()`'s results leave on the node: `dynamics/cka/L{l}`,
        `dynamics/cka/previous` (and the reference's), `analysis/NAME/residuals`."""
        logged: dict[str, Any] = {f"analysis/{cls.NAME}/residuals": results["digest"]}
        for key, at, naming in _COMPARISONS:
            if results[key] is not None:
                for layer, value in enumerate(results[key]):
                    logged[f"dynamics/{key}/L{layer}"] = float(value)
                logged[f"dynamics/{key}/{naming}"] = results[at].serialize()
        return logged


class RepresentationDrift(DriftBase, PretrainGPT):
    """Representation drift: linear CKA of each layer's residual stream with the previous node's."""


def _cka_by_layer(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.shape[0] != b.shape[0]:
        raise AnalysisError(
            f"the compared node has {b.shape[0]} layers and this one {a.shape[0]}; CKA compares "
            "the residual streams of one architecture layer by layer"
        )
    return np.asarray([linear_cka(x, y) for x, y in zip(a, b, strict=True)])
