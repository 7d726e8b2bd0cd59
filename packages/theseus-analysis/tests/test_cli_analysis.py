"""An analysis is a job: `theseus configure` and `theseus run --resume NODE` drive it."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

JOBS_FILE = str(Path(__file__).with_name("analysis_jobs.py"))
jobs = import_module_or_file(JOBS_FILE)


def test_theseus_run_resumes_a_checkpoint_with_an_analysis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Synthetic.prepare(tmp_path, tokens=40_000, val_tokens=6_000)
    with quick(tmp_path) as q:
        q.build(jobs.GPTWithAnalysis, "trained")
        settings = {"training/analyze": False, "logging/checkpoint_interval": 1}
        jobs.tiny(q.config, steps=2, **settings)
        trainer = q.create()
        trainer()
    # The earlier of the two checkpoints: an analysis may resume a node with later
    # checkpoints (only training on from it is refused).
    analyzed = Node(trainer.node.name, trainer.node.nonce, 0)
    node = analyzed.serialize()
    runner = CliRunner()
    config = tmp_path / "inspect.yaml"
    configured = runner.invoke(
        main, ["configure", "my-model/analyze/activation", str(config), "--import", JOBS_FILE]
    )
    assert configured.exit_code == 0, configured.output
    assert "target: blocks_0/attn" in config.read_text()
    monkeypatch.setenv("UV_RUN_RECURSION_DEPTH", "1")  # as `uv run theseus run` starts it
    ran = runner.invoke(
        main,
        [
            "run", "inspect", str(config), str(tmp_path), "--resume", node,
            "--import", JOBS_FILE, "analysis.target=blocks_1/attn",
        ],
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    with Store(store_root(tmp_path)) as store:
        assert [c.node.seq for c in store.query().nonce(analyzed.nonce).checkpoints()] == [0, 1]
        artifact = store.get(analyzed)["activation"]
        assert artifact.filename == "activation.pdf"
        values = store.values(analyzed)
        # The trainer's record of its node stays; the analysis records its own beside it.
        assert values["job/name"] == "my/gpt/train-with-analysis"
        assert values["job/status"] == "finished"
        assert values["analysis/activation/name"] == "my-model/analyze/activation"
        assert values["analysis/activation/status"] == "finished"
    pdf = tmp_path / "analyses/general/default/inspect/activation.pdf"
    assert pdf.read_bytes() == artifact.content
    # the command says what it wrote: the file, the artifact and its version, the node
    assert f"activation: wrote {pdf}\n" in ran.output
    assert f"artifact 'activation' version 1 on node {node} (read it back: " in ran.output
    # ... as the user's shell calls the store's command (`uv run` started this one), and
    # pasted it writes the artifact's bytes into the current folder
    (line,) = [ln for ln in ran.output.splitlines() if "(read it back: " in ln]
    pasted = shlex.split(line.split("(read it back: ", 1)[1].removesuffix(")"))
    assert pasted == [
        "uv", "run", "theseus-store", "get", str(tmp_path / "store"), node, "activation",
        "-o", "activation.pdf",
    ]  # fmt: skip
    monkeypatch.chdir(tmp_path)
    from theseus.store.cli import main as store_main

    assert store_main(pasted[3:]) == 0
    assert (tmp_path / "activation.pdf").read_bytes() == artifact.content

    bad = runner.invoke(
        main,
        [
            "run", "inspect", str(config), str(tmp_path), "--resume", node,
            "--import", JOBS_FILE, "analysis.target=blocks_5/attn",
        ],
    )  # fmt: skip
    assert bad.exit_code == 1
    assert "Choose a discovered path" in bad.output and "blocks_1/attn" in bad.output
    assert "(raised in InspectActivation.select())" in bad.output
    with Store(store_root(tmp_path)) as store:
        values = store.values(analyzed)
        assert values["job/status"] == "finished"  # a failed analysis leaves the run's record
        assert json.dumps(values)  # plain values


def _artifacts(root: Path) -> dict[str, object]:
    """Every node's values and artifact versions (to show a refused command wrote nothing)."""
    with Store(store_root(root)) as store:
        return {
            n.serialize(): (store.values(n), {k: a.version for k, a in store.get(n).items()})
            for n in store.query().all()
        }


@pytest.mark.slow  # the command line of --over (~9 s); test_over.py keeps the walk itself
def test_theseus_run_over_analyzes_every_checkpoint_of_a_lineage(tmp_path: Path, caplog) -> None:
    root, reference = tmp_path / "root", tmp_path / "reference"
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(jobs.PretrainGPT, "trained")
        settings = {"training/analyze": False, "logging/checkpoint_interval": 1}
        jobs.tiny(q.config, steps=3, **settings)
        trainer = q.create()
        trainer()
    shutil.copytree(root, reference)
    name, nonce = trainer.node.name, trainer.node.nonce
    nodes = [Node(name, nonce, seq) for seq in range(3)]
    runner, config = CliRunner(), tmp_path / "stats.yaml"
    assert runner.invoke(main, ["configure", "analysis-tests/stats", str(config), "--import", JOBS_FILE]).exit_code == 0  # fmt: skip
    command = ["run", "inspect", str(config), str(root), "--import", JOBS_FILE]

    with caplog.at_level("INFO", logger="theseus.training"):
        ran = runner.invoke(main, [*command, "--over", "trained"])  # a run with one lineage
    assert ran.exit_code == 0, ran.output
    assert f"over run finished; it walked the 3 checkpoints of {name}~{nonce} (" in ran.output
    for node in nodes:
        assert f"artifact 'stats' version 1 on node {node}\n" in ran.output
    progress = [
        r.getMessage() for r in caplog.records if "checkpoint 3/3 (seq 2) done" in r.getMessage()
    ]
    assert progress and "ETA" in progress[0] and "elapsed" in progress[0]

    # the independent reference: a separate --resume run of node 1 (in a copy of the root)
    alone = runner.invoke(main, ["run", "inspect", str(config), str(reference), "--resume", nodes[1].serialize(), "--import", JOBS_FILE])  # fmt: skip
    assert alone.exit_code == 0, alone.output
    with Store(store_root(root)) as store, Store(store_root(reference)) as ref:
        assert store.get(nodes[1])["stats"].content == ref.get(nodes[1])["stats"].content
        for key in ("status", "name", "config"):
            key = f"analysis/stats/{key}"
            assert store.values(nodes[1])[key] == ref.values(nodes[1])[key]

    again = runner.invoke(main, [*command, "--over", f"{name}~{nonce}"])
    assert again.exit_code == 0, again.output
    assert "3 skipped: they already hold 'stats' for this configuration (--force" in again.output
    forced = runner.invoke(main, [*command, "--over", f"{name}~{nonce}", "--force"])
    assert forced.exit_code == 0, forced.output
    with Store(store_root(root)) as store:
        assert [store.get(n)["stats"].version for n in nodes] == [2, 2, 2]

    # refused: each a one-line error, and nothing in the store changes
    with Store(store_root(root)) as store:
        store.touch(Node.new("empty"))  # a lineage without a checkpoint
    trainer_config = tmp_path / "train.yaml"
    runner.invoke(main, ["configure", "my/gpt/train-with-analysis", str(trainer_config), "--import", JOBS_FILE])  # fmt: skip
    before = _artifacts(root)
    refused = [
        ([*command, "--over", "trained", "--resume", "trained"], 2, "and --resume picks one node; pass one of them"),
        ([*command, "--over", nodes[1].serialize()], 2, f"is one node: use --resume {nodes[1].serialize()} to analyze that node, or --over {name}~{nonce}"),
        (["run", "t", str(trainer_config), str(root), "--import", JOBS_FILE, "--over", "trained"], 2, "(GPTWithAnalysis) is not an analysis"),
        ([*command, "--over", "nope"], 1, "nope"),
        ([*command, "--over", "empty"], 1, "no checkpoint in lineage general.default.empty~"),
        ([*command, "--force"], 2, "pass it with --over LINEAGE"),
    ]  # fmt: skip
    for argv, code, said in refused:
        result = runner.invoke(main, argv)
        assert result.exit_code == code and said in result.output, (argv, result.output)
        if code == 1:
            assert len(result.output.strip().splitlines()) == 1, result.output
    assert _artifacts(root) == before


@pytest.mark.parametrize("verb", ["demo", "eval"])
def test_the_plugin_verbs_take_root_as_every_verb_does(verb: str, tmp_path: Path) -> None:
    import click

    from theseus.cli import ROOT_HELP, RootPath

    command = main.get_command(click.Context(main), verb)
    assert command is not None
    [root] = [p for p in command.params if p.name == "root"]
    assert isinstance(root.type, RootPath)  # the one conversion theseus-core's verbs use
    shown = " ".join(CliRunner().invoke(main, [verb, "--help"]).output.split())
    assert " ".join(ROOT_HELP.split()) in shown
    if verb == "eval":  # a root without a store: one line, and nothing made
        done = CliRunner().invoke(main, ["eval", str(tmp_path / "none"), "x", "--tasks", "t"])
        assert done.exit_code == 1 and "does not exist" in done.output, done.output
        assert done.output.count("\n") == 1 and not (tmp_path / "none").exists()
