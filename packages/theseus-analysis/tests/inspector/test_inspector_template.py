"""Recording a model of an already wrapped structure reuses the wrapping (the template).

Every recording here is compared, key by key and bit for bit, with the submodules
called by hand on the model recorded at that moment.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.analysis.inspector import _template, read_from_safetensors, tail

pytestmark = [pytest.mark.safetensors, pytest.mark.equinox]


eqx = pytest.importorskip("equinox")


class Stack(eqx.Module):
    layers: tuple

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _eqx_stack(activation, seed):
    keys = jax.random.split(jax.random.key(seed), 2)
    return Stack((eqx.nn.Linear(4, 3, key=keys[0]), activation, eqx.nn.Linear(3, 2, key=keys[1])))


def _expected(model, x):
    h0 = model.layers[0](x)
    h1 = model.layers[1](h0)
    return {
        "layers.0.__call__": h0,
        "layers.1.__call__": h1,
        "layers.2.__call__": model.layers[2](h1),
    }


def test_same_structure_new_weights_and_another_function(tmp_path):
    x = jax.random.normal(jax.random.key(9), (4,))
    models = [
        _eqx_stack(jax.nn.relu, 0),
        _eqx_stack(jax.nn.relu, 0),  # equal structure, other objects
        _eqx_stack(jax.nn.relu, 1),  # new weights
        _eqx_stack(jnp.tanh, 1),  # another function leaf: another template
    ]
    _template._TEMPLATES.clear()
    for i, model in enumerate(models):
        with tail(model, tmp_path / str(i)) as fm:
            fm(x)
        data = read_from_safetensors(tmp_path / str(i))
        expected = _expected(model, x)
        assert list(data) == list(expected)
        for key, value in expected.items():
            np.testing.assert_array_equal(data[key], value, err_msg=f"model {i} {key}")
    assert len(_template._TEMPLATES) == 2


def test_tied_leaves_in_the_first_model_do_not_tie_the_next(two_layer, x, tmp_path):
    TwoLayer, Linear = type(two_layer), type(two_layer.first)
    bias = two_layer.first.bias  # [4], shared by both layers of the first model
    tied = TwoLayer(two_layer.first, Linear(jnp.eye(4), bias))
    untied = TwoLayer(two_layer.first, Linear(jnp.eye(4) * 2.0, jnp.arange(4.0)))
    _template._TEMPLATES.clear()
    for i, model in enumerate((tied, untied)):
        with tail(model, tmp_path / str(i)) as fm:
            fm(x)
        data = read_from_safetensors(tmp_path / str(i))
        h = jnp.tanh(model.first(x))
        np.testing.assert_array_equal(data["second.__call__"], model.second(h))
    assert len(_template._TEMPLATES) == 1  # the untied model reused the tied one's


def test_flax_nnx_model_recorded_twice(tmp_path):
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.dense = nnx.Linear(4, 4, rngs=rngs)
            self.head = nnx.Linear(4, 2, rngs=rngs)

        def __call__(self, x):
            return self.head(self.dense(x))

    net = Net(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (3, 4))
    for run in range(2):
        with tail(net, tmp_path / str(run)) as fm:
            fm(x * (run + 1))
        data = read_from_safetensors(tmp_path / str(run))
        hidden = net.dense(x * (run + 1))
        assert list(data) == ["dense.__call__", "head.__call__"]
        np.testing.assert_array_equal(data["dense.__call__"], hidden)
        np.testing.assert_array_equal(data["head.__call__"], net.head(hidden))
