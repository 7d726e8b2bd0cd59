"""Sparse autoencoders against ground truth: a planted sparse dictionary, recovered.

Activations are made from a known dictionary (unit rows in random directions) and known
sparse codes (a few features active per example, with random magnitudes). Each
architecture, trained on them, must find the planted features: the mean over planted
features of the best decoder cosine is at least 0.95. The training step is traced once;
sharded over 4 virtual devices it equals one device's. Matching is checked against a
permutation made by hand, and a chain that trains on unchanged activations keeps every
feature matched.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from theseus.analysis.sae import (
    SAEConfig,
    encode,
    init_params,
    loss_and_metrics,
    make_train_step,
    match,
    measures,
)

FEATURES, D, ACTIVE = 32, 16, 2


def planted(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The planted dictionary ``[FEATURES, D]`` (always the same) and ``n`` activations
    made from it with the codes of ``seed``."""
    dictionary = np.random.default_rng(1234).normal(size=(FEATURES, D))
    dictionary /= np.linalg.norm(dictionary, axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    codes = np.zeros((n, FEATURES))
    for row in codes:
        row[rng.choice(FEATURES, ACTIVE, replace=False)] = rng.uniform(0.5, 1.5, ACTIVE)
    return dictionary.astype(np.float32), (codes @ dictionary).astype(np.float32)


SETTINGS = {
    "topk": {"k": ACTIVE},
    "relu": {"l1": 0.3},
    "jumprelu": {"l0": 0.1, "threshold": 0.1, "bandwidth": 0.05},
}


def train(config: SAEConfig, data: np.ndarray, steps: int, params=None, batch: int = 256):
    optimizer = optax.adam(3e-3)
    params = init_params(config, jax.random.key(0)) if params is None else params
    state = optimizer.init(params)
    traced = []

    def counted(*args):
        traced.append(1)  # runs once per trace, never per call
        return make_train_step(config, optimizer)(*args)

    step = jax.jit(counted)
    rng = np.random.default_rng(1)
    for _ in range(steps):
        rows = rng.integers(0, len(data), batch)
        params, state, _ = step(params, state, jnp.asarray(data[rows]))
    return params, len(traced)


def best_cosines(dictionary: np.ndarray, decoder: np.ndarray) -> np.ndarray:
    rows = np.array(decoder, np.float64)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return (dictionary @ rows.T).max(axis=1)


@pytest.mark.parametrize("architecture", ["topk", "relu", "jumprelu"])
def test_each_architecture_recovers_the_planted_features(architecture: str) -> None:
    dictionary, data = planted(20_000)
    config = SAEConfig(
        d_in=D, width=2 * FEATURES, architecture=architecture, **SETTINGS[architecture]
    )
    params, traces = train(config, data, steps=1500)
    assert traces == 1  # one compiled program for every step
    recovered = best_cosines(dictionary, params["W_dec"])
    assert recovered.mean() >= 0.95, (architecture, recovered.round(3))
    held_out = measures(params, jnp.asarray(planted(2_000, seed=7)[1]), config)
    assert float(held_out["fvu"]) < 0.25, held_out
    assert 0.5 * ACTIVE <= float(held_out["l0"]) <= 8 * ACTIVE, held_out
    if architecture == "topk":  # k features exactly, by construction
        assert float(held_out["l0"]) == pytest.approx(ACTIVE)


def test_fvu_and_dead_features_against_numpy() -> None:
    config = SAEConfig(d_in=D, width=8, architecture="relu")
    params = init_params(config, jax.random.key(3))
    params["b_enc"] = params["b_enc"].at[:3].set(-100.0)  # three features never fire
    x = planted(500, seed=4)[1]
    pre = (x - np.asarray(params["b_dec"])) @ np.asarray(params["W_enc"]) + np.asarray(
        params["b_enc"]
    )
    features = np.maximum(pre, 0)
    error = features @ np.asarray(params["W_dec"]) + np.asarray(params["b_dec"]) - x
    got = measures(params, jnp.asarray(x), config)
    fvu = (error**2).sum() / ((x - x.mean(axis=0)) ** 2).sum()
    assert float(got["fvu"]) == pytest.approx(fvu, rel=1e-5)
    assert float(got["l0"]) == pytest.approx((features > 0).sum(axis=1).mean(), rel=1e-6)
    assert float(got["dead"]) == pytest.approx(((features > 0).sum(axis=0) == 0).mean())
    assert float(got["dead"]) >= 3 / 8
    _, parts = loss_and_metrics(params, jnp.asarray(x), config)  # what a step reports
    np.testing.assert_array_equal(np.asarray(parts["fired"]), (features > 0).any(axis=0))


def test_topk_keeps_exactly_the_k_largest() -> None:
    config = SAEConfig(d_in=D, width=16, architecture="topk", k=3)
    params = init_params(config, jax.random.key(5))
    x = jnp.asarray(planted(64, seed=6)[1])
    got = np.asarray(encode(params, x, config))
    pre = np.asarray((x - params["b_dec"]) @ params["W_enc"] + params["b_enc"])
    for row, scores in zip(got, pre, strict=True):
        top = np.argsort(scores)[-3:]
        want = np.zeros_like(scores)
        want[top] = np.maximum(scores[top], 0)
        np.testing.assert_allclose(row, want, rtol=1e-6)


def test_topk_reports_the_features_that_fired_as_numpy_finds_them() -> None:
    """A step reads which top-k features fired from the kept indices: equal to NumPy's
    any(features > 0) over the dense activations, where some rows keep fewer than k
    positive activations (a kept value of zero did not fire) and some features never
    fire."""
    config = SAEConfig(d_in=D, width=16, architecture="topk", k=4)
    params = init_params(config, jax.random.key(8))
    params["b_enc"] = params["b_enc"].at[:10].set(-100.0).at[10:13].set(-1.0)
    x = planted(64, seed=9)[1]
    pre = (x - np.asarray(params["b_dec"])) @ np.asarray(params["W_enc"]) + np.asarray(
        params["b_enc"]
    )
    features = np.zeros_like(pre)
    for row, scores in zip(features, pre, strict=True):
        top = np.argsort(scores)[-4:]
        row[top] = np.maximum(scores[top], 0)
    want = (features > 0).any(axis=0)
    assert want.any() and not want[:10].any() and (features > 0).sum(axis=1).min() < 4
    _, parts = loss_and_metrics(params, jnp.asarray(x), config)
    np.testing.assert_array_equal(np.asarray(parts["fired"]), want)


def test_a_step_sharded_over_four_devices_equals_one_device() -> None:
    assert jax.device_count() >= 4
    _, data = planted(4096, seed=2)
    config = SAEConfig(d_in=D, width=64, architecture="relu", l1=0.3)
    optimizer = optax.adam(3e-3)
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    replicated = NamedSharding(mesh, PartitionSpec())
    step = make_train_step(config, optimizer)
    one = jax.jit(step)
    four = jax.jit(step, out_shardings=(replicated, replicated, replicated))
    alone = init_params(config, jax.random.key(0))
    spread = jax.device_put(alone, replicated)
    state_alone, state_spread = (
        optimizer.init(alone),
        jax.device_put(optimizer.init(alone), replicated),
    )
    for start in range(0, 10 * 256, 256):
        batch = data[start : start + 256]
        alone, state_alone, _ = one(alone, state_alone, jnp.asarray(batch))
        spread, state_spread, _ = four(spread, state_spread, jax.device_put(batch, rows))
    assert spread["W_dec"].sharding.is_equivalent_to(replicated, 2)
    for name in alone:
        np.testing.assert_allclose(
            np.asarray(spread[name]), np.asarray(alone[name]), rtol=2e-5, atol=2e-6
        )


def test_matching_finds_a_permutation_and_what_was_born_and_gone() -> None:
    rng = np.random.default_rng(8)
    old = rng.normal(size=(12, D))
    order = rng.permutation(12)
    new = old[order] + 0.01 * rng.normal(size=(12, D))
    new[[0, 5]] = rng.normal(size=(2, D))  # two features replaced by unrelated ones
    found = match(old, new)
    pairs = dict(found.pairs.tolist())
    for j in range(12):
        if j not in (0, 5):
            assert pairs[order[j]] == j  # the hand-made permutation, recovered
    assert sorted(found.born.tolist()) == [0, 5]
    assert sorted(found.gone.tolist()) == sorted(order[[0, 5]].tolist())
    assert found.matched == pytest.approx(10 / 12)
    with pytest.raises(ValueError, match=r"two \[features, d\] decoders of one d"):
        match(old, new[:, :3])


def test_a_chain_on_unchanged_activations_keeps_every_feature_matched() -> None:
    _, data = planted(20_000)
    config = SAEConfig(d_in=D, width=2 * FEATURES, architecture="topk", k=ACTIVE)
    first, _ = train(config, data, steps=1500)
    second, _ = train(config, data, steps=200, params=first)  # warm-started, same site
    found = match(np.asarray(first["W_dec"]), np.asarray(second["W_dec"]))
    assert found.matched == 1.0 and len(found.born) == len(found.gone) == 0


def test_a_step_trains_on_the_drawn_slots_and_refills_them_without_copying_the_buffer() -> None:
    """`Programs.update` against NumPy: the slots that now hold the new activations are
    the ones drawn, the SAE trained on what they held before (in their order), every
    other slot is untouched, and the compiled step holds no copy of the buffer (XLA
    copied it twice a step while the write was not ordered after the read)."""
    from theseus.analysis.sae._stream import Bank, Programs
    from theseus.training.sharding import ParameterShardingContext

    lanes, depth, length = 4, 32, 8
    config = SAEConfig(d_in=D, width=64, architecture="topk", k=ACTIVE)
    optimizer = optax.adam(3e-3)
    programs = Programs(
        None, Bank(("x",), ((config,),)), optimizer, ParameterShardingContext.create(),
        "test", lambda name: None, 4, 1, 1,
    )  # fmt: skip
    rng = np.random.default_rng(5)
    old = rng.normal(size=(lanes, depth, D)).astype(np.float32)
    fresh = rng.normal(size=(lanes, length, D)).astype(np.float32) + 10.0  # unlike any old row
    scale = 0.5
    saes = programs.start({"x": jnp.asarray(old)}, {"x": scale}, jax.random.key(1))
    opts = programs.init_optimizer(saes)
    before = jax.tree.map(np.asarray, saes)
    args = (saes, opts, {"x": jax.device_put(old, programs.lanes)}, programs.unfired(),
            {"x": jnp.asarray(fresh)}, jax.random.key(7), {"x": scale})  # fmt: skip
    hlo = programs.update.lower(*args).compile().as_text()
    shape = "f32[{},{},{}]".format(*args[2]["x"].sharding.shard_shape(old.shape))  # a device's part
    assert not [line for line in hlo.splitlines() if "copy(" in line and shape in line]

    new_saes, _, buffers, _, _ = programs.update(*args)
    new = np.asarray(buffers["x"])
    slots = np.zeros((lanes, length), int)
    for lane in range(lanes):
        for i in range(length):
            where = np.flatnonzero((new[lane] == fresh[lane, i]).all(axis=1))
            assert where.size == 1, (lane, i, where)
            slots[lane, i] = where[0]
        assert len(set(slots[lane])) == length  # distinct slots
        kept = np.setdiff1d(np.arange(depth), slots[lane])
        np.testing.assert_array_equal(new[lane, kept], old[lane, kept])
    drawn = np.take_along_axis(old, slots[..., None], axis=1).reshape(-1, D) * scale
    params, _, _ = jax.jit(make_train_step(config, optimizer))(
        jax.tree.map(jnp.asarray, before[0][0]), optimizer.init(before[0][0]), jnp.asarray(drawn)
    )
    for name in params:
        np.testing.assert_allclose(
            np.asarray(new_saes[0][0][name]), np.asarray(params[name]), rtol=1e-5, atol=1e-6
        )
