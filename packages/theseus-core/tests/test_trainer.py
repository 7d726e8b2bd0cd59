"""BaseTrainer: the seed 003 examples, the step against a hand-written loop, cadence, errors."""

from __future__ import annotations

import math
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from theseus.config import ConfigError, ConfigRangeError
from theseus.data.datasets import FineWeb, Synthetic
from theseus.data.prepared import DataNotPreparedError
from theseus.model.models import GPT
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.training import checkpoints
from theseus.training.base import BaseTrainer, TrainerError
from theseus.training.checkpoints import CheckpointMismatchError
from theseus.training.flywheel.strategy import Sampling

jobs = import_module_or_file(str(Path(__file__).with_name("trainer_jobs.py")))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root with `synthetic` and a `fineweb` prepared from a parquet file written here."""
    root = tmp_path_factory.mktemp("root")
    Synthetic.prepare(root, tokens=60_000, val_tokens=8_000)
    source = root / "raw"
    source.mkdir()
    rng = np.random.default_rng(0)
    texts = ["".join(rng.choice(list("abcdefgh "), size=rng.integers(50, 400))) for _ in range(120)]
    pq.write_table(pa.table({"text": texts}), source / "shard-0.parquet")
    FineWeb.prepare(root, source=source, val_fraction=0.1)
    return root


def _train(root: Path, cls: type, run: str, steps: int = 8, **extra: object) -> BaseTrainer:
    with quick(root) as q:
        q.build(cls, run)
        jobs.tiny(q.config, steps=steps, **extra)
        trainer = q.create()
        trainer()
    return trainer


@pytest.mark.parametrize(
    "name", ["MyTrainer", "IgnoreFirstTarget", "LogitRMS", "StepMetrics", "DeterministicInspection"]
)
def test_seed_trainers_train_and_record(root: Path, name: str) -> None:
    trainer = _train(root, getattr(jobs, name), f"seed-{name.lower()}", steps=4)
    values = trainer.store.values(trainer.node)
    assert trainer.node.seq == 3 and int(trainer.state.step) == 4
    assert values["train/step"] == 4 and values["job/status"] == "finished"
    assert math.isfinite(values["train/loss"]) and math.isfinite(values["val/loss"])
    if name == "LogitRMS":
        logits, _, _ = trainer.forward(
            trainer.state, trainer.state.params, trainer.sharding.place_batch(trainer.batch())
        )
        rms = float(jnp.sqrt(jnp.mean(logits**2)))
        assert values["val/logit_rms"] == pytest.approx(float(values["val/logit_rms"]))
        assert values["train/logit_rms"] > 0 and abs(values["val/logit_rms"] - rms) < 0.5 * rms
    if name == "StepMetrics":
        assert values["train/grad_norm_squared"] == pytest.approx(
            values["train/grad_norm"] ** 2, rel=1e-5
        )
        rows, block = 8, 32
        assert values["val/valid_tokens"] == rows * block
    if name == "IgnoreFirstTarget":
        batch = trainer.batch()
        assert (batch["y"][:, 0] == -1).all()
        assert trainer.batch() is not batch and (trainer.batch()["y"][:, 0] == -1).all()
        assert (
            BaseTrainer.batch(trainer)["y"][:, 0] >= 0
        ).all()  # the cached base batch is untouched
    if name == "DeterministicInspection":
        placed = trainer.sharding.place_batch(trainer.batch())
        key = jax.random.key(1)
        a = trainer.trace(trainer.state, placed, key, sharding=trainer.sharding)[0]
        b = trainer.trace(trainer.state, placed, jax.random.key(2), sharding=trainer.sharding)[0]
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _hand_written_loop(trainer: BaseTrainer, batches: list[dict], lr: float) -> dict:
    """The same model, data and AdamW written directly with Flax and optax."""
    model = trainer.model
    params = nn.unbox(model.init(jax.random.key(trainer.args.seed), jnp.zeros((1, 32), jnp.int32)))[
        "params"
    ]
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(
            lr,
            b1=0.9,
            b2=0.95,
            eps=1e-8,
            weight_decay=0.1,
            mask=lambda p: jax.tree.map(lambda a: a.ndim >= 2, p),
        ),
    )
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, x, y):
        def loss_fn(p):
            logits = model.apply({"params": p}, x)[0]
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    for batch in batches:
        params, opt_state, _ = step(params, opt_state, batch["x"], batch["y"])
    return params


@pytest.fixture(scope="module")
def reference(root: Path) -> BaseTrainer:
    """`reference`: the tiny trainer, 6 steps; the tests below only read it."""
    return _train(root, jobs.SyntheticTrainer, "reference", steps=6)


def test_train_step_matches_a_hand_written_flax_optax_loop(
    root: Path, reference: BaseTrainer
) -> None:
    trainer = reference
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "reference-batches")
        jobs.tiny(q.config, steps=6)
        fresh = q.create()
        batches = []
        for _ in range(6):
            batches.append(fresh.batch("train"))
            fresh.tick()
    want = _hand_written_loop(fresh, batches, lr=3e-3)
    got = trainer.state.params
    for (path, a), b in zip(
        jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6, err_msg=jax.tree_util.keystr(path)
        )


def test_gradient_accumulation_matches_one_big_batch(root: Path) -> None:
    whole = _train(root, jobs.SyntheticTrainer, "acc-1", steps=3)
    split = _train(
        root, jobs.SyntheticTrainer, "acc-4", steps=3, **{"training/per_device_batch_size": 1}
    )
    assert split.accumulate_steps == 2  # 8 rows / (1 per device x 4 devices)
    for a, b in zip(
        jax.tree.leaves(whole.state.params), jax.tree.leaves(split.state.params), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_cadence_values_and_checkpoints_land_on_the_right_nodes(root: Path) -> None:
    trainer = _train(root, jobs.SyntheticTrainer, "cadence", steps=8)
    store = trainer.store
    nodes = sorted(store.query().nonce(trainer.node.nonce).all(), key=lambda n: n.seq)
    assert [n.seq for n in nodes] == list(range(8))
    steps = {n.seq: store.values(n).get("train/step") for n in nodes}
    assert steps == {0: None, 1: 2, 2: None, 3: 4, 4: None, 5: 6, 6: None, 7: 8}
    validated = [n.seq for n in nodes if "val/loss" in store.values(n)]
    assert validated == [3, 7]
    checkpointed = {
        n.seq: [c.step for c in store.checkpoints(n)] for n in nodes if store.checkpoints(n)
    }
    assert checkpointed == {3: [4], 7: [8]}
    meta = store.checkpoints(nodes[7])[0].meta
    assert meta["cursor"] == 7 and meta["step"] == 8 and meta["node"] == nodes[7].serialize()
    assert "architecture:" in meta["config"] and "n_embd: 32" in meta["config"]
    key = jax.random.fold_in(jax.random.key(trainer.args.seed), 7)
    assert meta["rng"] == np.asarray(jax.random.key_data(key)).tolist()
    latest = store.query().nonce(trainer.node.nonce).checkpoint().latest().first()
    assert latest.seq == 7


def test_train_function_compiles_once(reference: BaseTrainer) -> None:
    trainer = reference  # trained 6 steps, each validation and step by one program
    assert trainer.loop.compiled_train()._cache_size() == 1
    assert trainer.loop.compiled_val()._cache_size() == 1


@pytest.mark.slow  # test_strategies keeps fsdp with shard=2 against dp in the default suite
def test_parameter_sharding_gives_the_same_training(root: Path) -> None:
    plain = _train(root, jobs.SyntheticTrainer, "shard-1", steps=3)
    sharded = _train(root, jobs.SyntheticTrainer, "shard-2", steps=3, **{"training/shard": 2})
    kernel = sharded.state.params["blocks_0"]["mlp"]["c_fc"]["kernel"]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "shard")
    for a, b in zip(
        jax.tree.leaves(plain.state.params), jax.tree.leaves(sharded.state.params), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_validation_loss_drops_toward_the_entropy_bound(root: Path) -> None:
    trainer = _train(
        root,
        jobs.SyntheticTrainer,
        "learns",
        steps=120,
        **{
            "architecture/n_layers": 2,
            "architecture/n_embd": 64,
            "logging/validation_interval": 120,
            "logging/checkpoint_interval": 1000,
        },
    )
    loss = trainer.store.values(trainer.node)["val/loss"]
    bound = Synthetic.entropy_bound(root)
    assert bound < loss < 0.6 * math.log(258), (loss, bound)


def test_resume_and_branch_continue_from_the_checkpoint(root: Path) -> None:
    first = _train(root, jobs.SyntheticTrainer, "resumable", steps=4)
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "resumable")
        q.find().spec(run="resumable").checkpoint().latest().resume()
        q.config["training/tokens"] = 8 * 8 * 32
        resumed = q.create()
        assert resumed.node == first.node and int(resumed.state.step) == 4
        assert resumed.batch() == resumed.batch()
        np.testing.assert_array_equal(resumed.batch()["x"], first.batch()["x"])  # the batch it saw
        resumed()
    assert resumed.node.seq == 7 and resumed.node.nonce == first.node.nonce
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "branched")
        q.find().spec(run="resumable").checkpoint().latest().branch()
        branched = q.create()
        assert branched.node.seq == 0 and branched.store.parents(branched.node) == [resumed.node]
        assert int(branched.state.step) == 8


def test_unprepared_data_fails_at_setup_with_the_command(tmp_path: Path) -> None:
    with quick(tmp_path) as q:
        q.build(jobs.SyntheticTrainer, "nodata")
        jobs.tiny(q.config)
        with pytest.raises(
            DataNotPreparedError, match=f"theseus data prepare synthetic --root {tmp_path}"
        ):
            q.create()
        # the lineage it started says that it failed and why
        (node,) = q.store.query().spec(run="nodata").all()
        values = q.store.values(node)
        assert values["job/status"] == "failed"
        assert values["job/error"].startswith(
            "DataNotPreparedError: dataset 'synthetic' is not prepared"
        )


def test_bad_geometry_and_vocabulary_are_clear_errors(root: Path) -> None:
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "bad")
        jobs.tiny(q.config, **{"training/per_device_batch_size": 3})
        with pytest.raises(
            ConfigRangeError,  # the configuration alone tells, before the trainer is built
            match=r"'training/per_device_batch_size' must divide training/batch_size \(8\)",
        ):
            q.create()
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "bad-vocab")
        jobs.tiny(q.config, **{"architecture/vocab_size": 200})
        with pytest.raises(TrainerError, match="vocab_size = 200 is smaller"):
            q.create()


def test_rates_that_do_not_sum_to_one_are_an_error(root: Path) -> None:
    class Mixed(BaseTrainer):
        DATASET = [Sampling(Synthetic, 0.7), Sampling(FineWeb, 0.2)]

    with quick(root) as q:
        q.build(Mixed, "mixed")
        jobs.tiny(q.config)
        with pytest.raises(ValueError, match="sum to 1"):
            q.create()


def test_checkpoint_of_another_shape_names_the_parameter(root: Path) -> None:
    _train(root, jobs.SyntheticTrainer, "narrow", steps=4)
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "wide")
        q.find().spec(run="narrow").checkpoint().latest().branch()
        q.config["architecture/n_embd"] = 64
        with pytest.raises(
            CheckpointMismatchError, match=r"at params/blocks_0/\S+ the checkpoint has shape \(32"
        ):
            q.create()


def test_a_checkpoint_restores_without_reading_its_arrays_metadata(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint records its shapes in its meta: resuming compares the target with
    them and reads the state alone (orbax's per-array metadata, a third of a small
    model's restore, is never opened). The state restored is the one saved."""
    trained = _train(root, jobs.SyntheticTrainer, "recorded", steps=4)
    saved = jax.tree.map(np.asarray, trained.state.params)

    def refused() -> None:
        raise AssertionError("the arrays' metadata was read")

    monkeypatch.setattr(checkpoints, "_reader", refused)
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "recorded")
        q.find().spec(run="recorded").checkpoint().latest().resume()
        resumed = q.create()
    for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(resumed.state.params), strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))
    _, meta = resumed.read_checkpoint(resumed.checkpoint_path(resumed.node))
    assert "cursor" in meta and checkpoints.HELD not in meta  # the meta as the trainer saved it


def test_surgery_hook_adapts_a_checkpoint(root: Path) -> None:
    _train(root, jobs.SyntheticTrainer, "small-vocab", steps=4)

    class Grown(jobs.SyntheticTrainer):  # type: ignore[name-defined,misc]
        def surgery(self, saved, target):
            embedding = saved["params"]["wte"]["embedding"]
            grown = np.zeros(target["params"]["wte"]["embedding"].shape, np.float32)
            grown[: embedding.shape[0]] = embedding
            saved["params"]["wte"]["embedding"] = grown
            return {
                "step": saved["step"],
                "params": saved["params"],
                "opt_state": jax.tree.map(
                    lambda t: np.zeros(t.shape, t.dtype), target["opt_state"]
                ),
            }

    with quick(root) as q:
        q.build(Grown, "grown")
        q.find().spec(run="small-vocab").checkpoint().latest().branch()
        q.config["architecture/vocab_size"] = 300
        grown = q.create()
    table = np.asarray(grown.state.params["wte"]["embedding"])
    assert table.shape == (300, 32) and not table[258:].any() and table[:258].any()


def test_gpt_is_the_default_model() -> None:
    assert BaseTrainer.MODEL is GPT


@pytest.mark.parametrize(
    ("settings", "axis", "size", "fits"),
    [
        ({}, "'vocab'", "size 258", "among 1, 2 "),  # the default vocabulary
        (
            {"architecture/vocab_size": 260, "architecture/n_embd": 18, "architecture/n_head": 1},
            "'heads'",
            "size 54",  # c_attn's 3 x 18 outputs
            "among 1, 2 ",
        ),
        (
            {
                "architecture/vocab_size": 260,
                "architecture/mlp_ratio": 3,
                "architecture/n_embd": 34,
                "architecture/n_head": 1,
            },
            "'heads'",  # c_attn (3 x 34 = 102) comes before the MLP's 102
            "size 102",
            "among 1, 2 ",
        ),
    ],
)
def test_an_indivisible_sharded_dimension_is_a_config_error(
    root: Path, settings: dict[str, int], axis: str, size: str, fits: str
) -> None:
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "shard-indivisible")
        jobs.tiny(q.config, steps=2, **{"training/shard": 4, **settings})
        with pytest.raises(ConfigError) as caught:
            q.create().setup()
    message = str(caught.value)
    assert "training/shard = 4" in message and axis in message and size in message
    assert fits in message and "\n" not in message
