"""Recording Flax linen modules by interception, eagerly and under jit/grad/vmap/nn.scan."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.analysis.inspector import CaptureTraceError, capture, read_from_safetensors, tail

pytestmark = pytest.mark.safetensors

JIT = {"rtol": 2e-6, "atol": 2e-6}


class Attention(nn.Module):
    features: int

    def setup(self):
        self.qkv = nn.Dense(3 * self.features)
        self.out = nn.Dense(self.features)

    def __call__(self, x):
        q, k, v = jnp.split(self.qkv(x), 3, axis=-1)
        weights = jax.nn.softmax(q @ k.swapaxes(-1, -2) / np.sqrt(self.features), axis=-1)
        return self.out(weights @ v)


class Block(nn.Module):
    features: int

    def setup(self):
        self.ln = nn.LayerNorm()
        self.attn = Attention(self.features)

    def __call__(self, x):
        return x + self.attn(self.ln(x))


class Net(nn.Module):
    features: int = 8
    depth: int = 2

    def setup(self):
        self.blocks = [Block(self.features) for _ in range(self.depth)]
        self.head = nn.Dense(3)

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.fixture
def net_and_vars():
    net = Net()
    x = jax.random.normal(jax.random.key(0), (2, 5, 8))
    return net, net.init(jax.random.key(1), x), x


EXPECTED_KEYS = [
    "blocks_0.ln.__call__",
    "blocks_0.attn.qkv.__call__",
    "blocks_0.attn.out.__call__",
    "blocks_0.attn.__call__",
    "blocks_0.__call__",
    "blocks_1.ln.__call__",
    "blocks_1.attn.qkv.__call__",
    "blocks_1.attn.out.__call__",
    "blocks_1.attn.__call__",
    "blocks_1.__call__",
    "head.__call__",
]


def _by_hand(net, variables, x):
    """Call each submodule eagerly on the bound model."""
    bound = net.bind(variables)
    values = {}
    h = x
    for i, block in enumerate(bound.blocks):
        normed = block.ln(h)
        values[f"blocks_{i}.ln.__call__"] = normed
        values[f"blocks_{i}.attn.__call__.x"] = normed
        values[f"blocks_{i}.attn.qkv.__call__"] = block.attn.qkv(normed)
        values[f"blocks_{i}.attn.__call__"] = block.attn(normed)
        h = block(h)
        values[f"blocks_{i}.__call__"] = h
    values["head.__call__"] = bound.head(h)
    return values


def test_keys_and_values_eager_and_jit(net_and_vars, tmp_path):
    net, variables, x = net_and_vars
    reference = _by_hand(net, variables, x)
    with tail(net, tmp_path / "eager") as fm:
        out = fm.apply(variables, x)
    with tail(net, tmp_path / "jit") as fm:
        jax.jit(fm.apply)(variables, x).block_until_ready()
    np.testing.assert_allclose(out, net.apply(variables, x), rtol=0, atol=0)
    for folder, tol in (("eager", {"rtol": 0, "atol": 0}), ("jit", JIT)):
        data = read_from_safetensors(tmp_path / folder)
        assert list(data) == EXPECTED_KEYS
        for key, value in reference.items():
            if key in data:
                np.testing.assert_allclose(data[key], value, **tol, err_msg=key)


def test_inputs_by_argument_name(net_and_vars, tmp_path):
    net, variables, x = net_and_vars
    with tail(net, tmp_path, record="inputs", filter_=lambda p, m: p.endswith("attn")) as fm:
        jax.jit(fm.apply)(variables, x)
    data = read_from_safetensors(tmp_path)
    assert list(data) == ["blocks_0.attn.__call__.x", "blocks_1.attn.__call__.x"]
    reference = _by_hand(net, variables, x)
    for key in data:
        np.testing.assert_allclose(data[key], reference[key], **JIT)


def test_grad_and_vmap(net_and_vars, tmp_path):
    net, variables, x = net_and_vars
    only_head = {"filter_": lambda p, m: p == "head"}
    with tail(net, tmp_path / "grad", **only_head) as fm:
        grads = jax.grad(lambda v: fm.apply(v, x).sum())(variables)
    reference_grads = jax.grad(lambda v: net.apply(v, x).sum())(variables)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(reference_grads), strict=True):
        np.testing.assert_allclose(got, want, **JIT)
    with tail(net, tmp_path / "vmap", **only_head) as fm:
        jax.vmap(fm.apply, in_axes=(None, 0))(variables, x)
    expected = net.apply(variables, x)
    for folder in ("grad", "vmap"):
        data = read_from_safetensors(tmp_path / folder)
        np.testing.assert_allclose(data["head.__call__"], expected, **JIT)


class Layer(nn.Module):
    @nn.compact
    def __call__(self, carry, _):
        return jnp.tanh(nn.Dense(4, name="dense")(carry)), None


class Scanned(nn.Module):
    @nn.compact
    def __call__(self, x):
        stack = nn.scan(Layer, variable_axes={"params": 0}, split_rngs={"params": True}, length=3)
        return stack(name="layers")(x, None)[0]


def test_nn_scan_records_every_layer(tmp_path):
    model = Scanned()
    x = jax.random.normal(jax.random.key(2), (2, 4))
    variables = model.init(jax.random.key(3), x)
    with tail(model, tmp_path) as fm:
        jax.jit(fm.apply)(variables, x)
    data = read_from_safetensors(tmp_path)
    assert list(data) == ["layers.dense.__call__", "layers.__call__.0"]
    dense, h = [], x
    for i in range(3):
        params = jax.tree.map(lambda p, i=i: p[i], variables["params"]["layers"])
        pre = nn.Dense(4).apply({"params": params["dense"]}, h)
        dense.append(pre)
        h = jnp.tanh(pre)
    np.testing.assert_allclose(data["layers.dense.__call__"], np.concatenate(dense), **JIT)
    np.testing.assert_allclose(data["layers.__call__.0"][-2:], h, **JIT)
    with pytest.raises(CaptureTraceError, match="inside a transformation"):
        jax.jit(capture(model).apply)(variables, x)


def test_capture_returns_cropped_values_from_the_program(net_and_vars, tmp_path):
    net, variables, x = net_and_vars
    cropped = capture(
        net,
        filter_=lambda p, m: p == "blocks_1.attn",
        record="inputs",
        transform=lambda key, value: value[:, :2],
    )
    step = jax.jit(cropped.apply)
    out, got = step(variables, x)
    out_again, _ = step(variables, x + 1.0)
    assert step._cache_size() == 1
    assert list(got) == ["blocks_1.attn.__call__.x"]
    reference = _by_hand(net, variables, x)["blocks_1.attn.__call__.x"]
    np.testing.assert_allclose(got["blocks_1.attn.__call__.x"], reference[:, :2], **JIT)
    np.testing.assert_allclose(out, net.apply(variables, x), **JIT)
    np.testing.assert_allclose(out_again, net.apply(variables, x + 1.0), **JIT)
