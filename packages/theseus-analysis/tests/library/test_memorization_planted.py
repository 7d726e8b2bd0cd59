"""Memorization finds what a model learned by heart; drift recomputes a previous node.

Slow (about a minute on two cores): a lineage trained 160 steps.
`test_drift_memorization.py` runs the same analyses on a four-step lineage in the
default suite.

One lineage is trained for the module (`planted_jobs.py`): one step, checkpointed at seq
0, then resumed to 160 steps (checkpoints at 79 and 159) with both analyses in tandem at
each validation (79, 159). Its data holds four planted documents among 1,500 that
appear once.

References, none of them the analysis engine:
- the batches: the data plan's draw for one `padded` source rewritten here with NumPy
  (`plan_documents`: which document each row of a step holds), and the documents as
  `planted_jobs.documents` made them;
- memorization: a row is memorized exactly when its document is a planted one (the
  trained model), and none is after one step; each sequence's verdict (memorized, and
  the tokens reproduced before the first miss) against greedy decoding with the
  key-value cache (`generate`);
- drift: a previous node recomputed from its checkpoint gives the values its residuals
  kept in memory gave, within 1e-6.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from theseus.analysis.library import Memorization, RepresentationDrift
from theseus.analysis.library.memorization import top_token_agreement
from theseus.model.generation import generate
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

lj = import_module_or_file(str(Path(__file__).with_name("planted_jobs.py")))
walks = import_module_or_file(str(Path(__file__).with_name("walks.py")))

pytestmark = pytest.mark.slow

SEQUENCES = 64
LAST = 159


class Trained(lj.Planted):
    """The planted trainer with both library analyses in tandem."""

    ANALYSIS = [RepresentationDrift, Memorization]


def plan_documents(step: int, split: str, rows: int, documents: int, seed: int = 0) -> np.ndarray:
    """Which document each row of `step` reads: `MixturePlan`'s draw for one padded source."""
    own = np.random.default_rng([seed, step, {"train": 0, "val": 1}[split], 1])
    return own.integers(0, documents, size=rows)


@pytest.fixture(scope="module")
def planted(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, np.ndarray], list[Node]]:
    """The trained root, its documents and its checkpointed nodes (0, 79, 159)."""
    root = tmp_path_factory.mktemp("planted")
    docs = lj.plant(root)
    extra = {"library/memorization/sequences": SEQUENCES}
    with quick(root) as q:  # one update, checkpointed: a model that has memorized nothing
        q.build(lj.Planted, "planted")
        lj.steps_config(q.config, 1)
        q.create()()
    with quick(root) as q:
        q.build(Trained, "planted")
        q.find().spec(run="planted").checkpoint().latest().resume()
        lj.steps_config(q.config, LAST + 1, **extra)
        q.config["logging/validation_interval"] = 80
        q.config["logging/checkpoint_interval"] = 80
        q.create()()
    with Store(root / "store") as store:
        nodes = sorted({c.node for c in store.query().spec(run="planted").checkpoints()})
    assert [n.seq for n in nodes] == [0, 79, LAST]
    return root, docs, nodes


@pytest.fixture
def root(planted: tuple[Path, dict[str, np.ndarray], list[Node]], tmp_path: Path) -> Path:
    copy = tmp_path / "root"
    shutil.copytree(planted[0], copy)
    return copy


def _snapshot(root: Path) -> dict[str, object]:
    return walks.snapshot(root)


def _walk(root: Path, cls: type, **settings: object):  # type: ignore[no-untyped-def]
    return walks.walk(root, "planted", cls, **settings)


def test_in_tandem_each_validation_compares_with_the_previous_and_tests_what_was_seen(
    planted: tuple[Path, dict[str, np.ndarray], list[Node]],
) -> None:
    root, _, (first, middle, last) = planted
    with Store(root / "store") as store:
        at = {n.seq: store.values(n) for n in (first, middle, last)}
        artifacts = store.get(last)
    assert not any(k.startswith("dynamics/") for k in at[0])  # trained without them
    # the first validation: no earlier residuals (a view reads no checkpoint)
    assert "dynamics/cka/L0" not in at[79] and "analysis/drift/residuals" in at[79]
    assert at[LAST]["dynamics/cka/previous"] == middle.serialize()  # the view's memory
    assert all(0.0 < at[LAST][f"dynamics/cka/L{layer}"] <= 1.0 + 1e-9 for layer in (0, 1))
    assert at[79]["dynamics/memorization/sequences"] == SEQUENCES
    assert at[LAST]["dynamics/memorization/sequences"] == SEQUENCES
    assert at[LAST]["dynamics/memorization/first_step"] == 0
    assert at[LAST]["dynamics/memorization/last_step"] == LAST
    assert {"drift/residuals.npy", "memorization/sequences.json"} <= set(artifacts)
    assert artifacts["drift"].filename == "drift.pdf"


def test_memorization_over_the_lineage_finds_the_planted_sequences_where_the_plan_put_them(
    planted: tuple[Path, dict[str, np.ndarray], list[Node]], root: Path
) -> None:
    _, docs, nodes = planted
    with Store(root / "store") as store:
        tandem = store.values(nodes[-1])["dynamics/memorization/share"]
    job, walk = _walk(root, lj.PlantedMemorization)
    assert [r.node for r in walk.results] == nodes
    documents = docs["train"].shape[0]
    for result in walk.results:
        values = result.values
        steps, rows = values["step"], values["row"]
        seen = result.node.seq + 1  # a fresh lineage: steps 0 .. seq
        assert steps.size == min(SEQUENCES, 8 * seen) and (steps < seen).all()
        assert len({(int(s), int(r)) for s, r in zip(steps, rows, strict=True)}) == steps.size
        drawn = zip(steps.tolist(), rows.tolist(), strict=True)
        which = np.asarray([plan_documents(s, "train", 8, documents)[r] for s, r in drawn])
        np.testing.assert_array_equal(values["tokens"], docs["train"][which])  # the rows replayed
        planted_here = docs["planted"][which]
        assert not (values["memorized"] & ~planted_here).any()  # a document seen once: never
        if result.node.seq == 0:
            assert not values["memorized"].any()  # one step of training memorizes nothing
    np.testing.assert_array_equal(values["memorized"], planted_here)  # the last: every one
    final = walk.results[-1]
    assert planted_here.any() and not planted_here.all()
    with Store(root / "store") as store:
        document = json.loads(store.get(final.node)["memorization/sequences.json"].content)
        share = store.values(final.node)["dynamics/memorization/share"]
    assert [(s["step"], s["row"], s["memorized"]) for s in document["sequences"]] == [
        (int(s), int(r), bool(m))
        for s, r, m in zip(final.values["step"], final.values["row"], planted_here, strict=True)
    ]
    assert share == pytest.approx(planted_here.mean()) and share == tandem  # the same draw

    # the verdicts against greedy decoding with the key-value cache (`generate`)
    sequences = np.concatenate([docs["train"][docs["planted"]][:4], docs["val"][:3]])[:, :64]
    top = top_token_agreement(job.model, job.state.params, sequences, 32, 64, 256)
    decoded = np.asarray(
        generate(job.model, job.state.params, sequences[:, :32].tolist(), 32, temperature=0.0,
                 vocab=256, cache_slots=64)
    )  # fmt: skip
    same = decoded == sequences[:, 32:]
    np.testing.assert_array_equal(top.all(axis=1), same.all(axis=1))
    np.testing.assert_array_equal(np.cumprod(top, axis=1), np.cumprod(same, axis=1))
    assert top[:4].all() and not top[4:].all(axis=1).any()  # the planted ones, no unseen one
    alone = top_token_agreement(job.model, job.state.params, sequences, 32, 3, 256)
    np.testing.assert_array_equal(alone, top)  # the batch size changes nothing

    before = _snapshot(root)
    _, again = _walk(root, lj.PlantedMemorization)
    assert again.results == [] and again.skipped == nodes
    assert _snapshot(root) == before  # a second walk writes nothing


class Recomputed(lj.PlantedDrift):
    """Another NAME: no node holds its residuals, so the previous one's come from its checkpoint."""

    NAME = "drift-again"


def test_one_checkpoint_compares_with_the_previous_checkpoint_recomputed(
    planted: tuple[Path, dict[str, np.ndarray], list[Node]], root: Path
) -> None:
    _, _, nodes = planted
    with quick(root) as q:  # the walk's values at 79, node 0's residuals from memory
        q.build(lj.PlantedDrift, "walk")
        q.find().spec(run="planted").over()
        q.create()()
    with Store(root / "store") as store:
        walked = store.values(nodes[1])
    with quick(root) as q:
        q.build(Recomputed, "look")
        q.find().spec(run="planted").seq(79).resume()
        result = q.create()()
    assert result.values["previous"] == nodes[0]
    with Store(root / "store") as store:
        again = store.values(nodes[1])
        assert "drift-again/residuals.npy" in store.get(nodes[1])
        assert "drift-again/residuals.npy" not in store.get(nodes[0])  # nothing written there
    for i in (0, 1):
        assert again[f"dynamics/cka/L{i}"] == pytest.approx(walked[f"dynamics/cka/L{i}"], abs=1e-6)
