"""`LibraryBase` and `LibraryAnalysis`: the library's analyses and their shared forward.

Each library analysis is an ordinary analysis (`class A(LibraryAnalysis, PretrainGPT)`:
in tandem, on one checkpoint, `--over` a lineage) whose measurement is split into pure
parts, so that several can share one forward:

    prepare(job) -> aux                 host, once per instance (settings, data tables)
    measure(aux, recording) -> sums     under jit, on one recorded forward (`Recording`)
    summarize(aux, sums) -> results     host; sums added over the validation batches
    values(results) -> {key: float}     the values written on the node (`dynamics/...`)
    figure(results) -> Figure           the artifact NAME (a PDF)

`LibraryBase` is the engine of a set of them (`members()`): one compiled program per
instance, `fn(state, batches, key)`, runs the trainer's `trace` once on the repeated
random tokens (for the members whose `DATA` is `"repeated"`) and once per validation
batch inside one `lax.map` (for those whose `DATA` is `"validation"`), hands each
member the same `Recording`, and sums the validation members' results over the batches.
An analysis alone is a set of one; `FirstAnalyses` is a set of several, so a walk over
a lineage with it runs one forward per batch kind at each node and compiles once.

A set may also run *companions* (`companions()`): the library's analyses with programs
of their own (`DriftBase`, `MemorizationBase`), each a view of the same trainer (or of
this job, on a checkpoint and over a lineage: `from_trainer`), computed on the same
state at each node after the members and published as they publish alone. So one walk
reads each checkpoint once for all of them.

A set of two or more other members draws their figures in worker processes
(`theseus.analysis._renderers`, where the machine has the cores), while this process
publishes the companions; the PDFs are the same bytes.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from theseus.analysis import _comet
from theseus.analysis._base import AnalysisBase, C, M
from theseus.analysis._engine import compile_program, to_host
from theseus.analysis._errors import AnalysisError
from theseus.analysis._publish import write_atomic
from theseus.analysis._renderers import Renderers, default_workers
from theseus.analysis.library._data import open_plan, repeated_tokens, token_shares
from theseus.analysis.library._recording import Recording, record
from theseus.analysis.library._residuals import at_positions
from theseus.analysis.library._settings import (
    DataSettings,
    InductionSettings,
    ValidationSettings,
)
from theseus.analysis.library._shared import DRIFT, SharedDrift, shared_drift
from theseus.cli._next import program
from theseus.data.batches import MixturePlan
from theseus.job import process_count, process_index, store_root
from theseus.model.attention.base import SelfAttention
from theseus.model.models import Block
from theseus.store import Artifact, Node

__all__ = ["DATA_KINDS", "LibraryAnalysis", "LibraryBase"]

log = logging.getLogger("theseus.analysis")

#: What a member's `DATA` may be: the repeated random tokens, or validation batches.
DATA_KINDS = ("repeated", "validation")


class LibraryBase(AnalysisBase[C, M]):
    """The engine of a set of library analyses (see the module docstring).

    Subclasses say which analyses run (`members()`); each member's values go on the
    node and its figure becomes its own artifact (`member.NAME`). `traces` counts the
    traces of the one compiled program.
    """

    TARGET = Block  # the blocks' calls: the residual stream

    if TYPE_CHECKING:  # provided by the trainer this analysis extends (or its view)
        DATASET: ClassVar[Any]

        @property
        def block_size(self) -> int: ...
        def batch_geometry(self) -> dict[str, int]: ...

    def members(self) -> tuple[type[LibraryAnalysis[Any, Any]], ...]:
        """The analyses this job runs in one program (their classes)."""
        raise NotImplementedError

    def companions(self) -> tuple[type[AnalysisBase[Any, Any]], ...]:
        """The analyses with programs of their own this job also runs at each node (see
        the module docstring); none by default."""
        return ()

    def _companion_views(self) -> dict[str, AnalysisBase[Any, Any]]:
        """Each companion by its `NAME`: a view of the trainer in tandem, else of this
        job (so it reads the walked node's state), made once per instance."""
        if "companions" not in self._library:
            owner: Any = self.trainer if self.borrowed else self  # type: ignore[attr-defined]
            self._library["companions"] = {c.NAME: c.from_trainer(owner) for c in self.companions()}
        views: dict[str, AnalysisBase[Any, Any]] = self._library["companions"]
        return views

    # ------------------------------------------------------------ AnalysisBase
    def select(self, paths: list[str]) -> list[str]:
        """Every block, in call order."""
        return list(paths)

    def analyze(self, layer: Any, inputs: Any) -> Any:
        """Not used: the library's analyses measure a recorded forward (`measure`)."""
        raise AnalysisError(
            f"{type(self).__name__} measures a recorded forward; it has no analyze()"
        )

    def _init_engine(self) -> None:
        super()._init_engine()
        self._library: dict[str, Any] = {}  # aux, program, plan, batches: made once

    def data_required(self, mode: Any) -> bool:
        """Never at setup: the repeated tokens need no data, and the validation analyses
        open theirs (`library/dataset` or the trainer's) when they first read it, with
        the command that prepares it when it is missing."""
        return False

    def _prepare(self) -> Any:
        """Discover the blocks (`select`), and the attention layers where a member reads
        their probabilities (at setup, so the program's trace is the only later one)."""
        selection = super()._prepare()
        if "attentions" not in self._library:
            reads = {r for m in self.members() for r in m.READS}
            found = self.find(SelfAttention) if "attention" in reads else []
            self._library["attentions"] = tuple(found)
        return selection

    def inspection_batch(self) -> dict[str, Any]:
        """The repeated random tokens, placed (what discovery traces: no data is read)."""
        return self.sharding.place_batch(self.repeated_batch())

    # --------------------------------------------------------------------- data
    def repeated_batch(self) -> dict[str, Any]:
        """This host's rows of the repeated random tokens: `x [rows, 2 * length]` (host
        arrays; `library/induction/*` settings, the length clipped to half the block and
        the rows rounded up to a multiple of the data-parallel devices; their defaults
        for a set that reads no repeated tokens, whose discovery traces them)."""
        reads = any(m.DATA == "repeated" for m in self.members())
        st = self.configure(InductionSettings) if reads else InductionSettings()
        length = min(st.length, self.block_size // 2)
        if length < 2:
            raise AnalysisError(
                f"{type(self).__name__}: architecture/block_size = {self.block_size} leaves no "
                "room for two halves of at least 2 tokens; the induction scores need a block "
                "of 4 or more"
            )
        devices = int(self.sharding.mesh.shape["batch"])
        rows = -(-st.rows // devices) * devices
        vocab = min(int(self.configuration["architecture/vocab_size"]), self.tokenizer.vocab_size)
        if st.tokens == "data":
            ids = np.flatnonzero(self.token_shares()[:vocab] > 0)
            if ids.size == 0:
                raise AnalysisError(
                    f"{type(self).__name__}: library/induction/tokens = data, but the training "
                    "data uses no id below the vocabulary; set library/induction/tokens=vocabulary"
                )
        else:
            ids = np.arange(vocab)
        whole = repeated_tokens(ids, rows, length, st.seed)
        geometry = self.batch_geometry()
        per = rows // geometry["n_hosts"]
        mine = slice(geometry["host"] * per, (geometry["host"] + 1) * per)
        return {key: value[mine] for key, value in whole.items()}

    def validation_plan(self) -> MixturePlan:
        """The batch plan the validation analyses read (`library/dataset`, or the
        trainer's own data), opened once."""
        if "plan" not in self._library:
            st = self.configure(DataSettings)  # declared by every schema that reads data
            if st.dataset:
                from theseus.registry import DATASETS

                declaration: Any = DATASETS[st.dataset]
            else:
                owner: Any = self.trainer if self.borrowed else self  # type: ignore[attr-defined]
                declaration = type(owner).DATASET
            self._library["plan"] = open_plan(
                declaration,
                self.spec.root,
                int(self.configuration["data/seed"]),
                self.configuration.get("architecture/tokenizer"),
                type(self).__name__,
            )
        plan: MixturePlan = self._library["plan"]
        return plan

    def token_shares(self) -> np.ndarray:
        """Each token id's share of the training data `[architecture/vocab_size]` (the
        validation analyses' data: `library/dataset` or the trainer's), counted once."""
        if "shares" not in self._library:
            vocab = int(self.configuration["architecture/vocab_size"])
            self._library["shares"] = token_shares(self.validation_plan(), vocab)
        shares: np.ndarray = self._library["shares"]
        return shares

    def validation_batches(self) -> list[dict[str, Any]]:
        """The `library/batches` validation batches, this host's rows (the first
        micro-batch of each under gradient accumulation): the batches `validate()`
        reads first, from the same plan and seed."""
        st = self.configure(ValidationSettings)
        plan, every = self.validation_plan(), self.accumulate_steps
        batches = []
        for index in range(st.batches):
            rows = plan.batch(index, "val", **self.batch_geometry())
            batches.append({key: value[::every] for key, value in rows.items()})
        return batches

    # ------------------------------------------------------------------ compute
    def _aux(self) -> dict[str, Any]:
        """Each member's `prepare(self)`, made once per instance."""
        if "aux" not in self._library:
            self._library["aux"] = {m.NAME: m.prepare(self) for m in self.members()}
        aux: dict[str, Any] = self._library["aux"]
        return aux

    def _program(self) -> Any:
        """`fn(state, batches, key) -> {member NAME: sums}`, compiled once per instance."""
        if "program" not in self._library:
            members, aux = self.members(), self._aux()
            owner, sharding = type(self).__name__, self.sharding
            trace = type(self).trace  # type: ignore[attr-defined]
            blocks, attentions = self._prepare().paths, self._library["attentions"]
            groups = {kind: [m for m in members if kind == m.DATA] for kind in DATA_KINDS}

            def measured(
                group: Sequence[type[LibraryAnalysis[Any, Any]]], state: Any, batch: Any
            ) -> Any:
                seen = record(trace, state, batch, sharding, blocks, attentions, owner)
                return {m.NAME: m.measure(aux[m.NAME], seen) for m in group}

            drift = self._shared_drift()

            def validation(state: Any, batch: Any, index: jax.Array) -> Any:
                seen = record(trace, state, batch, sharding, blocks, attentions, owner)
                out = {m.NAME: m.measure(aux[m.NAME], seen) for m in groups["validation"]}
                if drift is not None and drift.first:  # summed over the batches: batch 0's
                    streams = at_positions(seen.calls, drift.paths, drift.chosen)
                    out[DRIFT] = jnp.where(index == 0, streams, 0.0)
                return out

            def body(state: Any, batches: dict[str, Any], key: Any) -> Any:
                out: dict[str, Any] = {}
                if groups["repeated"]:
                    out.update(measured(groups["repeated"], state, batches["repeated"]))
                if groups["validation"]:
                    stacked = jax.tree.map(lambda *a: jnp.stack(a), *batches["validation"])
                    indices = jnp.arange(len(batches["validation"]))
                    each = jax.lax.map(lambda a: validation(state, *a), (stacked, indices))
                    out.update(jax.tree.map(lambda a: a.sum(axis=0), each))
                if drift is not None and not drift.first:
                    seen = record(trace, state, batches[DRIFT], sharding, blocks, (), owner)
                    out[DRIFT] = at_positions(seen.calls, drift.paths, drift.chosen)
                return out

            def count() -> None:
                self.traces += 1

            self._library["program"] = compile_program(body, sharding, owner, on_trace=count)
        return self._library["program"]

    def _placed_batches(self) -> dict[str, Any]:
        """The program's batches: the repeated tokens and the validation batches, placed
        once (the same at every node)."""
        if "batches" not in self._library:
            kinds = {m.DATA for m in self.members()}
            place = self.sharding.place_batch
            batches: dict[str, Any] = {}
            if "repeated" in kinds:
                batches["repeated"] = place(self.repeated_batch())
            if "validation" in kinds:
                batches["validation"] = tuple(place(b) for b in self.validation_batches())
            drift = self._shared_drift()
            if drift is not None and not drift.first:
                batches[DRIFT] = drift.batch
            self._library["batches"] = batches
        return dict(self._library["batches"])

    def compute(self) -> Any:
        """Run the set's program on the live state: each member's results by its NAME
        (an analysis alone: its own results), and each companion's. On one host the
        companions run on threads of their own meanwhile (their programs compile and run
        beside the set's); on several, after it, in one order on every host.

        Every host must call it (the results are gathered across hosts).
        """
        aux = self._aux()
        self._renderers()  # started now, they import while the program runs
        views = self._companion_views()
        drift = self._shared_drift()
        shared = drift.name if drift is not None else None
        alone = process_count() == 1  # several hosts must launch programs in one order
        with ThreadPoolExecutor(max(1, len(views)), "theseus-companion") as pool:
            running = {
                name: pool.submit(view.compute)
                for name, view in views.items()
                if alone and name != shared
            }
            sums = to_host(self._program()(self.state, self._placed_batches(), None))
            results = {m.NAME: m.summarize(aux[m.NAME], sums[m.NAME]) for m in self.members()}
            for name, view in views.items():
                if drift is not None and name == shared:
                    results[name] = drift.view.compute_from(sums[DRIFT])
                else:
                    results[name] = running[name].result() if alone else view.compute()
        return self._gathered(results)

    def _shared_drift(self) -> SharedDrift | None:
        """The drift companion whose residual streams this set's program records
        (`_shared.shared_drift`), decided once per instance."""
        if "drift" not in self._library:
            validation = any(m.DATA == "validation" for m in self.members())
            self._library["drift"] = shared_drift(
                self._companion_views(),
                tuple(self._prepare().paths),
                self.validation_batches()[0] if validation else None,
            )
        drift: SharedDrift | None = self._library["drift"]
        return drift

    def _gathered(self, by_name: dict[str, Any]) -> Any:
        """What `compute()` returns of each member's results (a set: all of them)."""
        return by_name

    def _by_name(self, values: Any) -> dict[str, Any]:
        """Each member's results from what `compute()` returned."""
        return dict(values)

    # ------------------------------------------------------------------ publish
    def _publish(self, values: Any, node: Node) -> tuple[Path | None, Artifact | None, Any]:
        """Host zero: every member's values on the node, each other member's figure as
        its own artifact, each companion's result as it publishes it alone, then this
        job's own result (`plot`) and stamp."""
        by_name = self._by_name(values)
        logged: dict[str, Any] = {}
        for member in self.members():
            logged.update(member.values(by_name[member.NAME]))
        self.store.log(node, logged)
        renderers = self._renderers()
        drawn = [
            (m, renderers.draw(m, "figure", by_name[m.NAME], m.NAME, m.__name__))
            for m in self.members()
            if m.NAME != self.NAME
        ]
        views = self._companion_views()
        for name, view in views.items():
            drawing = _figure_class(type(view))
            if drawing is not None and renderers.count:  # read by the view's `_publish`
                owner = type(view).__name__
                view._drawn = renderers.draw(drawing, "figure", by_name[name], name, owner)  # type: ignore[attr-defined]
        for name, view in views.items():  # while the workers draw
            try:
                view._publish(by_name[name], node)
            finally:
                view.__dict__.pop("_drawn", None)  # never a later node's
        for member, figure in drawn:
            self._publish_member(member, figure(), node)
        return super()._publish(values, node)

    def _renderers(self) -> Renderers:
        """What draws the figures: worker processes on host zero for a set of two or
        more other members, where `default_workers()` gives any (else none: drawn
        here); started once."""
        if "renderers" not in self._library:
            others = [m for m in self.members() if m.NAME != self.NAME]
            count = min(default_workers(), len(others)) if len(others) > 1 else 0
            self._library["renderers"] = Renderers(count if process_index() == 0 else 0)
        renderers: Renderers = self._library["renderers"]
        return renderers

    def __call__(self, resume: bool = False) -> Any:
        """Run (see `AnalysisBase.__call__`), then stop the drawing workers."""
        try:
            return super().__call__(resume)
        finally:
            renderers = self._library.pop("renderers", None)
            if renderers is not None:
                renderers.close()

    def outcome(self, result: Any) -> list[str]:
        """`theseus run`'s lines, and what else each node holds: every member's artifact
        and values."""
        lines = super().outcome(result)
        others = [m.NAME for m in self.members() if m.NAME != self.NAME]
        others += [c.NAME for c in self.companions()]
        # the node analyzed last: a walk's last node, or the one node
        last = result.nodes[-1] if getattr(result, "nodes", None) else getattr(result, "node", None)
        if others and last is not None:
            store = shlex.quote(str(store_root(self.spec.root)))
            cli = program("theseus-store")
            lines.append(
                f"  each node also holds the artifacts {', '.join(others)} (PDF) and their "
                f"values dynamics/... (the last: {cli} show {store} {shlex.quote(str(last))}; "
                f"curves over training: {cli} ui {shlex.quote(str(self.spec.root))})"
            )
        return lines

    def _publish_member(
        self,
        member: type[LibraryAnalysis[Any, Any]],
        rendered: tuple[str, bytes] | None,
        node: Node,
    ) -> None:
        if rendered is None:
            return
        filename, content = rendered
        write_atomic(self.spec.result(filename), content)
        self.store.put(node, member.NAME, filename, content)
        try:
            _comet.publish(self.configuration, node, member.NAME, filename, content)
        except Exception as exc:  # the file and the artifact are saved; Comet is a copy
            log.warning("%s: %s not sent to Comet: %s", type(self).__name__, member.NAME, exc)


def _figure_class(kind: type) -> type | None:
    """The class defining `kind`'s `figure` classmethod when `kind.plot` is that class's
    `plot` (no subclass changed `plot`, so a worker may draw `figure` in its place), else
    None. A view's class (`from_trainer`) is made at run time; the class with the figure
    is one a worker can import."""

    def owner(name: str) -> type | None:
        return next((c for c in kind.__mro__ if name in vars(c)), None)

    drawing = owner("figure")
    return drawing if drawing is not None and owner("plot") is drawing else None


class LibraryAnalysis(LibraryBase[C, M]):
    """One library analysis: a set of itself. Declare `NAME`, `DATA` (`"repeated"` or
    `"validation"`), `READS` (what of the forward it reads besides the logits:
    `"attention"`, `"residual"`), `SETTINGS`, and the pure parts."""

    DATA: ClassVar[str]
    READS: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        data = vars(cls).get("DATA")
        if data is not None and data not in DATA_KINDS:
            raise TypeError(f"{cls.__name__}.DATA = {data!r}; use one of {', '.join(DATA_KINDS)}")

    def members(self) -> tuple[type[LibraryAnalysis[Any, Any]], ...]:
        """This analysis alone."""
        return (type(self),)

    def plot(self, results: Any) -> Any:
        """This analysis's figure (`figure(results)`)."""
        return self.figure(results)

    def _gathered(self, by_name: dict[str, Any]) -> Any:
        return by_name[self.NAME]

    def _by_name(self, values: Any) -> dict[str, Any]:
        return {self.NAME: values}

    @classmethod
    def prepare(cls, job: Any) -> Any:
        """What `measure` and `summarize` read besides the forward (host, once): settings,
        tables made from the data. `job` is the analysis job or view running it."""
        return None

    @classmethod
    def measure(cls, aux: Any, recording: Recording) -> Any:
        """Under jit: a pytree of arrays from one recorded forward. A validation
        member's leaves are sums, added over the validation batches."""
        raise NotImplementedError

    @classmethod
    def summarize(cls, aux: Any, sums: Any) -> Any:
        """Host: the results (NumPy in) from the summed measures."""
        raise NotImplementedError

    @classmethod
    def values(cls, results: Any) -> dict[str, float]:
        """The values recorded on the node, `{"dynamics/...": number}` (finite ones)."""
        raise NotImplementedError

    @classmethod
    def figure(cls, results: Any) -> Any:
        """The Figure saved as `NAME.pdf` and the node's artifact `NAME` (host zero)."""
        raise NotImplementedError
