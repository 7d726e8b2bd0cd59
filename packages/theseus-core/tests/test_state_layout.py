"""A state layout's model part is traced and compiled once per model, context and sharding.

The parameters come out equal to plain Flax's `model.init` with the same key; each
layout keeps its own optimizer; a model that differs, a sharding that differs, or a
model that cannot be hashed gets an initializer of its own.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from theseus.model import GPT
from theseus.training import state as train_state
from theseus.training.sharding import ParameterShardingContext

BLOCK = 16


def tiny(width: int = 32) -> GPT:
    return GPT.build(n_layers=1, n_embd=width, n_head=2, vocab_size=48, block_size=BLOCK)


def plain_params(model: nn.Module, seed: int) -> dict:
    """Plain Flax, outside theseus: `model.init` under jit, the boxes taken off."""
    example = jnp.zeros((1, BLOCK), jnp.int32)
    return nn.unbox(jax.jit(model.init)(jax.random.key(seed), example)["params"])


def test_equal_models_share_one_compiled_initializer_and_keep_their_optimizers() -> None:
    sharding = ParameterShardingContext.create()
    adam, sgd = optax.adamw(1e-3), optax.sgd(0.1, momentum=0.9)
    first = train_state.layout(tiny(), adam, BLOCK, sharding)
    second = train_state.layout(tiny(), sgd, BLOCK, sharding)  # an equal model, built anew
    assert first.init is second.init

    a = train_state.initialize(first, seed=3)
    b = train_state.initialize(second, seed=4)
    assert first.init._cache_size() == 1  # two seeds, two optimizers: one compilation

    for state, seed, tx in ((a, 3, adam), (b, 4, sgd)):
        reference = plain_params(tiny(), seed)
        got, want = jax.tree.leaves_with_path(state.params), jax.tree.leaves_with_path(reference)
        assert [path for path, _ in got] == [path for path, _ in want]
        for (path, x), (_, y) in zip(got, want, strict=True):
            np.testing.assert_allclose(
                np.asarray(x),
                np.asarray(y),
                rtol=1e-6,
                atol=1e-7,
                err_msg=jax.tree_util.keystr(path),
            )
        expected = tx.init(reference)
        assert jax.tree.structure(state.opt_state) == jax.tree.structure(expected)
        for x, y in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(expected), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert int(state.step) == 0 and state.tx is tx
    assert not np.array_equal(
        np.asarray(a.params["wte"]["embedding"]), np.asarray(b.params["wte"]["embedding"])
    )


def test_another_width_or_strategy_gets_its_own_initializer() -> None:
    dp = ParameterShardingContext.create()
    fsdp = ParameterShardingContext.create(strategy="fsdp")
    tx = optax.adamw(1e-3)
    base = train_state.layout(tiny(32), tx, BLOCK, dp)
    wider = train_state.layout(tiny(64), tx, BLOCK, dp)
    split = train_state.layout(tiny(32), tx, BLOCK, fsdp)
    assert len({id(base.init), id(wider.init), id(split.init)}) == 3

    state = train_state.initialize(split, seed=0)
    embedding = state.params["wte"]["embedding"]
    assert embedding.sharding == split.shardings.params["wte"]["embedding"]
    assert embedding.sharding.spec != base.shardings.params["wte"]["embedding"].spec
    assert max(s.data.shape[1] for s in embedding.addressable_shards) == 32 // 4  # embed split


class Scaled(nn.Module):
    """A module with an array field: it cannot be hashed, so nothing of it is kept."""

    scale: np.ndarray

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(4)(x[..., None].astype(jnp.float32)) * self.scale


def test_a_model_that_cannot_be_hashed_is_traced_each_time() -> None:
    model = Scaled(np.ones(4, np.float32))
    with pytest.raises(TypeError):
        hash(model)
    sharding = ParameterShardingContext.create()
    first = train_state.layout(model, optax.sgd(0.1), BLOCK, sharding)
    second = train_state.layout(model, optax.sgd(0.1), BLOCK, sharding)
    assert first.init is not second.init
    state = train_state.initialize(second, seed=1)
    np.testing.assert_allclose(
        np.asarray(state.params["Dense_0"]["kernel"]),
        np.asarray(plain_params(model, 1)["Dense_0"]["kernel"]),
        rtol=1e-6,
    )


class Wide(nn.Module):
    """A one-layer module, hashable by its width."""

    features: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return nn.Dense(self.features)(x[..., None].astype(jnp.float32))


def test_only_the_sixteen_latest_models_are_kept() -> None:
    sharding, tx = ParameterShardingContext.create(), optax.sgd(0.1)
    first = train_state.layout(Wide(1), tx, BLOCK, sharding)
    assert train_state.layout(Wide(1), tx, BLOCK, sharding).init is first.init
    others = {  # sixteen more: Wide(1) becomes the least recently used, and goes
        features: train_state.layout(Wide(features), tx, BLOCK, sharding).init
        for features in range(2, 18)
    }
    assert train_state.layout(Wide(17), tx, BLOCK, sharding).init is others[17]
    assert train_state.layout(Wide(1), tx, BLOCK, sharding).init is not first.init
