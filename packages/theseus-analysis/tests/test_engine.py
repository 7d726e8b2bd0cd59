"""The analysis engine: the documented examples, numbers against references, no recompiles.

References: the input of `blocks_0/attn` computed by hand (`ln_1(wte[x])`), Flax's
own `capture_intermediates`, and the eager debugger. Tolerance: float32 on CPU,
1e-6 (relative and absolute) between the compiled analysis and an eager reference.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import jax
import numpy as np
import PIL.Image
import pytest
from matplotlib.figure import Figure

from theseus.analysis import AnalysisBase, AnalysisError, AnalysisResult, AnalysisSelectionError
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.job import JobSpec
from theseus.model.attention.base import SelfAttention
from theseus.model.models import MLP
from theseus.quick import quick
from theseus.registry import ANALYSES, JOBS, import_module_or_file
from theseus.training.base import TrainerError

jobs = import_module_or_file(str(Path(__file__).with_name("analysis_jobs.py")))

TOL = {"rtol": 1e-6, "atol": 1e-6}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("engine")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    return root


def _create(root: Path, cls: type, run: str, steps: int = 4, **extra: object):
    with quick(root) as q:
        q.build(cls, run)
        jobs.tiny(q.config, steps=steps, **extra)
        return q.create()


def _attention_input(model, block=0):
    """The input of `blocks_{block}/attn` from Flax's `capture_intermediates` (`ln_1`'s output).

    Returns `f(params, x)`, compiled once: the reference is the same for every call, and
    op-by-op it would dispatch (and compile) each of the model's operations separately.
    """

    def reference(params, x):
        _, state = model.apply(
            {"params": params}, x, capture_intermediates=True, mutable=["intermediates"]
        )
        return state["intermediates"][f"blocks_{block}"]["ln_1"]["__call__"][0]

    return jax.jit(reference)


@pytest.fixture(scope="module")
def training_run(root: Path):
    """The documentation's trainer with a tandem analysis, trained as `training-run`."""
    # One checkpoint, the last step's (the one the tests resume and branch from).
    trainer = _create(
        root, jobs.GPTWithAnalysis, "training-run", steps=4, **{"logging/checkpoint_interval": 4}
    )
    trainer()
    return trainer


def test_registration_and_inheritance_order() -> None:
    assert ANALYSES["my/gpt/activations"] is jobs.Activations
    assert JOBS["my-model/analyze/activation"] is jobs.InspectActivation  # also a job
    with pytest.raises(
        TypeError, match=r"list AnalysisBase first: class Wrong\(AnalysisBase, PretrainGPT\)$"
    ):

        class Wrong(PretrainGPT, AnalysisBase):  # type: ignore[misc]
            TARGET = SelfAttention
            NAME = "wrong"

    with pytest.raises(TypeError, match="NAME"):

        class BadName(AnalysisBase, PretrainGPT):
            NAME = "a/b"

    message = r"^Named\.TARGET = 'SelfAttention' must be a Flax module class .*write TARGET = "
    with pytest.raises(TypeError, match=message + "SelfAttention$"):

        class Named(AnalysisBase, PretrainGPT):  # a string, not the class
            TARGET = "SelfAttention"
            NAME = "named"

    with pytest.raises(TypeError, match=r"^Listed\.TARGET = \[<class"):

        class Listed(AnalysisBase, PretrainGPT):
            TARGET = [SelfAttention]  # a list, not a tuple
            NAME = "listed"

    assert AnalysisBase[object, object] is not None  # generic like the trainer


def test_analysis_of_fresh_weights_matches_a_hand_computed_input(root: Path) -> None:
    job = jobs.InspectActivation(JobSpec("fresh", root=root))
    assert job.state is None  # construction allocates nothing
    with quick(root) as q:
        q.build(jobs.InspectActivation, "fresh")
        jobs.tiny(q.config)
        job = q.create()
    assert job.setup() == job.node  # idempotent
    result = job()
    assert isinstance(result, AnalysisResult) and result.node == job.node
    assert job.node.seq == 0  # analyses never tick
    x = job.batch("train")["x"]
    expected = jobs.embed_reference(job, x)[0, :64, :128]
    assert result.values.shape == (32, 32)  # the crop of a [8, 32, 32] input
    np.testing.assert_allclose(result.values, expected, **TOL)
    assert result.path == root / "analyses/general/default/fresh/activation.pdf"
    content = result.path.read_bytes()
    assert content.startswith(b"%PDF")
    # in Jupyter the result shows its figure: a PNG of the figure plot() returned
    png, shown = result._repr_png_()
    image = PIL.Image.open(io.BytesIO(png))
    assert image.format == "PNG" and image.width > 200 and image.height > 200
    assert shown == {"width": result.figure.get_figwidth() * 96}
    assert result._repr_json_() is None
    [artifact] = job.store.query().node(job.node).artifact().select()
    assert artifact == {**artifact, "name": "activation", "filename": "activation.pdf"}
    assert artifact["content"] == content
    assert job.traces == 1


def test_tandem_runs_at_validation_cadence_with_every_version_kept(training_run) -> None:
    store, node = training_run.store, training_run.node
    assert node.seq == 3  # 4 steps; the tandem view never ticked
    nodes = sorted(store.query().spec(run="training-run").all(), key=lambda n: n.seq)
    with_artifacts = [n for n in nodes if "activations" in store.get(n)]
    assert [n.seq for n in with_artifacts] == [1, 3]  # validation after steps 2 and 4
    [view] = training_run.loop.views
    assert view.traces == 1 and view.borrowed and view.node == training_run.node
    final = store.get(node)["activations"]
    assert final.filename == "activations.pdf" and final.content.startswith(b"%PDF")
    path = training_run.spec.result("activations.pdf")
    assert path.read_bytes() == final.content  # the latest cadence's file


def test_checkpoint_analysis_from_the_documentation(root: Path, training_run) -> None:
    # verbatim: "Initialized or checkpointed state" (InspectActivation is imported above)
    from theseus.quick import quick

    with quick(root) as q:
        q.build(jobs.InspectActivation, "inspect")
        q.find().spec(run="training-run").checkpoint().latest().resume()
        analysis_job = q.create()
        analysis_job()

    assert analysis_job.node == training_run.node  # attached to the checkpoint's node
    artifact = analysis_job.store.get(training_run.node)["activation"]
    assert artifact.filename == "activation.pdf"
    # The restored weights and the node's batch equal the trainer's: same numbers.
    values = analysis_job.compute()
    x = training_run.batch("train")["x"]
    np.testing.assert_allclose(values, jobs.embed_reference(training_run, x)[0], **TOL)


@pytest.mark.slow  # a second training run; the other documented block covers the path
def test_checkpoint_analysis_from_the_analysis_system_page(root: Path) -> None:
    trainer = _create(root, jobs.GPTWithAnalysis, "train-gpt", steps=2)
    trainer()
    # verbatim: "Run on a saved checkpoint"
    from theseus.quick import quick

    Activations = jobs.Activations
    with quick(root) as q:
        q.build(Activations, "inspect")
        q.find().spec(run="train-gpt").checkpoint().latest().resume()
        analysis_job = q.create()
        analysis_job()
    versions = analysis_job.store.history(trainer.node, "activations")
    assert len(versions) == 2  # the tandem run's and the checkpoint analysis's
    assert versions[0].content == versions[1].content  # same state, same batch, same PDF


def test_branch_starts_a_new_lineage(root: Path, training_run) -> None:
    with quick(root) as q:
        q.build(jobs.Stats, "branched")
        q.find().spec(run="training-run").checkpoint().latest().branch()
        job = q.create()
        result = job()
    assert job.node.parent == training_run.node and job.node.name != training_run.node.name
    assert job.store.get(job.node)["stats"].filename == "stats.json"
    assert result.values["x"].shape == (8, 4, 8)


def test_json_results_and_the_layer_output_match_the_debugger(root: Path) -> None:
    job = _create(root, jobs.Stats, "stats")
    result = job()
    saved = json.loads(result.path.read_bytes())
    assert set(saved) == {"x", "out", "mean"}
    layer, inputs = job.debug("blocks_1/attn")
    np.testing.assert_allclose(saved["x"], np.asarray(inputs.x)[:, :4, :8], **TOL)
    np.testing.assert_allclose(saved["out"], np.asarray(layer(inputs.x))[:, :4, :8], **TOL)
    np.testing.assert_allclose(saved["mean"], float(inputs.x.mean()), atol=1e-6)
    assert job.store.get(job.node)["stats"].content == result.path.read_bytes()
    assert result._repr_json_() == saved and result._repr_png_() is None  # Jupyter: JSON


def test_list_selection_keeps_selection_order(root: Path) -> None:
    job = _create(root, jobs.Several, "several")
    values = job.compute()
    assert isinstance(values, list) and len(values) == 3
    for path, got in zip(jobs.Several.CHOICE, values, strict=True):
        layer, inputs = job.debug(path)
        np.testing.assert_allclose(got, np.asarray(layer(inputs.x))[:, :2, :4], **TOL)
    one = _create(root, jobs.OneInList, "one").compute()
    assert isinstance(one, list) and len(one) == 1  # a one-item list stays a list


def test_no_recompilation_over_many_runs(root: Path) -> None:
    trainer = _create(root, jobs.TrainWithStats, "many")  # set up: the views exist
    views = trainer.loop.views
    reference = _attention_input(trainer.model, block=1)
    seen = []
    for step in range(10):  # new parameters and a new batch (the next node) each time
        trainer.tick()
        scale = 1.0 + 0.01 * step
        trainer.state = trainer.state.replace(
            params=jax.tree.map(lambda p, s=scale: p * s, trainer.state.params)
        )
        results = [view.run() for view in views]
        seen.append(results[0].values["x"])
        x = trainer.batch("train")["x"]
        np.testing.assert_allclose(
            seen[-1], reference(trainer.state.params, x)[:, :4, :8], rtol=1e-5, atol=1e-6
        )
    assert [view.traces for view in views] == [1, 1]  # one trace each over ten runs
    assert [view._analysis_fn._cache_size() for view in views] == [1, 1]
    assert not np.allclose(seen[0], seen[-1])
    store = trainer.store
    assert len(store.query().spec(run="many").artifact("stats").all()) == 10


def test_a_custom_trace_is_the_one_analysed(root: Path) -> None:
    job = _create(root, jobs.ReversedStats, "reversed")
    result = job()
    assert result.path is None and result.artifact is None  # plot() returned None
    assert job.store.get(job.node) == {}
    x = job.batch("train")["x"][:, ::-1]
    np.testing.assert_allclose(result.values, jobs.embed_reference(job, x)[:, :4, :8], **TOL)


def test_analysis_can_be_switched_off(root: Path) -> None:
    trainer = _create(root, jobs.GPTWithAnalysis, "quiet", **{"training/analyze": False})
    assert trainer.loop.views == []
    trainer()  # validates after steps 2 and 4: no analysis runs
    nodes = trainer.store.query().spec(run="quiet").all()
    assert len(nodes) == 4 and all(trainer.store.get(node) == {} for node in nodes)


class _Choose(AnalysisBase, PretrainGPT):
    TARGET = SelfAttention
    NAME = "choose"
    CHOICE: object = "blocks_0/attn"

    def select(self, paths):
        return self.CHOICE

    def analyze(self, layer, inputs):
        return inputs.x.mean()

    def plot(self, results):
        return {"mean": float(results)}


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ([], "empty list"),
        (3, "path string"),
        ("blocks_7/attn", "never calls"),
        (["blocks_0/attn", 2], "strings like"),
    ],
)
def test_bad_selections_fail_at_setup_before_compiling(root: Path, choice, message) -> None:
    cls = type("Bad", (_Choose,), {"CHOICE": choice})
    with pytest.raises(AnalysisSelectionError, match=message) as caught:
        _create(root, cls, "bad")
    assert "blocks_0/attn" in str(caught.value)  # the message lists the discovered paths
    assert isinstance(caught.value, ValueError)


def test_a_bad_tandem_selection_fails_when_the_trainer_is_set_up(root: Path) -> None:
    cls = type("Bad", (_Choose,), {"CHOICE": "blocks_7/attn"})
    tandem = type("BadTandem", (PretrainGPT,), {"ANALYSIS": [cls]})
    with pytest.raises(AnalysisSelectionError, match="never calls"):
        _create(root, tandem, "bad-tandem")  # at the trainer's setup, before any step


def test_declaration_errors(root: Path) -> None:
    twice = type("Twice", (PretrainGPT,), {"ANALYSIS": [jobs.Activations, jobs.Activations]})
    with pytest.raises(TrainerError, match="two analyses named 'activations'"):
        twice(JobSpec("twice", root=root))
    with pytest.raises(TrainerError, match="not an analysis class"):
        type("NotOne", (PretrainGPT,), {"ANALYSIS": [object]})(JobSpec("x", root=root))

    class NoTarget(AnalysisBase, PretrainGPT):
        NAME = "none"

        def select(self, paths):
            return paths[0]

        def analyze(self, layer, inputs):
            return None

        def plot(self, results):
            return None

    with pytest.raises(TypeError, match="TARGET"):
        NoTarget(JobSpec("x", root=root))

    class NoPlot(AnalysisBase, PretrainGPT):
        TARGET = SelfAttention
        NAME = "noplot"

        def select(self, paths):
            return paths[0]

        def analyze(self, layer, inputs):
            return None

    with pytest.raises(TypeError, match="plot"):
        NoPlot(JobSpec("x", root=root))


def test_bad_results_are_clear_errors_and_write_nothing(root: Path) -> None:
    nan = type("NaN", (_Choose,), {"NAME": "nan", "plot": lambda self, r: {"v": float("nan")}})
    job = _create(root, nan, "nan")
    with pytest.raises(AnalysisError, match=r"NaN.*\['v'\]"):
        job()
    assert not job.spec.result("nan.json").exists() and job.store.get(job.node) == {}
    text = type(
        "Text", (_Choose,), {"NAME": "text", "analyze": lambda self, layer, inputs: "hello"}
    )
    with pytest.raises(AnalysisError, match=r"analyze\(\) returned str"):
        _create(root, text, "text")()
    odd = type("Odd", (_Choose,), {"NAME": "odd", "plot": lambda self, r: object()})
    with pytest.raises(AnalysisError, match="Figure"):
        _create(root, odd, "odd")()


def test_a_borrowed_view_cannot_take_over_the_lifecycle(training_run) -> None:
    view = jobs.Stats.from_trainer(training_run)
    assert view.node == training_run.node and view.state is training_run.state
    assert repr(view).startswith("<Stats view of <GPTWithAnalysis")
    with pytest.raises(AnalysisError, match="cannot be replaced"):
        view.state = None
    for call in (view.setup, view.tick, view.finish, view):
        with pytest.raises(AnalysisError, match=r"trainer owns|never tick"):
            call()
    result = view.run()
    assert result.node == training_run.node and training_run.node.seq == 3


def test_the_debug_page_example_draws_with_seaborn(training_run) -> None:
    axes = jobs.activations_scope(training_run)
    assert isinstance(axes.figure, Figure)
    image = axes.collections[0].get_array()
    x = training_run.batch("train")["x"]
    np.testing.assert_allclose(
        np.asarray(image).reshape(32, 32),
        jobs.embed_reference(training_run, x)[0, :64, :128],
        **TOL,
    )


def test_plot_helpers_are_theseus_plot_itself() -> None:
    import theseus.plot

    for name in ("heatmap", "bar", "line", "scatter"):
        assert getattr(jobs.Stats, name) is getattr(theseus.plot, name)


class _Noisy(AnalysisBase, PretrainGPT):
    TARGET = MLP
    NAME = "noisy"
    STOCHASTIC = True

    def select(self, paths):
        return paths[0]

    def analyze(self, layer, inputs):
        out = layer(inputs.x, deterministic=inputs.deterministic)  # False with a key
        return {"x": inputs.x[:, :4, :8], "out": out[:, :4, :8]}

    def plot(self, results):
        return None


@pytest.mark.slow  # two more jobs and an eager replay with dropout
def test_a_stochastic_analysis_uses_the_nodes_key(root: Path) -> None:
    noisy = _create(root, _Noisy, "noisy", **{"architecture/dropout": 0.5}).compute()
    quiet_cls = type("Quiet", (_Noisy,), {"NAME": "quiet", "STOCHASTIC": False})
    job = _create(root, quiet_cls, "quiet", **{"architecture/dropout": 0.5})
    quiet = job.compute()
    assert not np.allclose(noisy["x"], quiet["x"])  # dropout before blocks_0/mlp
    layer, inputs = job.debug("blocks_0/mlp", key=job.step_key())  # the same key, eagerly
    np.testing.assert_allclose(noisy["x"], np.asarray(inputs.x)[:, :4, :8], **TOL)
    eager = np.asarray(layer(inputs.x, deterministic=False))[:, :4, :8]
    np.testing.assert_allclose(noisy["out"], eager, **TOL)
    _, plain = job.debug("blocks_0/mlp")
    np.testing.assert_allclose(quiet["x"], np.asarray(plain.x)[:, :4, :8], **TOL)


def test_user_mistakes_in_the_methods_name_the_method(root: Path) -> None:
    reads_state = type(
        "ReadsState",
        (_Choose,),
        {"NAME": "rs", "analyze": lambda self, layer, inputs: self.state.step},
    )
    with pytest.raises(AnalysisError, match=r"ReadsState\.analyze\(\) read self\.state"):
        _create(root, reads_state, "rs").compute()
    reads_batch = type(
        "ReadsBatch",
        (_Choose,),
        {"NAME": "rb", "analyze": lambda self, layer, inputs: self.batch()["x"]},
    )
    with pytest.raises(AnalysisError, match=r"read self\.batch\(\)"):
        _create(root, reads_batch, "rb").compute()
    raises = type("Raises", (_Choose,), {"NAME": "raises", "select": lambda self, paths: paths[9]})
    with pytest.raises(IndexError) as caught:  # the user's own exception, with a note
        _create(root, raises, "raises")
    assert caught.value.__notes__ == ["(raised in Raises.select())"]
    other = type("Other", (_Choose,), {"NAME": "other", "CHOICE": "blocks_0/mlp"})
    with pytest.raises(AnalysisSelectionError, match="another module type than TARGET"):
        _create(root, other, "other")


def test_result_files_follow_the_umask(root: Path) -> None:
    import os

    from theseus.analysis._publish import write_atomic

    previous = os.umask(0o022)
    try:
        path = write_atomic(root / "umask" / "r.json", b"{}")
    finally:
        os.umask(previous)
    assert path.read_bytes() == b"{}" and (path.stat().st_mode & 0o777) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary file left
