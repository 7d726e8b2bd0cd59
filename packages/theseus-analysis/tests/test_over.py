"""One analysis over every checkpoint of a lineage (`q.find()...over()`).

The reference for every value is an independent run of the same analysis with
`.resume()` on each node, in a copy of the root made before any analysis ran: its
artifact bytes must equal the walk's exactly (a JSON analysis is deterministic, and
both restore the same checkpoint into the same layout). The walk must compile once
(`traces == 1` after four checkpoints of one shape), skip what is already there for
the same configuration, and leave the store untouched when a call is refused.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from theseus.data.datasets import Synthetic
from theseus.job import JobError, JobSpec, Mode
from theseus.quick import QuickError, quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

jobs = import_module_or_file(str(Path(__file__).with_name("analysis_jobs.py")))

STEPS = 4  # one checkpoint per step: nodes 0..3


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root holding one tiny GPT lineage with a checkpoint at every node."""
    root = tmp_path_factory.mktemp("trained")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(jobs.PretrainGPT, "trained")
        settings = {"training/analyze": False, "logging/checkpoint_interval": 1}
        jobs.tiny(q.config, steps=STEPS, **settings)
        q.create()()
    return root


@pytest.fixture(scope="module")
def reference(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, bytes]:
    """`Stats` resumed on each node separately (a new job per node): seq -> JSON bytes."""
    root = tmp_path_factory.mktemp("reference") / "root"
    shutil.copytree(trained, root)
    found: dict[int, bytes] = {}
    with quick(root) as q:
        q.build(jobs.Stats, "inspect")
        for seq in range(STEPS):
            q.find().spec(run="trained").seq(seq).resume()
            result = q.create()()
            found[seq] = result.artifact.content
    return found


@pytest.fixture
def root(trained: Path, tmp_path: Path) -> Path:
    """A private copy of the trained root (each test writes its own artifacts)."""
    copy = tmp_path / "root"
    shutil.copytree(trained, copy)
    return copy


def _lineage(root: Path) -> list[Node]:
    """The trained lineage's checkpointed nodes (from the store's checkpoints)."""
    with Store(root / "store") as store:
        saved = store.query().spec(run="trained").checkpoints()
        [lineage] = {(c.node.name, c.node.nonce) for c in saved}
        return [Node(*lineage, seq) for seq in range(STEPS)]


def _job_records(root: Path) -> dict[str, dict[str, object]]:
    """The `job/*` values of every node: the training run's own records."""
    with Store(root / "store") as store:
        return {
            n.serialize(): {k: v for k, v in store.values(n).items() if k.startswith("job/")}
            for n in store.query().all()
        }


def _snapshot(root: Path) -> dict[str, object]:
    """Every value and artifact version of every node (to show nothing changed)."""
    with Store(root / "store") as store:
        nodes = store.query().all()
        return {
            n.serialize(): (
                store.values(n),
                {k: (a.version, a.content) for k, a in store.get(n).items()},
            )
            for n in nodes
        }


def _walk(root: Path, *, force: bool = False, **settings: object):
    with quick(root) as q:
        q.build(jobs.Stats, "inspect")
        for key, value in settings.items():
            q.config[key] = value
        nodes = q.find().spec(run="trained").over(force=force)
        job = q.create()
        return job, nodes, job()


def test_over_attaches_each_result_to_its_node_compiled_once(root, reference) -> None:
    records = _job_records(root)
    job, nodes, result = _walk(root)
    assert _job_records(root) == records  # the trainer's records stay as they were
    assert nodes == _lineage(root)
    assert job.traces == 1  # one trace for four checkpoints of one shape
    assert [r.node for r in result.results] == nodes and result.skipped == []
    with Store(root / "store") as store:
        for node in nodes:
            artifact = store.get(node)["stats"]
            assert artifact.version == 1 and artifact.filename == "stats.json"
            assert artifact.content == reference[node.seq]  # the separate --resume run's bytes
            values = store.values(node)
            assert values["analysis/stats/status"] == "finished"
            assert values["analysis/stats/name"] == job.configuration.job
            assert values["analysis/stats/config_version"] == 1
        # the four results differ: each node's own checkpoint was analyzed
        assert len({store.get(n)["stats"].content for n in nodes}) == STEPS
    # the file holds the last node's result, as a --resume run of it would leave it
    assert (root / "analyses/general/default/inspect/stats.json").read_bytes() == reference[3]
    # the reads after the first overlapped the previous analysis (measured, not asserted
    # beyond its bounds: how much depends on the machine's load)
    assert result.read_seconds > 0 and 0.0 <= result.hidden <= 1.0
    assert result.waited_seconds <= result.read_seconds + 0.05
    assert json.loads(reference[3])["mean"] == pytest.approx(result.results[-1].values["mean"])


def test_a_second_walk_skips_and_force_writes_a_new_version(root, reference) -> None:
    _walk(root)
    job, nodes, again = _walk(root)
    assert again.results == [] and again.skipped == nodes
    assert job.traces == 0  # nothing was compiled
    assert "4 skipped" in "\n".join(job.outcome(again))
    job, _, forced = _walk(root, force=True)
    assert [r.node for r in forced.results] == nodes and job.traces == 1
    with Store(root / "store") as store:
        for node in nodes:
            history = store.history(node, "stats")
            assert [a.version for a in history] == [1, 2]
            assert history[1].content == reference[node.seq]
            assert store.values(node)["analysis/stats/config_version"] == 2


def test_a_result_of_another_configuration_is_recomputed(root, reference, monkeypatch) -> None:
    monkeypatch.setenv("UV_RUN_RECURSION_DEPTH", "1")  # as `uv run theseus run` starts it
    _walk(root)
    # A --resume of node 2 with another setting (that leaves the values alone) makes
    # node 2's latest artifact another configuration's; the walk redoes only node 2.
    with quick(root) as q:
        q.build(jobs.Stats, "inspect")
        q.find().spec(run="trained").seq(2).resume()
        q.config["training/validation_steps"] = 3
        q.create()()
    job, nodes, result = _walk(root)
    assert [r.node.seq for r in result.results] == [2]
    assert [n.seq for n in result.skipped] == [0, 1, 3]
    lineage, store_at = f"{nodes[0].name}~{nodes[0].nonce}", root / "store"
    assert job.outcome(result) == [
        f"stats: analyzed 1 of 4 checkpoints of {lineage} (seq 0 to 3)",
        "  3 skipped: they already hold 'stats' for this configuration (--force recomputes "
        "them as a new version)",
        f"  artifact 'stats' version 3 on node {nodes[2]}",
        f"  file {result.results[0].path} holds the result of the lineage's last "
        f"checkpoint, {nodes[3]} (skipped: it held it already); each node keeps its own as "
        f"its artifact (read one back: uv run theseus-store get {store_at} "
        f"{shlex.quote(str(nodes[3]))} stats -o stats.json)",
    ]
    assert result.results[0].path.read_bytes() == reference[3]
    with Store(root / "store") as store:
        assert [a.version for a in store.history(nodes[2], "stats")] == [1, 2, 3]
        assert store.get(nodes[2])["stats"].content == reference[2]
    # ... and a walk with that other setting recomputes all four (node 2's latest
    # result is the default configuration's again)
    _, _, other = _walk(root, **{"training/validation_steps": 3})
    assert [r.node.seq for r in other.results] == [0, 1, 2, 3]
    _, _, same = _walk(root, **{"training/validation_steps": 3})
    assert same.results == [] and len(same.skipped) == STEPS


def _walk_after_resuming(root: Path, seq: int):
    """`Stats` resumed on node `seq` alone (`--resume`), then walked over the lineage."""
    with quick(root) as q:
        q.build(jobs.Stats, "inspect")
        q.find().spec(run="trained").seq(seq).resume()
        q.create()()
    return _walk(root)


def test_a_resumed_run_is_skipped_by_a_walk_of_the_same_configuration(root, monkeypatch) -> None:
    """... and the command it prints reads the last node's artifact back as the user's
    shell calls the store's command (here: started by `uv run`)."""
    monkeypatch.setenv("UV_RUN_RECURSION_DEPTH", "1")
    job, nodes, result = _walk_after_resuming(root, 1)
    assert [n.seq for n in result.skipped] == [1]
    lines = job.outcome(result)
    assert lines[1] == (
        "  1 skipped: it already holds 'stats' for this configuration (--force recomputes it "
        "as a new version)"
    )
    assert lines[-1] == (
        f"  file {result.results[-1].path} holds the result of the last node analyzed, "
        f"{nodes[3]}; each node keeps its own as the artifact above (read one back: "
        f"uv run theseus-store get {root / 'store'} {shlex.quote(str(nodes[3]))} stats "
        "-o stats.json)"
    )


def test_a_walk_that_skips_the_last_node_leaves_its_result_in_the_file(root, reference) -> None:
    """The walk writes each analyzed node's file over the previous one's; the lineage's
    last node, done before (a --resume of it), is skipped, and the file is its result
    again, not seq 2's."""
    job, nodes, result = _walk_after_resuming(root, 3)
    assert [n.seq for n in result.skipped] == [3]
    assert [r.node.seq for r in result.results] == [0, 1, 2]
    path = result.results[-1].path
    assert path.read_bytes() == reference[3] != reference[2]
    assert job.outcome(result)[-1].startswith(
        f"  file {path} holds the result of the lineage's last checkpoint, {nodes[3]} "
        "(skipped: it held it already)"
    )


def test_refused_walks_change_nothing(root) -> None:
    with Store(root / "store") as store:  # a second lineage of the run, never checkpointed
        empty = Node.new("trained")
        store.touch(empty)
    before = _snapshot(root)
    with quick(root) as q:
        q.build(jobs.Stats, "inspect")
        with pytest.raises(QuickError, match=r"matched nodes of 2 .*Chain \.nonce\(NONCE\)"):
            q.find().spec(run="trained").over()
        with pytest.raises(QuickError, match=r"no checkpoint in lineage .*nothing to analyze"):
            q.find().nonce(empty.nonce).over()
        with pytest.raises(QuickError, match=r"selected no lineage: .*'nope'"):
            q.find().spec(run="nope").over()
        q.build(jobs.PretrainGPT, "trainer")
        with pytest.raises(QuickError, match=r"PretrainGPT is not an analysis .*\.resume\(\)"):
            q.find().nonce(_lineage(root)[0].nonce).over()
    with quick(root) as q:  # the other order: selected first, then a trainer built
        q.find().nonce(_lineage(root)[0].nonce).over()
        with pytest.raises(QuickError, match="PretrainGPT is not an analysis"):
            q.build(jobs.PretrainGPT, "trainer")
    assert _snapshot(root) == before
    for message in (str(e) for e in _errors(root)):
        assert "\n" not in message


def _errors(root: Path) -> list[Exception]:
    caught = []
    with quick(root) as q:
        q.build(jobs.Stats, "inspect")
        for chain in (lambda: q.find().spec(run="trained").over(), lambda: q.find().over()):
            try:
                chain()
            except QuickError as exc:
                caught.append(exc)
    return caught


def test_only_a_resumed_job_moves_and_over_checks_its_plan(root) -> None:
    nodes = _lineage(root)
    fresh = jobs.Stats(JobSpec("fresh", root=root))
    fresh.setup()
    with pytest.raises(JobError, match="set up in fresh mode; only a job set up with"):
        fresh.restore_node(nodes[1])
    with quick(root) as q:
        q.build(jobs.Stats, "inspect")
        q.find().spec(run="trained").seq(1).resume()
        job = q.create()
        assert job.mode is Mode.RESUME
        with pytest.raises(Exception, match=r"walks from the node the job is resumed at"):
            job.over(nodes)
        with pytest.raises(Exception, match=r"one lineage in seq order"):
            job.over([nodes[1], nodes[0]])
        # restore_node itself: the state becomes node 3's, the compiled function stays
        first = job.compute()
        job.restore_node(nodes[3])
        assert job.node == nodes[3] and job.base == nodes[3]
        moved = job.compute()
        assert job.traces == 1
        assert float(first["mean"]) != float(moved["mean"])
