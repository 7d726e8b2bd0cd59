"""Recording JAX pytree models: registered dataclasses, Equinox, Flax NNX.

Every recorded array is compared with the sub-module called by hand, eagerly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.tree_util import GetAttrKey

from theseus.analysis.inspector import (
    UnsupportedModelError,
    is_jax_model,
    is_torch_model,
    read_from_safetensors,
    tail,
)

pytestmark = pytest.mark.safetensors

EXACT = {"rtol": 0, "atol": 0}
JIT = {"rtol": 1e-6, "atol": 1e-6}


def test_documented_example_keys_in_order_of_first_call(doc_model, tmp_path):
    x = jnp.ones((2, 2))
    with tail(doc_model, tmp_path) as fm:
        out = fm(x)
    data = read_from_safetensors(tmp_path)
    assert list(data) == ["sub_model.linear.__call__", "sub_model.__call__"]
    expected = np.asarray(doc_model.sub_model.linear(x))
    np.testing.assert_allclose(data["sub_model.linear.__call__"], expected, **EXACT)
    np.testing.assert_allclose(data["sub_model.__call__"], expected, **EXACT)
    np.testing.assert_allclose(out, expected, **EXACT)


def test_values_match_hand_computation_and_jit(two_layer, x, tmp_path):
    first = np.asarray(two_layer.first(x))
    second = np.asarray(two_layer.second(jnp.tanh(two_layer.first(x))))
    with tail(two_layer, tmp_path / "eager") as fm:
        fm(x)
    with tail(two_layer, tmp_path / "jit") as fm:
        jax.jit(lambda m, v: m(v))(fm, x).block_until_ready()
    for folder, tol in (("eager", EXACT), ("jit", JIT)):
        data = read_from_safetensors(tmp_path / folder)
        assert list(data) == ["first.__call__", "second.__call__"]
        np.testing.assert_allclose(data["first.__call__"], first, **tol)
        np.testing.assert_allclose(data["second.__call__"], second, **tol)


def test_repeated_calls_concatenate_along_axis_0(two_layer, x, tmp_path):
    with tail(two_layer, tmp_path) as fm:
        fm(x, twice=True)
        fm(x[:2])
    data = read_from_safetensors(tmp_path)
    calls = [two_layer.first(x), two_layer.first(x * 2.0), two_layer.first(x[:2])]
    np.testing.assert_allclose(data["first.__call__"], np.concatenate(calls), **EXACT)
    assert data["second.__call__"].shape == (7, 2)


def test_separate_mode_keeps_call_boundaries(two_layer, x, tmp_path):
    with tail(two_layer, tmp_path, stack="separate") as fm:
        jax.jit(lambda m, v: m(v, twice=True))(fm, x)
    data = read_from_safetensors(tmp_path)
    assert list(data) == ["first.__call__#0", "first.__call__#1", "second.__call__#0"]
    np.testing.assert_allclose(data["first.__call__#0"], two_layer.first(x), **JIT)
    np.testing.assert_allclose(data["first.__call__#1"], two_layer.first(x * 2.0), **JIT)


def test_inputs_by_argument_name_and_both(two_layer, x, tmp_path):
    with tail(two_layer, tmp_path / "in", record="inputs") as fm:
        fm(x)
    with tail(two_layer, tmp_path / "both", record="both") as fm:
        fm(x)
    inputs = read_from_safetensors(tmp_path / "in")
    assert list(inputs) == ["first.__call__.x", "second.__call__.x"]
    np.testing.assert_allclose(inputs["first.__call__.x"], x, **EXACT)
    np.testing.assert_allclose(inputs["second.__call__.x"], jnp.tanh(two_layer.first(x)), **EXACT)
    both = read_from_safetensors(tmp_path / "both")
    assert list(both) == [
        "first.__call__.x",
        "first.__call__",
        "second.__call__.x",
        "second.__call__",
    ]


def test_filter_receives_string_and_key_object_paths(two_layer, x, tmp_path):
    seen = []

    def by_text(path, node):
        seen.append(path)
        return path == "second" and "sec" in path and path.endswith("ond")

    def by_keys(path, node):
        return len(path) == 1 and path[0] == GetAttrKey("first") and path == (GetAttrKey("first"),)

    with tail(two_layer, tmp_path / "text", filter_=by_text) as fm:
        fm(x)
    with tail(two_layer, tmp_path / "keys", filter_=by_keys) as fm:
        fm(x)
    assert list(read_from_safetensors(tmp_path / "text")) == ["second.__call__"]
    assert list(read_from_safetensors(tmp_path / "keys")) == ["first.__call__"]
    assert [str(p) for p in seen] == ["first", "second"]


def test_is_leaf_stops_descent(doc_model, tmp_path):
    with tail(doc_model, tmp_path, is_leaf=lambda p, n: p == "sub_model.linear") as fm:
        out = fm(jnp.ones((1, 2)))
    data = read_from_safetensors(tmp_path)
    assert list(data) == ["sub_model.__call__"]
    np.testing.assert_allclose(data["sub_model.__call__"], out, **EXACT)


def test_scalar_tuple_and_dict_outputs(rng, tmp_path):
    from dataclasses import dataclass

    from jax.tree_util import register_dataclass

    @register_dataclass
    @dataclass
    class Heads:
        w: jax.Array

        def __call__(self, x):
            y = x @ self.w
            return {"mean": y.mean(), "parts": (y, -y)}

    @register_dataclass
    @dataclass
    class Net:
        heads: Heads

        def __call__(self, x):
            return self.heads(x)

    net = Net(Heads(jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)))
    x = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
    with tail(net, tmp_path) as fm:
        fm(x)
        fm(x + 1)
    data = read_from_safetensors(tmp_path)
    assert list(data) == [
        "heads.__call__.mean",
        "heads.__call__.parts.0",
        "heads.__call__.parts.1",
    ]
    means = [float((x @ net.heads.w).mean()), float(((x + 1) @ net.heads.w).mean())]
    np.testing.assert_allclose(data["heads.__call__.mean"], means, rtol=1e-6)
    np.testing.assert_allclose(
        data["heads.__call__.parts.1"],
        -np.concatenate([x @ net.heads.w, (x + 1) @ net.heads.w]),
        **EXACT,
    )


def test_grad_records_primal_values(two_layer, x, tmp_path):
    with tail(two_layer, tmp_path) as fm:
        grads = jax.grad(lambda m, v: m(v).sum())(fm, x)
    data = read_from_safetensors(tmp_path)
    np.testing.assert_allclose(data["first.__call__"], two_layer.first(x), **JIT)
    reference = jax.grad(lambda m, v: m(v).sum())(two_layer, x)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(reference), strict=True):
        np.testing.assert_allclose(got, want, **JIT)


def test_vmap_records_the_batch_once(two_layer, x, tmp_path):
    with tail(two_layer, tmp_path / "once") as fm:
        jax.vmap(fm)(x)
        jax.vmap(fm)(x[:2])
    with tail(two_layer, tmp_path / "twice") as fm:
        jax.jit(jax.vmap(jax.vmap(fm)))(x.reshape(5, 1, 3))
    batched = np.asarray(two_layer.first(x))
    once = read_from_safetensors(tmp_path / "once")
    np.testing.assert_allclose(
        once["first.__call__"], np.concatenate([batched, batched[:2]]), **JIT
    )
    twice = read_from_safetensors(tmp_path / "twice")
    np.testing.assert_allclose(twice["first.__call__"], batched.reshape(5, 1, 4), **JIT)


def test_lax_scan_records_each_iteration(two_layer, x, tmp_path):
    def body(carry, row):
        return carry, fm.first(row)

    with tail(two_layer, tmp_path) as fm:
        jax.lax.scan(body, 0.0, x)
    data = read_from_safetensors(tmp_path)
    np.testing.assert_allclose(
        data["first.__call__"], np.asarray(two_layer.first(x)).reshape(-1), **JIT
    )


def test_nested_and_side_by_side_recorders_do_not_mix(two_layer, doc_model, x, tmp_path):
    with tail(two_layer, tmp_path / "outer", filter_=lambda p, n: p == "first") as outer:
        with tail(outer, tmp_path / "inner") as inner, tail(doc_model, tmp_path / "side") as side:
            inner(x)
            side(jnp.ones((1, 2)))
        outer(x[:1])
    outer_data = read_from_safetensors(tmp_path / "outer")
    inner_data = read_from_safetensors(tmp_path / "inner")
    side_data = read_from_safetensors(tmp_path / "side")
    assert list(outer_data) == ["first.__call__"]
    np.testing.assert_allclose(
        outer_data["first.__call__"], two_layer.first(jnp.concatenate([x, x[:1]])), rtol=1e-6
    )
    assert list(inner_data) == ["first.__call__", "second.__call__"]
    assert inner_data["first.__call__"].shape == (5, 4)
    assert list(side_data) == ["sub_model.linear.__call__", "sub_model.__call__"]


def test_equinox_model_with_bare_function_leaves(tmp_path):
    eqx = pytest.importorskip("equinox")

    class Stack(eqx.Module):
        layers: tuple

        def __call__(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    keys = jax.random.split(jax.random.key(3), 2)
    model = Stack((eqx.nn.Linear(4, 3, key=keys[0]), jax.nn.relu, eqx.nn.Linear(3, 2, key=keys[1])))
    x = jax.random.normal(jax.random.key(4), (4,))
    with tail(model, tmp_path) as fm:
        jax.jit(lambda m, v: m(v))(fm, x)
    data = read_from_safetensors(tmp_path)
    assert list(data) == ["layers.0.__call__", "layers.1.__call__", "layers.2.__call__"]
    h0 = model.layers[0](x)
    np.testing.assert_allclose(data["layers.0.__call__"], h0, **JIT)
    np.testing.assert_allclose(data["layers.1.__call__"], jax.nn.relu(h0), **JIT)
    np.testing.assert_allclose(data["layers.2.__call__"], model.layers[2](jax.nn.relu(h0)), **JIT)


def test_flax_nnx_model(tmp_path):
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.norm = nnx.LayerNorm(4, rngs=rngs)
            self.dense = nnx.Linear(4, 4, rngs=rngs)

        def __call__(self, x):
            return self.dense(self.norm(x))

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.block = Block(rngs)
            self.head = nnx.Linear(4, 2, rngs=rngs)

        def __call__(self, x):
            return self.head(self.block(x))

    net = Net(nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (3, 4))
    with tail(net, tmp_path) as fm:
        fm(x)
    data = read_from_safetensors(tmp_path)
    assert list(data) == [
        "block.norm.__call__",
        "block.dense.__call__",
        "block.__call__",
        "head.__call__",
    ]
    normed = net.block.norm(x)
    np.testing.assert_allclose(data["block.norm.__call__"], normed, **EXACT)
    np.testing.assert_allclose(data["head.__call__"], net.head(net.block.dense(normed)), **EXACT)


def test_model_kind_detection(doc_model):
    assert is_jax_model(doc_model)
    assert not is_jax_model(3)
    assert not is_jax_model(jnp.ones(3))
    assert not is_jax_model("text")
    assert not is_torch_model(doc_model)
    with pytest.raises(UnsupportedModelError, match="expected a JAX pytree model"):
        tail(jnp.ones(3))


def test_jitted_forward_is_reused_by_the_next_recording(two_layer, x, tmp_path):
    forward = jax.jit(lambda m, v: m(v))
    for run in range(3):
        with tail(two_layer, tmp_path / str(run)) as fm:
            forward(fm, x * run)
    assert forward._cache_size() == 1
    for run in range(3):
        data = read_from_safetensors(tmp_path / str(run))
        np.testing.assert_allclose(data["first.__call__"], two_layer.first(x * run), **JIT)
    forward(two_layer, x)  # outside a recording: nothing is delivered anywhere
    assert forward._cache_size() == 2


def test_nnx_with_a_custom_is_leaf_keeps_variables_intact(tmp_path):
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.first = nnx.Linear(3, 4, rngs=rngs)
            self.second = nnx.Linear(4, 2, rngs=rngs)

        def __call__(self, x):
            return self.second(self.first(x))

    net = Net(nnx.Rngs(0))
    x = jnp.ones((2, 3))
    with tail(net, tmp_path, is_leaf=lambda p, n: p == "second") as fm:
        out = fm(x)
    data = read_from_safetensors(tmp_path)
    assert list(data) == ["first.__call__"]
    np.testing.assert_array_equal(data["first.__call__"], net.first(x))
    np.testing.assert_array_equal(out, net(x))


def test_sharded_batch_under_jit_records_global_arrays(two_layer, tmp_path):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    assert len(jax.devices()) == 4  # the root conftest's virtual CPU devices
    mesh = jax.make_mesh((4,), ("data",))
    x = jax.device_put(
        jnp.arange(8 * 3, dtype=jnp.float32).reshape(8, 3) / 10, NamedSharding(mesh, P("data"))
    )
    with tail(two_layer, tmp_path) as fm:
        jax.jit(lambda m, v: m(v))(fm, x)
    data = read_from_safetensors(tmp_path)
    assert list(data) == ["first.__call__", "second.__call__"]
    np.testing.assert_allclose(data["first.__call__"], two_layer.first(np.asarray(x)), **JIT)
    np.testing.assert_allclose(data["second.__call__"], two_layer(np.asarray(x)), **JIT)
