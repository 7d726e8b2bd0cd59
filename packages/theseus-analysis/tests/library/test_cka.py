"""Linear CKA (`theseus.analysis.library._cka`) against a NumPy reference written here.

The reference is Kornblith et al.'s definition taken literally, in float64: HSIC with
the centering matrix H = I - 11^T/n, CKA = tr(K H L H) / sqrt(tr(K H K H) tr(L H L H))
with K = X X^T, L = Y Y^T. Tolerances: 1e-12 relative against the reference (both
float64); 1e-12 for the identities (CKA(X, X) = 1, invariance to an orthogonal
transform and an isotropic scale); 2e-3 for `kept` (float16 storage).
"""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from theseus.analysis.library import _cka
from theseus.analysis.library._cka import kept, linear_cka


def reference_cka(x: np.ndarray, y: np.ndarray) -> float:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    n = x.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    k, m = x @ x.T, y @ y.T
    hsic = np.trace(k @ h @ m @ h)
    return float(hsic / np.sqrt(np.trace(k @ h @ k @ h) * np.trace(m @ h @ m @ h)))


def orthogonal(rng: np.random.Generator, d: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    return q * np.sign(np.diag(r))


@pytest.mark.parametrize(("n", "d1", "d2"), [(40, 8, 12), (16, 32, 24), (30, 30, 5)])
def test_linear_cka_matches_the_hsic_definition(n: int, d1: int, d2: int) -> None:
    rng = np.random.default_rng(n + d1 + d2)
    x = rng.normal(size=(n, d1)) + 3.0  # an offset: the centering must remove it
    y = x[:, : min(d1, d2)] @ rng.normal(size=(min(d1, d2), d2)) + 0.5 * rng.normal(size=(n, d2))
    assert linear_cka(x, y) == pytest.approx(reference_cka(x, y), rel=1e-12)
    unrelated = rng.normal(size=(n, d2))
    assert linear_cka(x, unrelated) == pytest.approx(reference_cka(x, unrelated), rel=1e-12)


def test_cka_of_a_representation_with_itself_is_one() -> None:
    x = np.random.default_rng(0).normal(size=(50, 7))
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("n", [64, 12])  # the feature form and the Gram form
def test_cka_is_invariant_to_orthogonal_transforms_and_isotropic_scale(n: int) -> None:
    rng = np.random.default_rng(n)
    x, y = rng.normal(size=(n, 16)), rng.normal(size=(n, 16))
    y = y + x  # related, so the value is not near 0
    base = linear_cka(x, y)
    assert linear_cka(x @ orthogonal(rng, 16), y) == pytest.approx(base, abs=1e-12)
    assert linear_cka(x, 7.5 * (y @ orthogonal(rng, 16))) == pytest.approx(base, abs=1e-12)
    assert linear_cka(0.01 * x, y) == pytest.approx(base, abs=1e-12)


def test_a_constant_representation_has_no_cka_and_bad_shapes_are_refused() -> None:
    x = np.random.default_rng(1).normal(size=(10, 4))
    assert np.isnan(linear_cka(x, np.ones((10, 3))))
    with pytest.raises(ValueError, match="same examples"):
        linear_cka(x, x[:9])
    with pytest.raises(ValueError, match=r"\[examples, features\]"):
        linear_cka(x.ravel(), x.ravel())


def test_kept_residuals_give_the_cka_of_the_raw_ones() -> None:
    rng = np.random.default_rng(2)
    x = 40.0 * rng.normal(size=(256, 32)) + 5.0
    y = x @ rng.normal(size=(32, 32)) + 10.0 * rng.normal(size=(256, 32))
    stored = kept(x)
    assert stored.dtype == np.float16
    np.testing.assert_allclose(stored.astype(np.float64).mean(axis=0), 0.0, atol=2e-3)
    assert np.sqrt(np.mean(stored.astype(np.float64) ** 2)) == pytest.approx(1.0, abs=2e-3)
    assert linear_cka(kept(x), kept(y)) == pytest.approx(reference_cka(x, y), abs=2e-3)


def test_docstring_example_runs() -> None:
    result = doctest.testmod(_cka)
    assert result.attempted > 0 and result.failed == 0
