"""Compiled interventions against eager references written here, with `nn.intercept_methods`.

Each reference applies the model eagerly on host copies of a checkpoint's parameters
(one device) and makes the same change by hand at the module call it concerns: a head
is ablated or patched by changing its slice of the attention's output projection input
(`blocks_i/attn/c_proj`), never through `SelfAttention.heads` or the helpers under test.
Sweeps are judged by every target's loss (`iv.token_losses`; the reference's are
computed here in float64 from its logits), so that differences are not those of two
batch means. Tolerance: each loss within 1e-5 relative of the reference's; a loss
change within 1e-5 of the losses' size (the largest), and each check also asserts that
the change it compares exceeds ten times that, so an intervention that did nothing fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.analysis import AnalysisError, InterventionBase, InterventionError
from theseus.analysis import interventions as iv
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.model.models import MLP
from theseus.quick import quick
from theseus.registry import import_module_or_file

HERE = Path(__file__).resolve().parent
jobs = import_module_or_file(str(HERE / "analysis_jobs.py"))
ivjobs = import_module_or_file(str(HERE / "intervention_jobs.py"))

RTOL = 1e-5
STEPS = 4
TRAINED = {"optimization/lr": 3e-3}  # checkpoints at steps 2 and 4


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT trained 4 steps with checkpoints at steps 2 and 4 (run `trained`)."""
    root = tmp_path_factory.mktemp("interventions")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(PretrainGPT, "trained")
        jobs.tiny(q.config, steps=STEPS, **TRAINED)
        q.create()()
    return root


# An OLMo-2-like block: grouped-query heads, QK-norm, post-norm residual, SwiGLU, untied.
GQA = {
    "architecture/n_layers": 1,
    "architecture/n_head": 4,
    "architecture/n_kv_head": 2,
    "architecture/norm": "rmsnorm",
    "architecture/residual": "post_norm",
    "architecture/qk_norm": True,
    "architecture/activation": "silu",
    "architecture/gated_mlp": True,
    "architecture/tie_embeddings": False,
}


@pytest.fixture(scope="module")
def gqa_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As `root`, for the OLMo-2-like block `GQA` (the head helpers on grouped heads)."""
    root = tmp_path_factory.mktemp("interventions-gqa")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    with quick(root) as q:
        q.build(PretrainGPT, "trained")
        jobs.tiny(q.config, steps=STEPS, **TRAINED, **GQA)
        q.create()()
    return root


@pytest.fixture(params=["gpt", pytest.param("gqa", marks=pytest.mark.slow)])
def any_root(request: pytest.FixtureRequest) -> Path:
    """`root`, then `gqa_root` (in the slow set: the default suite's budget)."""
    root: Path = request.getfixturevalue("root" if request.param == "gpt" else "gqa_root")
    return root


def _on_checkpoint(root: Path, cls: type, first: bool = False, **settings: Any) -> Any:
    """`cls` set up on the latest checkpoint of `trained` (or its first one)."""
    with quick(root) as q:
        q.build(cls, f"{cls.NAME}-run")
        if first:
            saved = q.store.query().spec(run="trained").checkpoints()
            q.find().node(min((c.node for c in saved), key=lambda n: n.seq)).resume()
        else:
            q.find().spec(run="trained").checkpoint().latest().resume()
        for key, value in settings.items():
            q.config[key] = value
        return q.create()


class Reference:
    """The checkpoint's model applied eagerly, on one device, with hand-made changes."""

    def __init__(self, job: Any) -> None:
        self.apply = job.state.apply_fn
        self.params = jax.device_get(job.state.params)
        self.batch = jax.device_get(job.inspection_batch())
        self.n_layers = job.model.config.n_layers
        self.n_head = job.model.attention.n_head
        self.width = job.model.config.n_embd

    def run(self, changes: dict[str, Any] | None = None, batch: Any = None) -> Any:
        """`(logits, loss)`; `changes[path](next_fun, args, kwargs)` makes that call."""
        changes = changes or {}
        rows = self.batch if batch is None else batch

        def listen(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
            path = "/".join(context.module.path)
            if context.method_name == "__call__" and path in changes:
                return changes[path](next_fun, args, kwargs)
            return next_fun(*args, **kwargs)

        with nn.intercept_methods(listen):
            return self.apply(
                {"params": self.params},
                rows["x"],
                rows["y"],
                rows["padding_mask"],
                deterministic=True,
            )

    def token_losses(self, logits: Any, batch: Any = None) -> np.ndarray:
        """Each target's cross-entropy in float64 (0 where not counted)."""
        rows = self.batch if batch is None else batch
        z = np.asarray(logits, np.float64)
        logp = z - z.max(-1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
        y = np.asarray(rows["y"])
        counted = (y >= 0) & np.asarray(rows["padding_mask"]).astype(bool)
        picked = np.take_along_axis(logp, np.where(counted, y, 0)[..., None], -1)[..., 0]
        return np.where(counted, -picked, 0.0)

    def losses(self, changes: dict[str, Any] | None = None, batch: Any = None) -> np.ndarray:
        """`token_losses` of `run(changes, batch)`."""
        return self.token_losses(self.run(changes, batch)[0], batch)

    def heads_in(self, x: jax.Array) -> jax.Array:
        """`c_proj`'s input split by head: `[batch, seq, n_head, head_dim]`."""
        return x.reshape(*x.shape[:-1], self.n_head, self.width // self.n_head)

    def c_proj_inputs(self, batch: Any = None) -> dict[int, jax.Array]:
        """Each layer's attention `c_proj` input, recorded."""
        seen: dict[int, jax.Array] = {}

        def recorder(layer: int) -> Any:
            def record(next_fun: Any, args: Any, kwargs: Any) -> Any:
                seen[layer] = args[0]
                return next_fun(*args, **kwargs)

            return record

        self.run({f"blocks_{i}/attn/c_proj": recorder(i) for i in range(self.n_layers)}, batch)
        return seen

    def with_head(self, layer: int, head: int, value: Any) -> dict[str, Any]:
        """A change setting head `head`'s slice of layer `layer`'s `c_proj` input."""

        def change(next_fun: Any, args: Any, kwargs: Any) -> Any:
            z = self.heads_in(args[0])
            replaced = value(z[:, :, head]) if callable(value) else value
            z = z.at[:, :, head].set(replaced)
            return next_fun(z.reshape(args[0].shape), *args[1:], **kwargs)

        return {f"blocks_{layer}/attn/c_proj": change}


def _rolled(batch: Any) -> Any:
    return {k: np.roll(v, 1, axis=0) for k, v in batch.items()}


def _close_change(got: Any, want: Any, scale: Any) -> None:
    """`got` within 1e-5 of `scale` (the losses' size) of `want`, which must be 10x that."""
    atol = RTOL * float(np.max(np.abs(scale)))
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)
    assert np.abs(want).max() > 10 * atol, "the change is too small for the check to fail"


@pytest.mark.slow  # the default suite keeps one sweep, patching, sharding and the errors
def test_zero_and_mean_ablation_match_the_eager_reference(root: Path) -> None:
    job = _on_checkpoint(root, ivjobs.ZeroMLP)
    got = job().values
    ref = Reference(job)
    clean = ref.losses()
    zeroed = ref.losses({"blocks_1/mlp": lambda f, a, k: jnp.zeros_like(f(*a, **k))})
    np.testing.assert_allclose(got["baseline"], clean, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(got["intervened"], zeroed, rtol=RTOL, atol=1e-6)
    _close_change(got["intervened"] - got["baseline"], zeroed - clean, clean)

    job = _on_checkpoint(root, ivjobs.MeanAttention)
    got = job().values

    def mean_out(f: Any, a: Any, k: Any) -> Any:
        out = f(*a, **k)
        return jnp.broadcast_to(out.mean(axis=(0, 1)), out.shape)

    meaned = ref.losses({"blocks_0/attn": mean_out})
    np.testing.assert_allclose(got["intervened"], meaned, rtol=RTOL, atol=1e-6)
    _close_change(got["intervened"] - got["baseline"], meaned - clean, clean)


@pytest.mark.parametrize("how", ["zero", pytest.param("mean", marks=pytest.mark.slow)])
def test_head_ablation_sweep_matches_the_reference_head_by_head(any_root: Path, how: str) -> None:
    cls = ivjobs.HeadAblationTokens if how == "zero" else ivjobs.MeanHeadAblationTokens
    job = _on_checkpoint(any_root, cls)
    got = np.asarray(job().values)
    ref = Reference(job)
    clean = ref.losses()
    want = np.zeros((ref.n_layers, ref.n_head, *clean.shape))
    for layer in range(ref.n_layers):
        for head in range(ref.n_head):
            value = 0.0 if how == "zero" else (lambda z: jnp.broadcast_to(z.mean((0, 1)), z.shape))
            want[layer, head] = ref.losses(ref.with_head(layer, head, value)) - clean
    assert got.shape == want.shape
    _close_change(got, want, clean)
    assert job.traces == 1


@pytest.mark.slow  # the default suite keeps one sweep, patching, sharding and the errors
def test_the_mean_loss_sweep_writes_its_json(root: Path) -> None:
    job = _on_checkpoint(root, ivjobs.HeadAblation)
    result = job()
    tokens = np.asarray(_on_checkpoint(root, ivjobs.HeadAblationTokens)().values)
    ref = Reference(job)
    counted = np.asarray(ref.batch["y"] >= 0).sum()
    # The mean loss's change is the mean of the targets' changes (all are counted here).
    np.testing.assert_allclose(result.values, tokens.sum((-2, -1)) / counted, atol=2e-6)
    np.testing.assert_allclose(json.loads(result.artifact.content), result.values, rtol=1e-7)


def test_a_sweep_compiles_once_across_checkpoints_and_batches(root: Path) -> None:
    job = _on_checkpoint(root, ivjobs.HeadAblation)
    first = job.compute()
    fn = job._compiled_analysis()
    earlier = _on_checkpoint(root, ivjobs.HeadAblation, first=True)
    # Another checkpoint's parameters (the state's static fields, its model and optimizer,
    # are this job's: another job's would be another program).
    job.state = job.state.replace(params=earlier.state.params)
    second = job.compute()
    other = _rolled(jax.device_get(job.inspection_batch()))
    third = fn(job.state, job.sharding.place_batch(other), None)
    theirs = fn(job.state, earlier.inspection_batch(), None)
    assert job.traces == 1 and fn._cache_size() == 1
    np.testing.assert_allclose(theirs, earlier.compute(), rtol=RTOL)
    assert not np.allclose(first, second) and not np.allclose(np.asarray(third), second)


def test_patching_the_last_block_reproduces_the_source_logits(root: Path) -> None:
    job = _on_checkpoint(root, ivjobs.PatchLastBlock)
    got = job().values
    ref = Reference(job)
    clean_logits, _ = ref.run()
    corrupted_logits, _ = ref.run(batch=_rolled(ref.batch))
    np.testing.assert_array_equal(got["intervened"], got["source"])  # exactly
    np.testing.assert_allclose(got["source"], clean_logits, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(got["baseline"], corrupted_logits, rtol=RTOL, atol=1e-6)
    assert not np.allclose(got["baseline"], got["source"], atol=1e-3)


def _patch_reference(ref: Reference) -> tuple[Any, Any, Any]:
    """Real patching of every head from the clean batch into the rolled one: loss changes."""
    corrupted = _rolled(ref.batch)
    source = ref.c_proj_inputs()
    measure = ref.losses

    base = measure({}, corrupted)
    want = np.zeros((ref.n_layers, ref.n_head, *np.shape(base)))
    for layer in range(ref.n_layers):
        for head in range(ref.n_head):
            value = ref.heads_in(source[layer])[:, :, head]
            want[layer, head] = measure(ref.with_head(layer, head, value), corrupted) - base
    return want, base, measure({}, ref.batch)


@pytest.mark.slow  # the default suite keeps one sweep, patching, sharding and the errors
def test_head_patching_matches_the_reference(any_root: Path) -> None:
    job = _on_checkpoint(any_root, ivjobs.PatchHeadsTokens)
    got = job().values
    want, base, clean = _patch_reference(Reference(job))
    np.testing.assert_allclose(got["baseline"], base, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(got["source"], clean, rtol=RTOL, atol=1e-6)
    _close_change(got["change"], want, base)


@pytest.mark.slow  # the default suite keeps one sweep, patching, sharding and the errors
def test_attribution_patching_is_the_first_order_estimate(root: Path) -> None:
    """The linear estimate equals grad . (patched - output) computed by hand.

    (How well it agrees with real patching is measured by the README's example, slow,
    and by benchmarks/interventions.py on the demo model.)
    """
    job = _on_checkpoint(root, ivjobs.AttributeHeads)
    got = job().values
    ref = Reference(job)
    corrupted = _rolled(ref.batch)
    source, target = ref.c_proj_inputs(), ref.c_proj_inputs(corrupted)

    def loss_with(deltas: list[jax.Array]) -> jax.Array:
        changes = {
            f"blocks_{i}/attn": (lambda d: lambda f, a, k: f(*a, **k) + d)(deltas[i])
            for i in range(ref.n_layers)
        }
        return ref.run(changes, batch=corrupted)[1]

    zeros = [jnp.zeros(target[i].shape) for i in range(ref.n_layers)]
    base, grads = jax.value_and_grad(loss_with)(zeros)
    head_dim = ref.width // ref.n_head
    estimate = np.zeros((ref.n_layers, ref.n_head))
    for layer in range(ref.n_layers):
        kernel = ref.params[f"blocks_{layer}"]["attn"]["c_proj"]["kernel"]
        for head in range(ref.n_head):
            rows = slice(head * head_dim, (head + 1) * head_dim)
            dz = ref.heads_in(source[layer])[:, :, head] - ref.heads_in(target[layer])[:, :, head]
            estimate[layer, head] = float(jnp.sum(grads[layer] * (dz @ kernel[rows])))
    np.testing.assert_allclose(got["baseline"], base, rtol=RTOL)
    # The estimate's change, `(base + g.d) - base` in float32, keeps g.d to base's ulps.
    np.testing.assert_allclose(got["change"], estimate, rtol=0, atol=RTOL * float(base))
    assert np.abs(estimate).max() > 1e-4


@pytest.mark.slow  # the default suite keeps one sweep, patching, sharding and the errors
def test_steering_changes_the_next_token_distribution_as_the_reference(root: Path) -> None:
    job = _on_checkpoint(root, ivjobs.Steer)
    got = job().values
    ref = Reference(job)
    vector = ivjobs.STEER_SCALE * ivjobs.steering_vector(ref.width)
    clean, _ = ref.run()
    steered, _ = ref.run({"blocks_0": lambda f, a, k: f(*a, **k) + vector})
    p = jax.nn.log_softmax(np.asarray(clean[:, -1], np.float64))
    q = jax.nn.log_softmax(np.asarray(steered[:, -1], np.float64))
    want = float(np.mean(np.sum(np.exp(p) * (p - q), axis=-1)))
    assert want > 1e-3
    np.testing.assert_allclose(got["kl"], want, rtol=1e-4)  # a KL: a difference of logs


def test_sharded_over_four_devices_equals_the_one_device_reference(root: Path) -> None:
    assert len(jax.devices()) == 4
    job = _on_checkpoint(root, ivjobs.HeadAblationTokens, **{"training/shard": 2})
    assert dict(job.sharding.mesh.shape) == {"batch": 2, "shard": 2}
    got = np.asarray(job().values)
    ref = Reference(job)
    clean = ref.losses()
    want = np.array(
        [
            [ref.losses(ref.with_head(i, h, 0.0)) - clean for h in range(ref.n_head)]
            for i in range(ref.n_layers)
        ]
    )
    _close_change(got, want, clean)


@pytest.mark.slow  # the default suite keeps one sweep, patching, sharding and the errors
def test_in_tandem_the_sweep_runs_at_every_validation_compiled_once(root: Path) -> None:
    with quick(root) as q:
        q.build(ivjobs.TrainWithHeadAblation, "tandem")
        jobs.tiny(q.config, steps=4, **{"optimization/lr": 3e-3})
        trainer = q.create()
        trainer()
    view = trainer.loop.views[0]
    assert view.traces == 1
    store = trainer.store
    found = store.query().spec(run="tandem").artifact("head-ablation").artifacts()
    by_seq = {a.node.seq: np.asarray(json.loads(a.content)) for a in found}
    assert len(by_seq) == 2  # validations at steps 2 and 4
    for seq, values in by_seq.items():
        with quick(root) as q:
            q.build(ivjobs.HeadAblation, "standalone")
            q.find().spec(run="tandem").checkpoint().seq(seq).resume()
            alone = np.asarray(q.create()().values)
        np.testing.assert_allclose(values, alone, rtol=RTOL, atol=1e-7)


class _Base(InterventionBase, PretrainGPT):
    TARGET = SelfAttention
    NAME = "bad"

    def select(self, paths):
        return paths[0]

    def intervene(self, site):
        return iv.zero(site)

    def plot(self, results):
        return None


class WrongShape(_Base):
    def intervene(self, site):
        return site.output[:, :1]


class VectorMeasure(_Base):
    ESTIMATE = "linear"

    def measure(self, outcome):
        return iv.token_losses(outcome)


class UnevenVariants(_Base):
    def select(self, paths):
        return paths

    def variants(self, layer):
        return 2 if layer.path.startswith("blocks_0") else 3


class PatchWithoutSource(_Base):
    def intervene(self, site):
        return iv.patch(site)


class ReadsState(_Base):
    def intervene(self, site):
        return site.output + self.state.params["wte"]["embedding"][0]


@pytest.mark.parametrize(
    ("cls", "error", "words"),
    [
        (WrongShape, InterventionError, "returned shape (8, 1, 32); the call returned (8, 32, 32)"),
        (VectorMeasure, InterventionError, "must return one scalar"),
        (UnevenVariants, InterventionError, "'blocks_0/attn': 2, 'blocks_1/attn': 3"),
        (PatchWithoutSource, InterventionError, "define corrupt(batch)"),
        (ReadsState, AnalysisError, "ReadsState.intervene() read self.state"),
    ],
)
def test_a_bad_intervention_is_a_one_line_error(
    root: Path, cls: type, error: type, words: str
) -> None:
    job = _on_checkpoint(root, cls)
    before = job.store.query().spec(run="trained").artifact().count()
    with pytest.raises(error) as caught:
        job()
    message = str(caught.value)
    assert words in message and "\n" not in message, message
    assert job.store.query().spec(run="trained").artifact().count() == before


def test_an_unknown_estimate_is_refused_at_class_definition() -> None:
    with pytest.raises(TypeError, match="use 'exact'"):

        class Bogus(_Base):
            ESTIMATE = "approximate"


def test_head_helpers_need_a_layer_with_heads(root: Path) -> None:
    class AblateMLPHead(_Base):
        TARGET = MLP

        def intervene(self, site):
            return iv.ablate_head(site, 0)

    with pytest.raises(InterventionError, match="has no heads"):
        _on_checkpoint(root, AblateMLPHead)()
