"""Lone modules, exceptions inside a recording, transforms, docstring examples."""

from __future__ import annotations

import doctest
import importlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.analysis.inspector import (
    EmptyRecordingWarning,
    UnsupportedModelError,
    capture,
    read_from_safetensors,
    tail,
)

pytestmark = pytest.mark.safetensors


def test_lone_equinox_module_is_recorded_as_call(tmp_path):
    eqx = pytest.importorskip("equinox")
    linear = eqx.nn.Linear(3, 2, key=jax.random.key(0))
    x = jnp.arange(3.0)
    with tail(linear, tmp_path) as fm:
        out = fm(x)
    data = read_from_safetensors(tmp_path)
    assert list(data) == ["__call__"]
    np.testing.assert_array_equal(data["__call__"], linear(x))
    np.testing.assert_array_equal(out, linear(x))


def test_lone_linen_module_records_inputs_and_output(tmp_path):
    dense = nn.Dense(2)
    x = jnp.ones((4, 3))
    variables = dense.init(jax.random.key(0), x)
    with tail(dense, tmp_path, record="both") as fm:
        fm.apply(variables, x)
    data = read_from_safetensors(tmp_path)
    assert list(data) == ["__call__.inputs", "__call__"]
    np.testing.assert_array_equal(data["__call__"], dense.apply(variables, x))
    np.testing.assert_array_equal(data["__call__.inputs"], x)


class Inner(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3, name="proj")(x) * 2.0


class Outer(nn.Module):
    @nn.compact
    def __call__(self, x):
        return Inner(name="inner")(x).sum(-1)


def test_linen_is_leaf_and_nested_recorders(tmp_path):
    model = Outer()
    x = jax.random.normal(jax.random.key(1), (2, 4))
    variables = model.init(jax.random.key(2), x)
    stop_at_inner = {"is_leaf": lambda p, m: p == "inner"}
    with (
        pytest.warns(EmptyRecordingWarning, match=r"inner\.__call__, inner\.proj\.__call__"),
        tail(model, tmp_path / "leaf", **stop_at_inner) as fm,
    ):
        fm.apply(variables, x)
    with tail(model, tmp_path / "proj", is_leaf=lambda p, m: p == "inner.proj") as fm:
        fm.apply(variables, x)
    assert list(read_from_safetensors(tmp_path / "proj")) == ["inner.__call__"]
    with (
        tail(model, tmp_path / "outer", filter_=lambda p, m: p == "inner") as outer,
        tail(model, tmp_path / "inner", filter_=lambda p, m: p == "inner.proj") as inner,
    ):
        outer.apply(variables, x)
        jax.jit(inner.apply)(variables, x)
    outer_data = read_from_safetensors(tmp_path / "outer")
    inner_data = read_from_safetensors(tmp_path / "inner")
    assert list(outer_data) == ["inner.__call__"]
    assert list(inner_data) == ["inner.proj.__call__"]
    expected = Inner().apply({"params": variables["params"]["inner"]}, x)
    np.testing.assert_allclose(outer_data["inner.__call__"], expected, rtol=0, atol=0)
    np.testing.assert_allclose(inner_data["inner.proj.__call__"] * 2.0, expected, rtol=1e-6)


def test_error_inside_the_block_still_writes_what_was_recorded(two_layer, x, tmp_path):
    with pytest.raises(ZeroDivisionError), tail(two_layer, tmp_path) as fm:
        fm(x)
        raise ZeroDivisionError
    data = read_from_safetensors(tmp_path)
    np.testing.assert_array_equal(data["first.__call__"], two_layer.first(x))


def test_transform_crops_before_recording(two_layer, x, tmp_path):
    with tail(two_layer, tmp_path, transform=lambda key, v: v[:2, :1]) as fm:
        jax.jit(lambda m, v: m(v))(fm, x)
    data = read_from_safetensors(tmp_path)
    assert data["first.__call__"].shape == (2, 1)
    np.testing.assert_allclose(data["first.__call__"], two_layer.first(x)[:2, :1], rtol=1e-6)


def test_empty_recording_removes_the_previous_one(two_layer, x, tmp_path):
    with tail(two_layer, tmp_path) as fm:
        fm(x)
    with pytest.warns(EmptyRecordingWarning), tail(two_layer, tmp_path) as fm:
        pass
    assert not list(tmp_path.glob("*.safetensors"))


def test_capture_separate_and_bad_model(two_layer, x):
    _, got = jax.jit(lambda m, v: m(v, twice=True))(capture(two_layer, stack="separate"), x)
    assert list(got) == ["first.__call__#0", "first.__call__#1", "second.__call__#0"]
    np.testing.assert_allclose(got["first.__call__#1"], two_layer.first(x * 2.0), rtol=1e-6)
    with pytest.raises(UnsupportedModelError):
        capture(42)


@pytest.mark.parametrize("module", ["_recorder", "_capture", "_paths", "_jit"])
def test_docstring_examples_run(module):
    mod = importlib.import_module(f"theseus.analysis.inspector.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
