"""The library's representation drift and memorization: in tandem, over a lineage, and
what they refuse (the default suite's share; `test_memorization_planted.py` is the slow one).

One lineage is trained for the module: the tiny GPT of `analysis_jobs.py` on the
synthetic language, four steps, a checkpoint at every node (0..3), both analyses in
tandem at each validation (1, 3). Beside `library/first` (its companions) each writes
what it writes walked alone, exactly, in one walk that compiles only at its first node.

References, none of them the analysis engine:
- the batches: the data plan's draw of contiguous windows (`pmd`) for one source,
  rewritten here with NumPy (`windows`), over the prepared token stream;
- drift: every block's output recorded by Flax's `capture_intermediates` from each
  checkpoint's parameters, and linear CKA written here in float64 NumPy; 2e-3 absolute
  (the analysis keeps residuals in float16);
- memorization: each sequence's verdict (memorized, and the tokens reproduced before the
  first miss) against greedy decoding with the key-value cache (`generate`), and each
  position against the argmax of one uncached forward of the whole sequence in float64.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from click.testing import CliRunner

from theseus.analysis import AnalysisError
from theseus.analysis.library import FirstAnalyses, Memorization, RepresentationDrift
from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.data.prepared import PreparedData
from theseus.model.generation import generate
from theseus.model.models import Block
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

jobs = import_module_or_file(str(Path(__file__).parents[1] / "analysis_jobs.py"))
lj = import_module_or_file(str(Path(__file__).with_name("planted_jobs.py")))
walks = import_module_or_file(str(Path(__file__).with_name("walks.py")))

STEPS = 4
BLOCK = 32  # analysis_jobs.TINY
ROWS = 8
MEMORIZATION = {
    "library/memorization/sequences": 16,
    "library/memorization/prefix": 8,
    "library/memorization/continuation": 8,
    "library/memorization/batch": 16,
}


class Trained(jobs.PretrainGPT):
    """The tiny GPT with both library analyses in tandem."""

    ANALYSIS = [RepresentationDrift, Memorization]


def windows(root: Path, step: int, split: str, seed: int = 0) -> np.ndarray:
    """The rows `[ROWS, BLOCK]` the plan gives `step`: one source's contiguous windows."""
    tokens = np.asarray(PreparedData.open(root, "synthetic").tokens(split))
    own = np.random.default_rng([seed, step, {"train": 0, "val": 1}[split], 1])
    starts = own.integers(0, tokens.size - BLOCK - 1 + 1, size=ROWS)
    return np.stack([tokens[s : s + BLOCK] for s in starts]).astype(np.int32)


def numpy_cka(x: np.ndarray, y: np.ndarray) -> float:
    x = np.asarray(x, np.float64) - np.mean(x, axis=0, dtype=np.float64)
    y = np.asarray(y, np.float64) - np.mean(y, axis=0, dtype=np.float64)
    cross = np.linalg.norm(y.T @ x) ** 2
    return float(cross / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Node]]:
    root = tmp_path_factory.mktemp("library")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(Trained, "trained")
        jobs.tiny(q.config, steps=STEPS, **MEMORIZATION, **{"logging/checkpoint_interval": 1})
        q.create()()
    with Store(root / "store") as store:
        nodes = sorted({c.node for c in store.query().spec(run="trained").checkpoints()})
    assert [n.seq for n in nodes] == list(range(STEPS))
    return root, nodes


@pytest.fixture
def root(trained: tuple[Path, list[Node]], tmp_path: Path) -> Path:
    copy = tmp_path / "root"
    shutil.copytree(trained[0], copy)
    return copy


def _snapshot(root: Path) -> dict[str, object]:
    return walks.snapshot(root)


def _walk(root: Path, cls: type, **settings: object):  # type: ignore[no-untyped-def]
    return walks.walk(root, "trained", cls, **settings)


@pytest.fixture(scope="module")
def alone(trained: tuple[Path, list[Node]], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Drift (against the first node too) and memorization, each walked alone over the
    lineage in a copy of the root: `(root, (job, walk) of drift, (job, walk) of
    memorization)`."""
    root = tmp_path_factory.mktemp("alone") / "root"
    shutil.copytree(trained[0], root)
    reference = {"library/drift/reference": trained[1][0].serialize()}
    return root, _walk(root, RepresentationDrift, **reference), _walk(root, Memorization)


def test_in_tandem_each_validation_compares_with_the_previous_and_tests_what_was_seen(
    trained: tuple[Path, list[Node]],
) -> None:
    root, nodes = trained
    with Store(root / "store") as store:
        at = {n.seq: store.values(n) for n in nodes}
        held = store.get(nodes[3])
    assert "dynamics/cka/L0" not in at[1] and "analysis/drift/residuals" in at[1]  # the first
    assert at[3]["dynamics/cka/previous"] == nodes[1].serialize()  # the previous validation
    assert all(0.0 < at[3][f"dynamics/cka/L{layer}"] <= 1.0 + 1e-9 for layer in (0, 1))
    assert not any(k.startswith("dynamics/") for k in at[0] | at[2])  # no validation there
    assert at[3]["dynamics/memorization/first_step"] == 0
    assert at[3]["dynamics/memorization/last_step"] == 3
    assert at[1]["dynamics/memorization/sequences"] == 16  # of the 16 rows of steps 0 and 1
    assert {"drift/residuals.npy", "memorization/sequences.json"} <= set(held)
    assert held["drift"].filename == "drift.pdf"
    assert held["memorization"].filename == "memorization.pdf"


def test_drift_over_the_lineage_is_linear_cka_of_the_recorded_residual_streams(
    trained: tuple[Path, list[Node]], alone: Any
) -> None:
    _, nodes = trained
    reference = nodes[0].serialize()
    root, (job, walk), _ = alone
    assert job.traces == 1 and [r.node for r in walk.results] == nodes
    batch = windows(root, 0, "val")
    streams = []
    for node in nodes:
        params = job.read_checkpoint(job.checkpoint_path(node))[0].params
        _, recorded = job.model.apply(
            {"params": params},
            batch,
            capture_intermediates=lambda module, _: isinstance(module, Block),
            mutable=["intermediates"],
        )
        blocks = recorded["intermediates"]
        outputs = [blocks[f"blocks_{i}"]["__call__"][0] for i in (0, 1)]
        streams.append([np.asarray(h).reshape(-1, 32) for h in outputs])
    with Store(root / "store") as store:
        at = [store.values(n) for n in nodes]
    assert "dynamics/cka/L0" not in at[0]  # the walk's first node: nothing before it
    itself = [at[0][f"dynamics/cka_reference/L{i}"] for i in (0, 1)]
    assert itself == pytest.approx([1.0, 1.0], abs=1e-9)
    for seq in (1, 2, 3):
        assert at[seq]["dynamics/cka/previous"] == nodes[seq - 1].serialize()
        assert at[seq]["dynamics/cka_reference/node"] == reference
        for i in (0, 1):
            expected = numpy_cka(streams[seq][i], streams[seq - 1][i])
            assert at[seq][f"dynamics/cka/L{i}"] == pytest.approx(expected, abs=2e-3)
            against = numpy_cka(streams[seq][i], streams[0][i])
            assert at[seq][f"dynamics/cka_reference/L{i}"] == pytest.approx(against, abs=2e-3)

    before = _snapshot(root)
    _, again = _walk(root, RepresentationDrift, **{"library/drift/reference": reference})
    assert again.results == [] and again.skipped == nodes
    assert _snapshot(root) == before  # a second walk writes nothing


def test_memorization_over_the_lineage_replays_the_rows_the_plan_gave_each_step(
    trained: tuple[Path, list[Node]], alone: Any
) -> None:
    _, nodes = trained
    root, _, (job, walk) = alone
    for result in walk.results:
        values = result.values
        steps, rows = values["step"], values["row"]
        seen = result.node.seq + 1
        assert steps.size == min(16, ROWS * seen) and (steps < seen).all()
        assert len(set(zip(steps.tolist(), rows.tolist(), strict=True))) == steps.size
        drawn = zip(steps.tolist(), rows.tolist(), strict=True)
        expected = np.stack([windows(root, s, "train")[r, :16] for s, r in drawn])
        np.testing.assert_array_equal(values["tokens"], expected)
        top = values["top"]
        np.testing.assert_array_equal(values["memorized"], top.all(axis=1))
        np.testing.assert_allclose(values["accuracy"], top.mean(axis=1))
        np.testing.assert_allclose(values["extracted"], np.cumprod(top, axis=1).sum(axis=1) / 8)
    last = walk.results[-1]
    with Store(root / "store") as store:
        document = json.loads(store.get(last.node)["memorization/sequences.json"].content)
        share = store.values(last.node)["dynamics/memorization/share"]
    assert [(s["step"], s["row"]) for s in document["sequences"]] == list(
        zip(last.values["step"].tolist(), last.values["row"].tolist(), strict=True)
    )
    assert share == pytest.approx(float(last.values["memorized"].mean()))

    # the last node's verdicts against greedy decoding with the key-value cache
    tokens, top = last.values["tokens"], last.values["top"]
    vocab = job.model.config.vocab_size
    decoded = np.asarray(
        generate(job.model, job.state.params, tokens[:, :8].tolist(), 8, temperature=0.0,
                 vocab=vocab, cache_slots=16)
    )  # fmt: skip
    same = decoded == tokens[:, 8:]
    np.testing.assert_array_equal(top.all(axis=1), same.all(axis=1))
    np.testing.assert_array_equal(np.cumprod(top, axis=1), np.cumprod(same, axis=1))
    # and each position against the argmax of an uncached forward of the whole sequence
    logits, _ = job.model.apply({"params": job.state.params}, tokens)
    best = np.asarray(logits, np.float64)[:, 7:-1, :].argmax(axis=-1)
    np.testing.assert_array_equal(top, best == tokens[:, 8:])

    before = _snapshot(root)
    _, again = _walk(root, Memorization)
    assert again.results == [] and again.skipped == nodes
    assert _snapshot(root) == before  # a second walk writes nothing


@pytest.mark.parametrize(
    ("member", "first"),
    [
        ("logit-lens", True),  # drift's fixed batch is the set's first validation batch
        pytest.param("induction", False, marks=pytest.mark.slow),  # one more forward
    ],
)
def test_beside_the_first_analyses_each_writes_what_it_writes_alone_compiled_once(
    trained: tuple[Path, list[Node]], alone: Any, root: Path, member: str, first: bool
) -> None:
    _, nodes = trained
    walked_alone = alone[0]
    compiled: list[int] = []  # the seq of the node analyzed at each XLA compilation
    walking: list[object] = []

    def listen(event: str, seconds: float, **kwargs: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration" and walking:
            compiled.append(walking[0].node.seq)  # type: ignore[attr-defined]

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        with quick(root) as q:
            q.build(FirstAnalyses, "first")
            q.find().spec(run="trained").over()
            q.config["library/analyses"] = [member, "drift", "memorization"]
            q.config["library/induction/length"] = 8
            q.config["library/drift/reference"] = nodes[0].serialize()  # as alone
            job = q.create()
            walking.append(job)
            walk = job()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert [r.node for r in walk.results] == nodes
    views = job._companion_views()
    # one program for the set, traced once; drift's residual streams are recorded in it (in
    # the forward of the first validation batch, or in one more where no member reads
    # validation batches), so drift traces no program of its own
    assert (job.traces, views["drift"].traces) == (1, 0)
    assert job._shared_drift().first is first
    assert compiled and set(compiled) == {nodes[0].seq}  # nothing compiled after the first

    def held(root: Path, node: Node) -> tuple[dict[str, object], dict[str, bytes]]:
        with Store(root / "store") as store:
            values = {
                k: v
                for k, v in store.values(node).items()
                if k.startswith(("dynamics/cka", "dynamics/memorization", "analysis/drift/res"))
            }
            files = ("drift/residuals.npy", "memorization/sequences.json")
            artifacts = store.get(node)
            assert {"drift", "memorization"} <= set(artifacts)  # each figure, as alone
            return values, {name: artifacts[name].content for name in files}

    for node in nodes:
        assert held(root, node) == held(walked_alone, node)
    with Store(root / "store") as store:
        document = json.loads(store.get(nodes[-1])["first-analyses"].content)
        values = store.values(nodes[-1])
    assert document["memorization"]["dynamics/memorization/share"] == pytest.approx(
        values["dynamics/memorization/share"]
    )
    assert document["drift"]["dynamics/cka/L1"] == values["dynamics/cka/L1"]


def test_what_cannot_be_replayed_or_resolved_is_one_line_before_anything_is_written(
    trained: tuple[Path, list[Node]], root: Path
) -> None:
    _, nodes = trained
    before = _snapshot(root)
    with quick(root) as q:
        q.build(lj.CustomMemorization, "look")  # DATASET = []: no plan to replay
        q.find().spec(run="trained").seq(3).resume()
        job = q.create()
        with pytest.raises(AnalysisError, match="cannot replay the batches") as replay:
            job()
    with quick(root) as q:
        q.build(Memorization, "look")
        q.find().spec(run="trained").seq(3).resume()
        q.config["library/memorization/continuation"] = BLOCK
        with pytest.raises(AnalysisError, match=r"lower library\.memorization\.prefix") as lengths:
            q.create()()
    with quick(root) as q, pytest.raises(AnalysisError, match="names no node") as named:
        q.build(RepresentationDrift, "look")
        q.find().spec(run="trained").seq(3).resume()
        q.config["library/drift/reference"] = f"{nodes[0].name}~{nodes[0].nonce}~99"
        q.create()()
    for caught in (replay, lengths, named):
        assert "\n" not in str(caught.value)
    assert _snapshot(root) == before


def test_theseus_configure_writes_their_settings(tmp_path: Path) -> None:
    runner = CliRunner()
    for name, keys in (
        ("library/drift", ("library/drift/tokens", "library/drift/reference")),
        ("library/memorization", ("library/memorization/prefix", "library/memorization/order")),
    ):
        out = tmp_path / f"{name.split('/')[1]}.yaml"
        answer = runner.invoke(main, ["configure", name, str(out)])
        assert answer.exit_code == 0, answer.output
        text = out.read_text()
        assert all(f"{key.rsplit('/', 1)[1]}:" in text for key in keys)
