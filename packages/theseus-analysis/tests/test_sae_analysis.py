"""`SAEBase`: SAEs trained on a site's activations streamed from the compiled forward.

The references are independent of the engine: the model applied eagerly with Flax's own
method interceptor (the site's output read, zeroed, or replaced by the SAE's
reconstruction computed in NumPy from the weights read back with the `safetensors`
library), NumPy's sort for the top contexts, the tokenizer for their text. A chain over
checkpoints that did not change (trained at learning rate 0) keeps every feature
matched; every compiled program is traced once over a lineage; four data-parallel
devices train the SAE one data-parallel device trains.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.analysis import AnalysisError
from theseus.analysis.sae import SAEBase
from theseus.config import ConfigRangeError
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.model.mlp import MLP
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Node, Store

jobs = import_module_or_file(str(Path(__file__).with_name("analysis_jobs.py")))
safetensors_numpy = pytest.importorskip("safetensors.numpy")

SITE = "blocks_1/mlp"
STEPS = 4  # a checkpoint at every step: nodes 0..3


class Features(SAEBase, PretrainGPT):
    TARGET = MLP
    NAME = "features"
    WIDTH = (64, 96)
    K = 4
    TOKENS = 4096
    BUFFER = 4
    EVAL_BATCHES = 2
    CONTEXTS = 5
    WINDOW = (4, 2)

    def select(self, paths: list[str]) -> str:
        return paths[-1]


class OtherK(Features):
    K = 3


class BothSites(Features):
    """Every MLP: with two widths, four SAEs from one activation pass."""

    def select(self, paths: list[str]) -> list[str]:
        return paths


class TrainWithFeatures(PretrainGPT):
    ANALYSIS = [BothSites]


def _train(root: Path, run: str, **settings: Any) -> None:
    with quick(root) as q:
        q.build(jobs.PretrainGPT, run)
        jobs.tiny(
            q.config,
            steps=STEPS,
            **{"training/analyze": False, "logging/checkpoint_interval": 1, **settings},
        )
        q.create()()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`moving`, trained (the chain over unchanged checkpoints trains its own `frozen`)."""
    root = tmp_path_factory.mktemp("sae")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    _train(root, "moving", **{"optimization/lr": 3e-3})
    return root


@pytest.fixture(scope="module")
def analyzed(trained: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """`Features` run on the last checkpoint of `moving`, in a copy of the root."""
    root = tmp_path_factory.mktemp("analyzed") / "root"
    shutil.copytree(trained, root)
    job = _at(root, Features, "moving", STEPS - 1)
    job()
    return root, job


@pytest.fixture
def root(trained: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "root"
    shutil.copytree(trained, copy)
    return copy


def _at(root: Path, cls: type, run: str, seq: int, **settings: Any) -> Any:
    with quick(root) as q:
        q.build(cls, f"{cls.NAME}-{run}")
        q.find().spec(run=run).checkpoint().seq(seq).resume()
        for key, value in settings.items():
            q.config[key] = value
        return q.create()


def _values(store: Store, node: Node, label: str) -> dict[str, Any]:
    prefix = f"sae/features/{label}/"
    return {k[len(prefix) :]: v for k, v in store.values(node).items() if k.startswith(prefix)}


def _features(store: Store, node: Node, label: str) -> dict[str, Any]:
    return json.loads(store.get(node)[f"features/{label}/features.json"].content)


def _weights(store: Store, node: Node, label: str) -> dict[str, np.ndarray]:
    content = store.get(node)[f"features/{label}/sae_weights.safetensors"].content
    return dict(safetensors_numpy.load(content))


# ---------------------------------------------------------------- the reference
class Reference:
    """The job's model applied eagerly on one device, the site's output seen or replaced."""

    def __init__(self, job: Any) -> None:
        self.apply = job.state.apply_fn
        self.params = jax.device_get(job.state.params)

    def run(self, batch: dict[str, Any], replace: Any = None) -> tuple[Any, np.ndarray]:
        """`(loss, the site's output)`; `replace(output)` is what the site returns instead."""
        seen: list[Any] = []

        def listen(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
            out = next_fun(*args, **kwargs)
            if context.method_name == "__call__" and "/".join(context.module.path) == SITE:
                seen.append(out)
                return out if replace is None else replace(out)
            return out

        with nn.intercept_methods(listen):
            _, loss = self.apply(
                {"params": self.params},
                batch["x"],
                batch["y"],
                batch["padding_mask"],
                deterministic=True,
            )
        return float(loss), np.asarray(seen[0], np.float64)


def encode(w: dict[str, np.ndarray], x: np.ndarray, k: int) -> np.ndarray:
    """SAELens's top-k SAE in NumPy: the k largest pre-activations, ReLU'd."""
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    keep = np.argsort(-pre, axis=-1)[..., :k]
    out = np.zeros_like(pre)
    np.put_along_axis(out, keep, np.maximum(np.take_along_axis(pre, keep, -1), 0), -1)
    return out


def decode(w: dict[str, np.ndarray], f: np.ndarray) -> np.ndarray:
    return f @ w["W_dec"] + w["b_dec"]


# --------------------------------------------------------------------- tests
@pytest.mark.slow  # the default suite's budget: nox -s slow runs it
def test_a_chain_over_unchanged_checkpoints_keeps_every_feature_compiled_once(root) -> None:
    # `frozen`: learning rate 1e-12, so no parameter moves a float32 ulp and every
    # checkpoint holds the same model (trained here: only this test reads it)
    _train(root, "frozen", **{"optimization/lr": 1e-12})
    with quick(root) as q:
        q.build(Features, "chain")
        q.find().spec(run="frozen").over()
        job = q.create()
        result = job()
    assert job.compiles == dict.fromkeys(
        ["fill", "scales", "start", "step", "evaluate", "contexts"], 1
    )
    nodes = result.nodes
    assert [n.seq for n in nodes] == list(range(STEPS))
    with Store(root / "store") as store:
        for label in (f"{SITE}/64", f"{SITE}/96"):
            first = _values(store, nodes[0], label)
            assert first["matched"] is None and first["tokens"] == 4096
            # a feature seen on the 512 held-out tokens fired on the 4,096 trained on too
            assert 0 <= first["dead_training"] <= first["dead"]
            assert _features(store, nodes[0], label)["previous"] is None
            for before, node in itertools.pairwise(nodes):
                values = _values(store, node, label)
                assert (values["matched"], values["born"], values["gone"]) == (1.0, 0, 0)
                doc = _features(store, node, label)
                assert doc["previous"] == before.serialize()
                # a warm start keeps each feature where it was
                assert [f["previous"] for f in doc["features"]] == list(range(doc["width"]))
                assert all(f["cosine"] > 0.9 for f in doc["features"])
    with quick(root) as q:  # a second walk of the same configuration skips every node
        q.build(Features, "chain")
        q.find().spec(run="frozen").over()
        assert len(q.create()().skipped) == STEPS


def test_measures_equal_the_eager_reference(analyzed) -> None:
    root, job = analyzed
    node = job.node
    ref = Reference(job)
    label = f"{SITE}/64"
    with Store(root / "store") as store:
        got = _values(store, node, label)
        w = {k: v.astype(np.float64) for k, v in _weights(store, node, label).items()}
    clean = zeroed = spliced = 0.0
    error = active = 0.0
    xs, fired = [], np.zeros(64, bool)
    for index in range(Features.EVAL_BATCHES):
        batch = job.read_batch(index, "val")
        loss, x = ref.run(batch)
        clean += loss / Features.EVAL_BATCHES
        zeroed += ref.run(batch, jnp.zeros_like)[0] / Features.EVAL_BATCHES
        flat = x.reshape(-1, x.shape[-1])
        f = encode(w, flat, Features.K)

        def splice(out: Any, w: dict[str, np.ndarray] = w) -> Any:
            rows = np.asarray(out, np.float64).reshape(-1, out.shape[-1])
            return jnp.asarray(decode(w, encode(w, rows, Features.K)).reshape(out.shape), out.dtype)

        spliced += ref.run(batch, splice)[0] / Features.EVAL_BATCHES
        error += float(np.sum((decode(w, f) - flat) ** 2))
        active += float(np.sum(f > 0))
        fired |= np.any(f > 0, axis=0)
        xs.append(flat)
    x = np.concatenate(xs)
    variance = float(np.sum((x - x.mean(axis=0)) ** 2))
    want = {
        "loss_clean": clean,
        "loss_zeroed": zeroed,
        "loss_spliced": spliced,
        "loss_recovered": (zeroed - spliced) / (zeroed - clean),
        "fvu": error / variance,
        "l0": active / len(x),
        "dead": float(np.mean(~fired)),
    }
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=2e-4, abs=1e-6), key
    assert zeroed > clean and 0 < got["fvu"] < 1 and got["l0"] <= Features.K


def test_top_contexts_are_the_largest_activations_with_their_text(analyzed) -> None:
    root, job = analyzed
    label = f"{SITE}/96"
    with Store(root / "store") as store:
        doc = _features(store, job.node, label)
        w = {k: v.astype(np.float64) for k, v in _weights(store, job.node, label).items()}
    batch = jax.device_get(job.inspection_batch())
    ids = np.asarray(batch["x"])
    length = ids.shape[1]
    _, x = Reference(job).run(batch)
    f = encode(w, x.reshape(-1, x.shape[-1]), Features.K)  # [tokens, width]
    assert doc["format"] == "theseus-sae-features/1" and doc["width"] == 96
    assert [feature["index"] for feature in doc["features"]] == list(range(96))
    checked = 0
    for feature in doc["features"]:
        column = f[:, feature["index"]]
        assert feature["density"] == pytest.approx(np.mean(column > 0), abs=1e-6)
        order = np.sort(column)[::-1]
        want = [v for v in order[: Features.CONTEXTS] if v > 0]
        assert [c["activation"] for c in feature["top"]] == pytest.approx(want, rel=1e-4, abs=1e-6)
        for context in feature["top"]:
            row, position = context["row"], context["position"]
            assert column[row * length + position] == pytest.approx(context["activation"], rel=1e-4)
            start = position - context["at"]
            assert context["tokens"] == [
                job.tokenizer.decode([t]) for t in ids[row, start : start + len(context["tokens"])]
            ]
            assert context["activations"] == pytest.approx(
                column[row * length + start : row * length + start + len(context["tokens"])],
                rel=1e-4,
                abs=1e-6,
            )
            checked += 1
    assert checked > 96  # most features read something


def test_in_tandem_the_sae_goes_on_from_one_validation_to_the_next(root) -> None:
    with quick(root) as q:
        q.build(TrainWithFeatures, "tandem")
        jobs.tiny(q.config, steps=STEPS, **{"optimization/lr": 3e-3})
        trainer = q.create()
        trainer()
    [view] = trainer.loop.views
    assert view.compiles["step"] == 1
    with Store(root / "store") as store:
        found = store.query().spec(run="tandem").artifact("features").artifacts()
        nodes = sorted((a.node for a in found), key=lambda n: n.seq)
        assert [n.seq for n in nodes] == [1, 3]  # the validations (after steps 2 and 4)
        for label in ("blocks_0/mlp/64", "blocks_0/mlp/96", f"{SITE}/64", f"{SITE}/96"):
            later = _features(store, nodes[1], label)
            assert later["previous"] == nodes[0].serialize()
            assert _values(store, nodes[1], label)["matched"] > 0.5


@pytest.mark.slow  # the default suite keeps the chain of one walk and the tandem chain
def test_a_new_job_chains_from_the_stored_sae_of_the_same_configuration(root) -> None:
    _at(root, Features, "moving", 1)()
    second = _at(root, Features, "moving", 2)
    second()
    other = _at(root, OtherK, "moving", 3)
    other()
    with Store(root / "store") as store:
        chained = _features(store, second.node, f"{SITE}/64")
        assert chained["previous"] == Node(second.node.name, second.node.nonce, 1).serialize()
        assert _values(store, second.node, f"{SITE}/64")["matched"] is not None
        # another configuration starts its own chain: K = 3 never warm-starts from K = 4
        assert _features(store, other.node, f"{SITE}/64")["previous"] is None


@pytest.mark.slow  # the default suite keeps the step's own 4-vs-1 device test (test_sae_core)
def test_four_data_parallel_devices_train_what_two_train(root) -> None:
    """The SAE's batch split 4 ways, then 2 (the model split 2 ways): the same SAE up to
    float rounding, which Adam's normalized steps carry into the weights' last digits."""
    assert len(jax.devices()) == 4
    label = f"{SITE}/64"
    weights, measures = [], []
    for shard in (1, 2):
        job = _at(root, Features, "moving", STEPS - 1, **{"training/shard": shard})
        assert job.sharding.data_parallel == 4 // shard
        job()
        with Store(root / "store") as store:
            weights.append(_weights(store, job.node, label))
            measures.append(_values(store, job.node, label))
    a, b = (w["W_dec"] / np.linalg.norm(w["W_dec"], axis=1, keepdims=True) for w in weights)
    assert np.sum(a * b, axis=1).min() > 0.9999  # measured 0.999998
    for key in ("fvu", "l0", "loss_spliced", "loss_recovered"):
        assert measures[0][key] == pytest.approx(measures[1][key], rel=1e-3), key
    # a feature that fires on one held-out token or none may differ: one of 64 at most
    assert measures[0]["dead"] == pytest.approx(measures[1]["dead"], abs=1.5 / 64)


class _Bad(SAEBase, PretrainGPT):
    TARGET = MLP
    NAME = "bad"
    TOKENS = 64

    def select(self, paths: list[str]) -> str:
        return paths[0]


@pytest.mark.parametrize(
    ("setting", "value", "expected"),
    [
        ("ARCHITECTURE", "gated", "sae/bad/architecture (Literal['topk', 'jumprelu', 'relu'],"),
        ("K", 0, "sae/bad/k (int >= 1, default 32)"),
        ("WIDTH", (64, -1), "sae/bad/width (list[int] >= 1, default [])"),
        ("L1", math.nan, "sae/bad/l1 (float >= 0, default 1.0)"),
        ("WINDOW", (4,), "sae/bad/window (tuple[int, int] >= 0, default (12, 3))"),
        ("TOKENS", 1.5, "sae/bad/tokens (int >= 1, default 262144)"),
        ("LEARNING_RATE", 0, "sae/bad/lr (float > 0, default 0.001)"),
        ("SEED", True, "sae/bad/seed (int, default 0)"),
    ],
)
def test_bad_settings_are_refused_where_the_class_is_made(setting, value, expected) -> None:
    """Refused by the schema the attribute is the default of (its type and range), in
    one line naming the attribute and what its setting admits."""
    admits = f"use a value its setting admits: {expected}"
    with pytest.raises(TypeError, match=rf"^Broken\.{setting} = .*; {re.escape(admits)}"):
        type("Broken", (_Bad,), {setting: value})


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"WIDTH": 2, "K": 4}, "'sae/bad/k' must be at most every width in 'sae/bad/width'"),
        ({"WIDTH": None, "EXPANSION": ()}, "'sae/bad/width' and 'sae/bad/expansion' are both"),
    ],
)
def test_settings_that_disagree_are_refused_by_the_schemas_rules(settings, expected) -> None:
    with pytest.raises(TypeError, match=rf"^Broken's class attributes disagree: .*{expected}"):
        type("Broken", (_Bad,), settings)
    assert type("Fine", (_Bad,), {"WIDTH": 4, "K": 4, "ARCHITECTURE": "topk"}).K == 4
    assert type("Fine", (_Bad,), {"WIDTH": 2, "K": 4, "ARCHITECTURE": "relu"}).K == 4  # no k


@pytest.mark.slow  # the default suite keeps the settings refused at class definition
def test_a_width_below_k_is_one_line_and_any_site_with_activations_trains(root) -> None:
    narrow = {"sae/bad/width": [], "sae/bad/expansion": [1], "sae/bad/k": 64}  # 32 wide
    with pytest.raises(AnalysisError, match=r"^_Bad at 'blocks_0/mlp' \(d = 32\): topk needs"):
        _at(root, _Bad, "moving", 1, **narrow)  # setting up refuses it, before it runs

    empty = {"sae/bad/width": [], "sae/bad/expansion": []}
    with pytest.raises(ConfigRangeError, match=r"'sae/bad/width' and 'sae/bad/expansion' are"):
        _at(root, _Bad, "moving", 1, **empty)

    class Twice(_Bad):
        def select(self, paths: list[str]) -> list[str]:
            return [paths[0], paths[0]]

    with pytest.raises(AnalysisError, match=r"^Twice\.select\(\) returned 'blocks_0/mlp' more"):
        _at(root, Twice, "moving", 1)

    class Attention(_Bad):
        TARGET = SelfAttention

    job = _at(root, Attention, "moving", 1)
    job()  # an attention layer's output is an activation too: it trains
    with Store(root / "store") as store:
        assert "sae/bad/blocks_0/attn/256/l0" in store.values(job.node)


@pytest.mark.slow  # the default suite keeps the README's commands, which set settings too
def test_settings_come_from_the_configuration_and_bad_ones_are_one_line(root) -> None:
    job = _at(root, Features, "moving", 1, **{"sae/features/k": 2, "sae/features/width": [48]})
    job()
    with Store(root / "store") as store:
        values = _values(store, job.node, f"{SITE}/48")
        assert 0 < values["l0"] <= 2
        assert not any(k.startswith(f"sae/features/{SITE}/64/") for k in store.values(job.node))
    with quick(root) as q:
        q.build(Features, "bad")
        with pytest.raises(Exception, match=r"'sae/features/k' must be .*>= 1; got 0"):
            q.config["sae/features/k"] = 0


@pytest.mark.slow  # the default suite keeps the top-level README's commands
def test_the_package_readme_example_runs(root) -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("## Sparse autoencoders", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    residual = namespace["Residual"]
    small = {"sae/residual/tokens": 1024, "sae/residual/expansion": [1, 2], "sae/residual/k": 4}
    job = _at(root, residual, "moving", 1, **small)
    job()
    with Store(root / "store") as store:
        for width in (32, 64):
            assert f"sae/residual/blocks_1/{width}/loss_recovered" in store.values(job.node)


def test_the_match_counts_live_features_and_born_and_gone_apart() -> None:
    """A hand-made pair of decoders: old features 0-3, new ones the same directions except
    that new 2 turned away (born) and old 3's direction is gone (new 3 is another one)."""
    from theseus.analysis.sae import match
    from theseus.analysis.sae._records import changes as _changes

    eye = np.eye(6)
    old = eye[[0, 1, 2, 3]]
    new = np.stack([eye[0], eye[1], (eye[2] + eye[4]) / np.sqrt(2), eye[5]])  # cos 0.71, 0
    pairing = match(old, new, 0.9)
    # new 0 fired in training, new 1 did not (a dead feature matches itself: not counted)
    now = np.array([True, False, True, True])
    before = np.array([True, True, True, False])  # old 3 was already dead
    got = _changes(pairing, before, now)
    assert got == {"matched": 1 / 3, "born": 2, "gone": 1}  # new 2, 3 born; old 2 gone
    assert _changes(pairing, None, now)["gone"] == 2  # unknown liveness: all count
