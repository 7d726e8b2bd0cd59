"""The library's analyses on a trained lineage: `--over`, in tandem, published, browsed.

A tiny GPT trains two steps on the synthetic language, validated and checkpointed at
each; `FirstAnalyses` (all five analyses in one program) walks both checkpoints.
References: the logit lens, the ICL score, the loss by position and by frequency are
checked on the last checkpoint against `library_reference` (float64 NumPy from Flax's
own recorded residuals and logits and the model's `ln_f`/unembedding weights, the
frequency buckets from the prepared `train.bin`), within 1e-5; the lens's last layer
against the trainer's own validation loss at that node (`val/loss`, its compiled
`val_step` over the same batches), 1e-5, with KL below 1e-6. The walk compiles once
and traces the model twice (once per batch kind) for the five analyses. The same
training with the analyses in tandem (slow) leaves the same values on the same nodes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from click.testing import CliRunner

from theseus.analysis.library import FirstAnalyses, InductionHeads, LossByFrequency
from theseus.cli import main
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Store

ref = import_module_or_file(str(Path(__file__).with_name("library_reference.py")))
renderer_tests = import_module_or_file(str(Path(__file__).parents[1] / "test_renderers.py"))

SETTINGS = {
    "architecture/n_layers": 2,
    "architecture/n_embd": 32,
    "architecture/n_head": 2,
    "architecture/block_size": 32,
    "training/batch_size": 8,
    "training/tokens": 2 * 8 * 32,  # two steps
    "training/validation_steps": 2,
    "logging/report_interval": 1,
    "logging/validation_interval": 1,
    "logging/checkpoint_interval": 1,
}
LIBRARY = {
    "library/batches": 2,  # the batches validate() reads
    "library/icl/early": 4,
    "library/icl/late": 28,
    "library/induction/length": 12,
}
NAMES = ("induction", "icl", "logit-lens", "loss-by-position", "loss-by-frequency")


class Train(PretrainGPT):
    """The tiny GPT with every first analysis in tandem."""

    ANALYSIS: ClassVar[list[Any]] = [FirstAnalyses]


class Counted(FirstAnalyses):
    """`FirstAnalyses` that counts the model traces of its program."""

    model_traces = 0

    @classmethod
    def trace(cls, state: Any, batch: Any, key: Any, *, sharding: Any) -> Any:
        Counted.model_traces += 1
        return super().trace(state, batch, key, sharding=sharding)


def train(root: Path, trainer: type, run: str, **extra: Any) -> dict[int, dict[str, Any]]:
    """Train `trainer` as `run` with `SETTINGS`; each node's `dynamics/...` values."""
    with quick(root) as q:
        q.build(trainer, run)
        for key, value in {**SETTINGS, **extra}.items():
            q.config[key] = value
        q.create()()
        return {
            node.seq: {k: v for k, v in q.store.values(node).items() if k.startswith("dynamics/")}
            for node in q.store.query().spec(run=run).all()
        }


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root holding the tiny GPT's lineage `trained` (checkpoints at seq 0 and 1)."""
    root = tmp_path_factory.mktemp("library")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    train(root, PretrainGPT, "trained")
    return root


@pytest.fixture(scope="module")
def walked(trained: Path) -> Any:
    """`Counted` walked over the lineage's two checkpoints (at its last one afterwards)."""
    root = trained
    with quick(root) as q:
        q.build(Counted, "first")
        for key, value in LIBRARY.items():
            q.config[key] = value
        nodes = q.find().spec(run="trained").over()
        job = q.create()
        Counted.model_traces = 0
        result = job()
        yield job, nodes, result


def test_a_walk_writes_every_analysis_on_each_checkpoint_compiled_once(trained, walked) -> None:
    root = trained
    job, nodes, result = walked
    assert [r.node for r in result.results] == nodes
    assert [n.seq for n in nodes] == [0, 1]
    assert job.traces == 1  # one program for five analyses and two checkpoints
    assert Counted.model_traces == 2  # traced once per batch kind: repeated, validation
    with Store(root / "store") as store:
        for node in nodes:
            held = store.get(node)
            for name in NAMES:
                assert held[name].filename == f"{name}.pdf"
                assert held[name].content.startswith(b"%PDF-")
            summary = json.loads(held["first-analyses"].content)
            assert sorted(summary) == sorted(NAMES)
            values = store.values(node)
            assert (
                summary["induction"]["dynamics/induction/L1H1"] == values["dynamics/induction/L1H1"]
            )
            assert summary["logit-lens"] == {
                k: v for k, v in values.items() if k.startswith("dynamics/logit_lens/")
            }
    keys = set(values)
    assert {
        f"dynamics/{k}/L{i}H{j}"
        for k in ("induction", "previous_token")
        for i in (0, 1)
        for j in (0, 1)
    } <= keys
    assert {
        f"dynamics/logit_lens/{s}/{m}" for s in ("embed", "L0", "L1") for m in ("loss", "kl")
    } <= keys
    assert {
        "dynamics/icl/score",
        "dynamics/loss_by_position/P16",
        "dynamics/loss_by_frequency/F3",
    } <= keys


@pytest.mark.slow  # ~15 s: a second training, the analyses at each validation
def test_in_tandem_the_same_values_land_on_the_same_nodes(trained, walked, tmp_path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    tandem = train(root, Train, "trained", **LIBRARY)
    with Store(trained / "store") as store:
        for node in walked[1]:
            values = store.values(node)
            assert tandem[node.seq], node
            for key, value in tandem[node.seq].items():
                assert value == pytest.approx(values[key], abs=1e-6), key


@pytest.mark.slow  # ~10 s: the README's two jobs, each compiled
def test_the_readme_example_runs(trained, tmp_path, monkeypatch) -> None:
    import re
    import shutil

    readme = Path(__file__).parents[2] / "README.md"
    section = readme.read_text().split("## The first analyses", 1)[1].split("\n## ", 1)[0]
    (example,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    shutil.copytree(trained, tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    with quick("results") as q:  # the README's lineage is named train-gpt
        [node] = [c.node for c in q.store.query().spec(run="trained").checkpoints()][-1:]
    example = example.replace('run="train-gpt"', 'run="trained"')
    namespace: dict[str, Any] = {}
    exec(compile(example, str(readme), "exec"), namespace)
    assert namespace["result"].node == node
    assert namespace["result"].values["induction"].shape == (2, 2)
    walk = namespace["walk"]
    assert [r.node.seq for r in walk.results] == [0, 1]
    assert walk.results[-1].values["logit-lens"]["loss"].shape == (3,)
    assert sorted(walk.results[-1].values) == ["induction", "logit-lens"]


def test_results_against_numpy(trained, walked) -> None:
    root = trained
    job, nodes, result = walked
    got = result.results[-1].values
    batches = [job.read_batch(i, "val") for i in range(LIBRARY["library/batches"])]
    ran = ref.forwards(job.state, batches)
    lens = ref.lens(job.state, job.configuration, batches, ran)
    np.testing.assert_allclose(got["logit-lens"]["loss"], lens["loss"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["logit-lens"]["kl"], lens["kl"], atol=1e-5)
    with Store(root / "store") as store:
        val_loss = store.values(nodes[-1])["val/loss"]  # the trainer's val_step, same batches
    assert got["logit-lens"]["loss"][-1] == pytest.approx(val_loss, abs=1e-5)
    assert got["logit-lens"]["model_loss"] == pytest.approx(val_loss, abs=1e-5)
    assert abs(got["logit-lens"]["kl"][-1]) < 1e-6

    total, count = ref.position_sums(batches, ran)
    per_position = total / count
    np.testing.assert_allclose(got["loss-by-position"]["loss"], per_position, rtol=1e-5)
    assert got["loss-by-position"]["spans"][8] == pytest.approx(
        total[8:16].sum() / count[8:16].sum(), rel=1e-5
    )
    icl = got["icl"]
    assert (icl["early"], icl["late"]) == (4, 28)
    assert icl["score"] == pytest.approx(per_position[28] - per_position[4], abs=1e-5)

    train = np.fromfile(root / "data" / "synthetic" / "train.bin", dtype=job.tokenizer.dtype)
    vocab = int(job.configuration["architecture/vocab_size"])
    of = ref.buckets_of(train, vocab, 4)
    total, count = ref.frequency_sums(batches, ran, of, 4)
    np.testing.assert_allclose(got["loss-by-frequency"]["loss"], total / count, rtol=1e-5)
    np.testing.assert_array_equal(got["loss-by-frequency"]["types"], np.bincount(of, minlength=4))


def test_the_browser_shows_the_heatmap_and_the_curves(trained, walked) -> None:
    pytest.importorskip("starlette", reason="the browser is theseus-store's [ui] extra")
    from starlette.testclient import TestClient

    from theseus.store.ui import create_app, open_readonly

    root = trained
    _, nodes, _ = walked
    lineage = f"{nodes[0].name}~{nodes[0].nonce}"
    store = open_readonly(root / "store")
    try:
        with TestClient(create_app(store)) as client:
            answer = client.get("/api/frames", params={"l": lineage, "name": "induction"})
            assert answer.status_code == 200, answer.text
            frames = answer.json()["frames"]
            assert [f["node"] for f in frames] == [n.serialize() for n in nodes]
            picture = client.get(frames[-1]["image"])  # the heatmap drawn as a PNG
            assert picture.status_code == 200 and picture.content.startswith(b"\x89PNG")
            assert client.get("/slider", params={"l": lineage}).status_code == 200
            key = "dynamics/logit_lens/L1/loss"
            answer = client.get("/api/series", params={"key": key, "l": lineage})
            assert answer.status_code == 200, answer.text
            (series,) = answer.json()["series"]
            assert series["x"] == [0, 1]
    finally:
        store.close()


def test_the_catalogue_lists_them_with_no_import(tmp_path: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(main, ["jobs", "library/"])
    assert listed.exit_code == 0, listed.output
    for name in (
        "induction",
        "icl",
        "logit-lens",
        "loss-by-position",
        "loss-by-frequency",
        "first",
    ):
        assert f"library/{name} " in listed.output
    out = tmp_path / "first.yaml"
    made = runner.invoke(main, ["configure", "library/first", str(out)])
    assert made.exit_code == 0, made.output
    text = out.read_text()
    for key in ("analyses:", "icl:", "early: 50", "late: 500", "buckets: 4", "length: 64"):
        assert key in text, key


@pytest.mark.slow  # ~6 s: the analysis alone compiles its own program
def test_one_analysis_on_one_checkpoint_from_the_command_line(trained, tmp_path) -> None:
    import shutil

    root = tmp_path / "root"
    shutil.copytree(trained, root)
    with Store(root / "store") as store:
        node = max(
            (c.node for c in store.query().spec(run="trained").checkpoints()), key=lambda n: n.seq
        )
    runner = CliRunner()
    config = tmp_path / "lens.yaml"
    made = runner.invoke(main, ["configure", "library/logit-lens", str(config)])
    assert made.exit_code == 0, made.output
    ran = runner.invoke(
        main,
        ["run", "lens", str(config), str(root), "--resume", node.serialize(), "library.batches=2"],
    )
    assert ran.exit_code == 0, ran.output
    assert "logit-lens: wrote" in ran.output
    with Store(root / "store") as store:
        values = store.values(node)
        assert values["analysis/logit-lens/status"] == "finished"
        assert values["dynamics/logit_lens/L1/loss"] == pytest.approx(values["val/loss"], abs=1e-5)
        assert store.get(node)["logit-lens"].filename == "logit-lens.pdf"


def test_the_induction_score_alone_draws_from_the_datas_ids(trained) -> None:
    """`library/induction/tokens = data` on `InductionHeads` alone (as the demo runs it in
    tandem), whose settings once lacked the `library/dataset` it reads: the repeated
    tokens are ids the prepared `train.bin` holds (read here with NumPy)."""
    from theseus.analysis.library import InductionHeads

    with quick(trained) as q:
        q.build(InductionHeads, "induction-data")
        q.find().spec(run="trained").checkpoint().latest().branch()
        q.config["library/induction/tokens"] = "data"
        job = q.create()
        result = job()
    train = np.fromfile(trained / "data" / "synthetic" / "train.bin", dtype=job.tokenizer.dtype)
    drawn = job.repeated_batch()["x"]
    assert set(np.unique(drawn)) <= set(np.unique(train))
    assert len(np.unique(drawn)) > 1
    assert result.values["induction"].shape == (2, 2)  # layers x heads


def test_a_name_that_is_no_analysis_is_one_line(trained) -> None:
    root = trained
    from theseus.analysis import AnalysisError

    among = (
        "among induction, icl, logit-lens, loss-by-position, loss-by-frequency, drift, "
        "memorization, "
    )
    for analyses, expected in (
        (
            ["induction", "attention", "lens"],
            "library/analyses names 'attention', 'lens', which the library has no analysis "
            f"of (lens: did you mean logit-lens?); name analyses {among}",
        ),
        (
            ["icl", "induction", "icl"],
            f"library/analyses names 'icl' more than once; name each analysis once, {among}",
        ),
        ([], f"library/analyses is empty; name one or more {among}"),
    ):
        with quick(root) as q:
            q.build(FirstAnalyses, "wrong")
            q.find().spec(run="trained").checkpoint().latest().resume()
            q.config["library/analyses"] = analyses
            with pytest.raises(AnalysisError) as refused:
                q.create()
        assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)


def test_the_logit_lens_frames_share_one_scale() -> None:
    """The time slider steps through one figure per node: each lens figure's y axis runs
    from 0 to uniform guessing (`ln 256` here) unless a value lies above, so two nodes'
    frames share their scale; the legend sits beside the axes, where no curve runs."""
    from theseus.analysis.library import LogitLens

    uniform = float(np.log(256))

    def frame(loss: list[float], kl: list[float]) -> Any:
        results = {"layers": ["embed", "L0", "L1"], "loss": np.array(loss),
                   "kl": np.array(kl), "model_loss": loss[-1], "uniform": uniform}  # fmt: skip
        return LogitLens.figure(results).axes[0]

    early, late = frame([2.8, 2.6, 2.6], [0.2, 0.05, 0.0]), frame([5.2, 2.1, 1.8], [3.3, 0.3, 0.0])
    assert early.get_ylim() == late.get_ylim()
    low, high = early.get_ylim()
    assert low < 0 < uniform < high <= 1.06 * uniform  # markers at 0 and ln V drawn whole
    above = frame([7.0, 2.0, 1.0], [6.0, 0.1, 0.0]).get_ylim()
    assert above[1] >= 7.0  # a value above uniform guessing stays in view
    [line] = [line for line in early.get_lines() if line.get_label() == "uniform guessing"]
    assert list(line.get_ydata()) == [uniform, uniform]
    legend = early.get_legend()
    assert legend.get_title().get_text() == ""
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == ["loss", "KL(final || layer)", "uniform guessing"]
    fig = early.figure
    fig.canvas.draw()
    box, axes = legend.get_window_extent(), early.get_window_extent()
    assert box.x0 >= axes.x1  # beside the axes, not over the curves


def test_the_induction_scores_alone_draw_from_the_data_s_ids(trained) -> None:
    """`library.induction.tokens=data` reads the ids of the data the validation analyses
    read (`library/dataset`): the analysis alone declares that setting too."""
    with quick(trained) as q:
        q.build(InductionHeads, "heads")
        q.find().spec(run="trained").checkpoint().latest().resume()
        q.config["library/induction/tokens"] = "data"
        job = q.create()
        used = set(np.unique(job.repeated_batch()["x"]).tolist())
        shares = job.token_shares()
    assert used and all(shares[i] > 0 for i in used)


def test_buckets_hold_equal_shares() -> None:
    from theseus.analysis.library._data import frequency_buckets

    shares = np.array([0.4, 0.0, 0.1, 0.2, 0.05, 0.25])
    # by share: 0.4 and 0.25 (0.4 before it) in F0, 0.2 (0.65 before) on in F1
    of = frequency_buckets(shares, 2)
    np.testing.assert_array_equal(of, [0, 1, 1, 1, 1, 0])
    assert LossByFrequency.NAME == "loss-by-frequency"


COMPANIONS = {  # the set with drift and memorization beside it
    "library/analyses": [*NAMES, "drift", "memorization"],
    "library/drift/tokens": 64,
    "library/memorization/prefix": 8,
    "library/memorization/continuation": 8,
    "library/memorization/sequences": 8,
}


@pytest.mark.slow  # ~12 s: a walk whose seven figures a worker draws (test_renderers.py: alone)
def test_worker_processes_draw_the_same_pdfs(trained, monkeypatch) -> None:
    """With `THESEUS_RENDER_WORKERS` every figure of the set (its members', drift's and
    memorization's) is drawn in a worker process (counted where the answers arrive), into
    the bytes this process draws from the same results."""
    from theseus.analysis._publish import render
    from theseus.analysis.library import CATALOGUE
    from theseus.analysis.library.drift import DriftBase
    from theseus.analysis.library.memorization import MemorizationBase

    answers = renderer_tests.count_answers(monkeypatch)
    monkeypatch.setenv("THESEUS_RENDER_WORKERS", "1")  # one: what the CI's two cores allow
    with quick(trained) as q:
        q.build(FirstAnalyses, "drawn")
        for key, value in {**LIBRARY, **COMPANIONS}.items():
            q.config[key] = value
        nodes = q.find().spec(run="trained").over(force=True)
        walk = q.create()()
        stored = {node: q.store.get(node) for node in nodes}
    figures = len(NAMES) + 2
    assert answers == ["ok"] * figures * len(nodes)  # every figure at each node
    drawing = {
        **{name: CATALOGUE[f"library/{name}"] for name in NAMES},
        "drift": DriftBase,
        "memorization": MemorizationBase,
    }
    for result in walk.results:
        for name, cls in drawing.items():
            filename, content = render(name, cls.figure(result.values[name]), cls.__name__)
            artifact = stored[result.node][name]
            assert (artifact.filename, artifact.content) == (filename, content), name


class BrokenInduction(InductionHeads):
    """The induction scores with a figure that raises (module level: a worker tries it)."""

    @classmethod
    def figure(cls, results: Any) -> Any:
        raise ValueError("the figure code's own error")


@pytest.mark.slow  # ~12 s: a walk of two nodes
def test_a_figure_that_fails_in_a_worker_fails_as_it_would_here(trained, monkeypatch) -> None:
    class Failing(FirstAnalyses):
        """`FirstAnalyses` with the broken induction figure."""

    def members(self: Any) -> Any:
        return (*FirstAnalyses.members(self)[1:], BrokenInduction)

    monkeypatch.setattr(Failing, "members", members)
    monkeypatch.setenv("THESEUS_RENDER_WORKERS", "2")
    with quick(trained) as q:
        q.build(Failing, "failing")
        for key, value in LIBRARY.items():
            q.config[key] = value
        q.find().spec(run="trained").over(force=True)
        with pytest.raises(ValueError, match="the figure code's own error"):
            q.create()()


@pytest.mark.parametrize(
    ("asked", "cores", "expected"),
    [
        ("", 2, 0),
        ("", 3, 0),
        ("", 4, 2),
        ("", 6, 4),
        ("", 13, 8),
        ("", 64, 8),
        ("3", 2, 3),
        ("0", 64, 0),
    ],
)
def test_how_many_workers(asked: str, cores: int, expected: int, monkeypatch) -> None:
    from theseus.analysis import _renderers

    monkeypatch.setenv("THESEUS_RENDER_WORKERS", asked)
    monkeypatch.setattr(_renderers.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert _renderers.default_workers() == expected


def test_a_bad_worker_count_is_one_line(monkeypatch) -> None:
    from theseus.analysis import AnalysisError
    from theseus.analysis._renderers import default_workers

    monkeypatch.setenv("THESEUS_RENDER_WORKERS", "many")
    with pytest.raises(
        AnalysisError, match=r"THESEUS_RENDER_WORKERS must be a whole number .* got 'many'"
    ):
        default_workers()
