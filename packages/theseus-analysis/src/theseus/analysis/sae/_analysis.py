"""`SAEBase`: an analysis that trains sparse autoencoders on a site's activations.

`class MySAE(SAEBase, PretrainGPT)` with `TARGET`, `NAME` and `select` (one path, or a
list: one SAE per site) trains, on the node it runs at:

    warm the buffer (BUFFER forwards) -> start each SAE (the previous node's, else fresh)
        -> TOKENS tokens of steps, one compiled program each (`_stream.Programs.step`)
        -> held-out measures (val batches; loss recovered by splicing the reconstruction
           into the forward) -> top contexts of every feature (the inspection batch)
        -> match to the previous node's SAE -> values, SAELens files, features.json

It runs like any analysis: on one node (`MySAE(spec, base=node)()`), over a lineage
(`--over`: one instance walks the checkpoints, each SAE warm-started from the previous
node's, so the SAEs form a chain), and in tandem (`ANALYSIS = [MySAE]`: at each
validation the same SAEs go on training on the live model). Where the previous SAE is
not in memory (a skipped node, a resumed run) it is read back from the store: the
latest earlier node of the lineage whose SAE this configuration made.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import jax
import numpy as np
import optax

from theseus.analysis._base import AnalysisBase, C, M
from theseus.analysis._engine import Selection
from theseus.analysis._errors import AnalysisError
from theseus.analysis._publish import write_atomic
from theseus.analysis.sae._chain import previous_saes
from theseus.analysis.sae._match import match
from theseus.analysis.sae._model import SAEConfig
from theseus.analysis.sae._records import (
    MATCH,
    changes,
    features_document,
    plain,
)
from theseus.analysis.sae._saelens import saelens_files
from theseus.analysis.sae._settings import ATTRIBUTES, check, schema, segment
from theseus.analysis.sae._stream import Bank, Programs, activations, fold, unfold
from theseus.job import is_primary
from theseus.store import Artifact, Node
from theseus.training.reporting import Reporter, format_duration

__all__ = ["SAEBase"]


class SAEBase(AnalysisBase[C, M]):
    """Base of SAE analyses: `class MySAE(SAEBase, PretrainGPT)`.

    Declare `TARGET` and `NAME` and implement `select(paths)` (one path, or a list: an
    SAE bank per site) as for any analysis; the SAE reads the selected call's output.
    The settings are class attributes:

    - `ARCHITECTURE`: `"topk"` (the `K` largest), `"jumprelu"` (a learned threshold per
      feature, `L0` penalty) or `"relu"` (`L1` penalty scaled by decoder norms).
    - `WIDTH` (features; an int or a tuple: one SAE per width, all trained from one
      activation pass) or, when `WIDTH` is None, `EXPANSION` x the site's width.
    - `K`, `L1`, `L0`, `THRESHOLD`, `BANDWIDTH`: each architecture's sparsity. `K` is
      topk's active features per token and jumprelu's L0 target: its thresholds start
      where each feature fires on `K / width` of the buffer's tokens (at least
      `THRESHOLD`), then learn against the `L0` penalty (`BANDWIDTH` 0.05 and `L0` 1.0
      are SAELens 6's JumpReLU defaults, on activations scaled as SAELens scales them).
      `L1` = 1.0: Anthropic's 5.0 is for wide models; at d = 64 it keeps shrinking the
      features node after node.
    - `LEARNING_RATE` (Adam), `TOKENS` (tokens each SAE trains on at a node), `BUFFER`
      (forwards the shuffling buffer holds), `EVAL_BATCHES` (held-out `val` batches the
      measures read), `CONTEXTS` and `WINDOW` (top contexts kept per feature and the
      tokens shown around each), `SEED`.

    The SAEs train on the activations scaled so that their mean squared norm is the
    site's width (one `K` or penalty means the same at every checkpoint); what is
    measured and saved reads the raw activations.

    Attributes:
        compiles: how many times each compiled program was traced (1 each after any
            number of nodes of one shape).
    """

    ARCHITECTURE: ClassVar[str] = "topk"
    WIDTH: ClassVar[int | tuple[int, ...] | None] = None
    EXPANSION: ClassVar[int | tuple[int, ...]] = 8
    K: ClassVar[int] = 32
    L1: ClassVar[float] = 1.0
    L0: ClassVar[float] = 1.0
    THRESHOLD: ClassVar[float] = 1e-3
    BANDWIDTH: ClassVar[float] = 0.05
    LEARNING_RATE: ClassVar[float] = 1e-3
    TOKENS: ClassVar[int] = 1 << 18
    BUFFER: ClassVar[int] = 8
    EVAL_BATCHES: ClassVar[int] = 16
    CONTEXTS: ClassVar[int] = 8
    WINDOW: ClassVar[tuple[int, int]] = (12, 3)
    SEED: ClassVar[int] = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = [name for name in ATTRIBUTES if name in vars(cls)]
        if declared or "NAME" in vars(cls):
            check(cls, SAEBase)  # the schema is the only check of the class attributes
        if (declared or "NAME" in vars(cls)) and isinstance(getattr(cls, "NAME", None), str):
            cls.SETTINGS = (schema(cls),)

    def settings(self) -> Any:
        """The SAE settings as the configuration has them (`sae/<NAME>/...`: the class
        attributes, or what a YAML file or `key=value` set)."""
        return self.configure(type(self).SETTINGS[0])

    def _init_engine(self) -> None:
        super()._init_engine()
        self.compiles: dict[str, int] = {}
        self._sites: Bank | None = None  # every SAE's shape, built when the job sets up
        self._programs: Programs | None = None
        self._chain: dict[str, dict[str, Any]] = {}  # label -> the SAE trained last

    # ----------------------------------------------------------- the user's part
    def analyze(self, layer: Any, inputs: Any) -> Any:
        """Not used: an SAE analysis trains on the selected calls' outputs."""
        raise AnalysisError(f"{type(self).__name__} trains SAEs; it has no analyze() step")

    def plot(self, results: Any) -> Any:
        """What `NAME.json` (the node's `NAME` artifact) holds: each SAE's measures.

        Override to draw a figure of them instead; `results` is `{label: {measure: value}}`.
        """
        return results

    def result_digest(self) -> str:
        """The configuration's digest (the SAE settings are in it) with the selection."""
        text = json.dumps([super().result_digest(), list(self._prepare().paths)])
        return hashlib.sha256(text.encode()).hexdigest()

    # ------------------------------------------------------------------- engine
    def _count(self, program: str) -> None:
        self.compiles[program] = self.compiles.get(program, 0) + 1
        if program == "step":
            self.traces += 1

    def _prepare(self) -> Selection:
        """The selection, and every SAE's shape checked (a width below `k`, a site
        selected twice): at setup, or when a tandem view is made, before anything is written."""
        selection = super()._prepare()
        if self._sites is None:
            self._sites = self._bank(selection)
        return selection

    def _bank(self, selection: Selection) -> Bank:
        batch = self.inspection_batch()
        shapes = jax.eval_shape(
            lambda state, rows: activations(
                type(self).trace,  # type: ignore[attr-defined]
                selection.paths,
                self.sharding,
                type(self).__name__,
                state,
                rows,
            ),
            self.state,
            batch,
        )
        configs = []
        cls = type(self)
        st = self.settings()
        twice = sorted({p for p in selection.paths if selection.paths.count(p) > 1})
        if twice:
            raise AnalysisError(
                f"{cls.__name__}.select() returned {', '.join(map(repr, twice))} more than once; "
                "each site trains its SAEs once: return each path once"
            )
        for site in selection.paths:
            d = int(shapes[site].shape[-1])
            widths = list(st.width) or [e * d for e in st.expansion]  # one is set (a rule)
            row = []
            for width in dict.fromkeys(widths):
                try:
                    row.append(
                        SAEConfig(
                            d,
                            width,
                            st.architecture,
                            k=st.k,
                            l1=st.l1,
                            l0=st.l0,
                            threshold=st.threshold,
                            bandwidth=st.bandwidth,
                        )
                    )
                except ValueError as exc:
                    key = f"sae.{segment(cls.NAME)}"
                    raise AnalysisError(
                        f"{cls.__name__} at {site!r} (d = {d}): {exc} Set {key}.k, or "
                        f"{key}.width / {key}.expansion."
                    ) from None
            configs.append(tuple(row))
        return Bank(selection.paths, tuple(configs))

    def _sae_programs(self) -> Programs:
        if self._programs is None:
            st = self.settings()
            before, after = st.window
            self._prepare()
            assert self._sites is not None
            self._programs = Programs(
                type(self).trace,  # type: ignore[attr-defined]
                self._sites,
                optax.adam(st.lr),
                self.sharding,
                type(self).__name__,
                self._count,
                st.contexts,
                before,
                after,
            )
        return self._programs

    def _forwards(self) -> Iterator[dict[str, Any]]:
        """The training batches' micro-batches from the node's cursor on, placed."""
        every = self.accumulate_steps
        position = self.cursor
        while True:
            rows = self.read_batch(position)
            for micro in range(every):
                yield self.sharding.place_batch({k: v[micro::every] for k, v in rows.items()})
            position += 1

    def _held_out(self) -> Iterator[dict[str, Any]]:
        every = self.accumulate_steps
        for index in range(self.settings().eval_batches):
            rows = self.read_batch(index, "val")
            yield self.sharding.place_batch({k: v[0::every] for k, v in rows.items()})

    def compute(self) -> Any:
        """Train the SAEs on this node's activations, measure and match them.

        Every host must call it. Returns what `_publish` records (host arrays).
        """
        cls = type(self)
        st = self.settings()
        programs = self._sae_programs()
        bank = programs.bank
        node = self.node
        state = self.state
        digest = self.result_digest()
        label_of = bank.labels()
        began = time.perf_counter()

        forwards = self._forwards()
        first = next(forwards)
        lanes, length = (int(n) for n in first["x"].shape[:2])
        widths = [c[0].d_in for c in bank.configs]
        buffers = programs.empty(lanes, st.buffer * length, widths)
        for slot in range(st.buffer):
            batch = first if slot == 0 else next(forwards)
            buffers = programs.fill(buffers, state, batch, np.int32(slot))
        scales = {k: float(v) for k, v in jax.device_get(programs.scales(buffers)).items()}

        base = jax.random.PRNGKey(st.seed)
        fresh = programs.start(buffers, scales, base)
        previous = self._previous(node, digest, [label for *_, label in label_of])
        saes, opts, chained = [], [], {}
        fresh_opts = programs.init_optimizer(fresh)
        for i, site in enumerate(bank.sites):
            row_s, row_o = [], []
            for j, config in enumerate(bank.configs[i]):
                label = f"{site}/{config.width}"
                before = previous.get(label)
                if before is None:
                    row_s.append(fresh[i][j])
                    row_o.append(fresh_opts[i][j])
                    continue
                chained[label] = before
                # the features carry over; the decoder bias moves to this node's mean
                # (early in training the activations' mean moves far more than their
                # spread, and a bias left behind would be all the SAE reconstructs)
                inner = {
                    **unfold(before["params"], scales[site], config),
                    "b_dec": fresh[i][j]["b_dec"],
                }
                row_s.append(jax.device_put(inner, self.sharding.replicated()))
                # Adam starts afresh at every node: its moments belong to the previous
                # node's scale and parametrization (`unfold` renormalizes the decoder),
                # and a chain read back from the store has none, so a walk in memory and
                # a new process train the same SAEs
                row_o.append(fresh_opts[i][j])
            saes.append(row_s)
            opts.append(row_o)

        per_forward = lanes * length
        steps = max(1, math.ceil(st.tokens / per_forward))
        label = f"{cls.NAME} at {node.serialize()}"
        reporter = Reporter(
            steps,
            0,
            per_forward,
            label,
            enabled=False,  # lines, never a second bar: a walk's or a trainer's may be live
        )
        every = max(1, steps // 4)
        node_key = jax.random.fold_in(jax.random.fold_in(base, 1), node.seq)
        metrics: Any = None
        fired = programs.unfired()
        try:
            for step in range(steps):
                saes, opts, buffers, fired, metrics = programs.step(
                    saes,
                    opts,
                    buffers,
                    fired,
                    state,
                    next(forwards),
                    jax.random.fold_in(node_key, step),
                    scales,
                )
                if (step + 1) % every == 0 or step + 1 == steps:
                    host = jax.device_get(metrics)
                    mse = float(np.mean([m["mse"] for row in host for m in row]))
                    if is_primary() and not self.borrowed:
                        reporter.report(step + 1, mse, reporter.throughput(step + 1))
        finally:
            reporter.close()
        train_seconds = time.perf_counter() - began
        del buffers

        folded = [
            [fold(saes[i][j], scales[site]) for j in range(len(bank.configs[i]))]
            for i, site in enumerate(bank.sites)
        ]
        sums: Any = None
        for batch in self._held_out():
            got = jax.device_get(programs.evaluate(folded, state, batch))
            sums = got if sums is None else jax.tree.map(_combine, sums, got)
        batches = st.eval_batches
        found = jax.device_get(programs.contexts(folded, state, self.inspection_batch()))
        host_params = jax.device_get(folded)
        final = jax.device_get(metrics)
        trained = jax.device_get(fired)

        out: dict[str, Any] = {"node": node, "digest": digest, "ids": found["ids"], "saes": {}}
        for i, j, sae in label_of:
            config = bank.configs[i][j]
            site_sums = sums["sites"][i]
            mine = site_sums["saes"][j]
            count = float(site_sums["count"])
            variance = float(np.sum(site_sums["squares"] - site_sums["sum"] ** 2 / count))
            clean = float(sums["clean"]) / batches
            zeroed = float(site_sums["zeroed"]) / batches
            spliced = float(mine["spliced"]) / batches
            measures: dict[str, Any] = {
                "l0": float(mine["active"]) / count,
                "fvu": float(mine["error"]) / variance if variance > 0 else float("nan"),
                "dead": float(np.mean(~mine["fired"])),
                "dead_training": float(np.mean(~trained[i][j])),
                "loss_clean": clean,
                "loss_zeroed": zeroed,
                "loss_spliced": spliced,
                "loss_recovered": (zeroed - spliced) / (zeroed - clean)
                if zeroed != clean
                else float("nan"),
                "tokens": steps * per_forward,
                "train_mse": float(final[i][j]["mse"]),
                "scale": scales[bank.sites[i]],
            }
            params = {k: np.asarray(v) for k, v in host_params[i][j].items()}
            before = chained.get(sae)
            alive = np.asarray(trained[i][j], bool)
            pairing = None
            measures.update(matched=None, born=None, gone=None)  # no previous SAE: none
            if before is not None:
                pairing = match(np.asarray(before["params"]["W_dec"]), params["W_dec"], MATCH)
                measures.update(changes(pairing, before.get("alive"), alive))
            out["saes"][sae] = {
                "site": bank.sites[i],
                "config": config,
                "params": params,
                "measures": measures,
                "previous": None if before is None else before["node"],
                "match": pairing,
                "contexts": found["saes"][i][j],
            }
            out["saes"][sae]["alive"] = alive
            self._chain[sae] = {"node": node, "params": params, "alive": alive}
        out["seconds"] = time.perf_counter() - began
        out["train_seconds"] = train_seconds
        return out

    def _previous(self, node: Node, digest: str, labels: list[str]) -> dict[str, dict[str, Any]]:
        """Each SAE's previous one, from memory or the store (`_chain.previous_saes`)."""
        return previous_saes(self.store, type(self).NAME, node, digest, labels, self._chain)

    # --------------------------------------------------------------- recording
    def _publish(self, values: Any, node: Node) -> tuple[Path | None, Artifact | None, Any]:
        """Host zero: each SAE's values, SAELens files and features.json, then the
        summary artifact `NAME` and the configuration stamp (last: a crash before
        them, `AnalysisBase._publish` of the measures: a crash before them leaves the
        node to be computed again)."""
        cls = type(self)
        name = cls.NAME
        store = self.store
        summary: dict[str, dict[str, Any]] = {}
        logged: dict[str, Any] = {f"sae/{name}/config": values["digest"]}
        tokenizer = self.tokenizer
        for label, sae in values["saes"].items():
            measures = sae["measures"]
            summary[label] = {k: plain(v) for k, v in measures.items()}
            for key, value in measures.items():
                logged[f"sae/{name}/{label}/{key}"] = plain(value)
            config: SAEConfig = sae["config"]
            files = saelens_files(
                sae["params"],
                config,
                hook_name=sae["site"],
                model_name=node.name,
                context_size=int(values["ids"].shape[1]),
            )
            files["features.json"] = json.dumps(
                features_document(
                    values, label, sae, name, tokenizer, tuple(self.settings().window)
                ),
                separators=(",", ":"),
            ).encode()
            folder = self.spec.result(name, *label.split("/"))
            for filename, content in files.items():
                write_atomic(folder / filename, content)
                store.put(node, f"{name}/{label}/{filename}", filename, content)
        store.log(node, logged)
        path, artifact, figure = super()._publish(summary, node)  # NAME, its stamp, Comet
        if artifact is None:
            return path, artifact, figure
        if is_primary() and not self.borrowed:
            lines = [
                f"{label}: L0 {m['l0']:.1f}, FVU {m['fvu']:.3f}, dead {m['dead']:.1%}, "
                f"loss recovered {m['loss_recovered']:.3f}"
                + (f", matched {m['matched']:.1%}" if m.get("matched") is not None else "")
                for label, m in summary.items()
            ]
            took = format_duration(values["seconds"])
            print(f"{name} at {node.serialize()} ({took}): " + "; ".join(lines), flush=True)
        return path, artifact, figure


def _combine(a: Any, b: Any) -> Any:
    """Two held-out batches' sums: booleans (fired) or-ed, numbers added."""
    if isinstance(a, np.ndarray) and a.dtype == bool:
        return a | b
    return a + b
