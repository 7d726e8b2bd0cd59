"""An analysis is a job: `theseus configure` and `theseus run --resume NODE` drive it."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

JOBS_FILE = str(Path(__file__).with_name("analysis_jobs.py"))
jobs = import_module_or_file(JOBS_FILE)


def test_theseus_run_resumes_a_checkpoint_with_an_analysis(tmp_path: Path) -> None:
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
    assert f"theseus-store get {tmp_path / 'store'} {node} activation -o FILE" in ran.output

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
