"""JAX arrays give the same figure data as NumPy arrays (skipped when JAX is absent)."""

from __future__ import annotations

import numpy as np
import pytest

import theseus.plot as tp

jnp = pytest.importorskip("jax.numpy")

VALUES = np.random.default_rng(1).normal(size=(6, 4)).astype(np.float32)


def test_heatmap():
    ours = tp.heatmap(jnp.asarray(VALUES)).axes[0].collections[0].get_array()
    theirs = tp.heatmap(VALUES).axes[0].collections[0].get_array()
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(np.asarray(ours).reshape(6, 4), VALUES)


def test_heatmap_bfloat16_is_widened():
    low = jnp.asarray(VALUES, dtype=jnp.bfloat16)
    mesh = tp.heatmap(low).axes[0].collections[0].get_array()
    np.testing.assert_array_equal(np.asarray(mesh).reshape(6, 4), np.asarray(low, np.float32))


def test_line_and_scatter():
    x, y = VALUES[:, 0], VALUES[:, 1]
    line_j = tp.line(x=jnp.asarray(x), y=jnp.asarray(y), errorbar=None).axes[0].get_lines()[0]
    line_n = tp.line(x=x, y=y, errorbar=None).axes[0].get_lines()[0]
    np.testing.assert_array_equal(line_j.get_xydata(), line_n.get_xydata())
    dots_j = tp.scatter(x=jnp.asarray(x), y=jnp.asarray(y)).axes[0].collections[0]
    dots_n = tp.scatter(x=x, y=y).axes[0].collections[0]
    np.testing.assert_array_equal(dots_j.get_offsets(), dots_n.get_offsets())


def test_bar_from_dict_of_jax_columns():
    groups = ["a", "b", "a", "b", "a", "b"]
    ours = tp.bar({"g": groups, "v": jnp.asarray(VALUES[:, 2])}, x="g", y="v", errorbar=None)
    theirs = tp.bar({"g": groups, "v": VALUES[:, 2]}, x="g", y="v", errorbar=None)
    heights = [p.get_height() for p in ours.axes[0].patches]
    assert heights == [p.get_height() for p in theirs.axes[0].patches]
    np.testing.assert_allclose(heights, [VALUES[0::2, 2].mean(), VALUES[1::2, 2].mean()], rtol=1e-6)


def test_wide_form_list_of_jax_vectors():
    lines = tp.line([jnp.asarray(VALUES[:, 0]), jnp.asarray(VALUES[:, 1])]).axes[0].get_lines()
    np.testing.assert_array_equal(lines[0].get_ydata(), VALUES[:, 0])
    np.testing.assert_array_equal(lines[1].get_ydata(), VALUES[:, 1])


def test_jax_errors_are_the_same():
    with pytest.raises(tp.PlotValueError, match="3-D"):
        tp.heatmap(jnp.zeros((2, 3, 4)))
    with pytest.raises(tp.PlotValueError, match="all NaN"):
        tp.heatmap(jnp.full((2, 2), jnp.nan))
