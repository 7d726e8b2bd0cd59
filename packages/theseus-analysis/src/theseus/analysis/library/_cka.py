"""Linear centered kernel alignment (Kornblith et al. 2019) and the form residuals keep.

`linear_cka(x, y)` compares two representations of the same `n` examples, `x [n, d1]`
and `y [n, d2]` (the widths may differ): with both centered over the examples,

    CKA(x, y) = ||y^T x||_F^2 / (||x^T x||_F ||y^T y||_F)
              = <K, L>_F / (||K||_F ||L||_F),   K = x x^T, L = y y^T,

1 for representations equal up to an orthogonal transform and an isotropic scale,
computed in float64 in whichever form is cheaper (features when both widths are below
`n`, Gram matrices otherwise). `kept(h)` is the form `DriftBase` stores a layer's
residual stream in: centered, scaled to unit root mean square, float16 (CKA does not
see the centering or the scale, and float16 halves what each node holds).
"""

from __future__ import annotations

import numpy as np

__all__ = ["kept", "linear_cka"]


def _centered(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"linear_cka takes [examples, features] arrays; got shape {x.shape}")
    return x - x.mean(axis=0, keepdims=True)


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA of `x [n, d1]` and `y [n, d2]` (rows: the same examples), in float64.

    Returns NaN where either representation is constant over the examples (its
    centered form is zero, so the similarity is undefined).

    Example:
        >>> x = np.arange(12.0).reshape(4, 3) ** 2
        >>> round(linear_cka(x, 3 * x), 12)
        1.0

    Raises:
        ValueError: the arrays are not 2-D or hold different numbers of examples.
    """
    a, b = _centered(x), _centered(y)
    if a.shape[0] != b.shape[0]:
        raise ValueError(
            f"linear_cka compares two representations of the same examples; got {a.shape[0]} "
            f"and {b.shape[0]} rows"
        )
    n, d1, d2 = a.shape[0], a.shape[1], b.shape[1]
    if max(d1, d2) < n:  # features: n (d1 d2 + d1^2 + d2^2) multiply-adds
        cross = float(np.sum((b.T @ a) ** 2))
        norms = float(np.linalg.norm(a.T @ a)) * float(np.linalg.norm(b.T @ b))
    else:  # Gram matrices: n^2 (d1 + d2)
        k, m = a @ a.T, b @ b.T
        cross = float(np.sum(k * m))
        norms = float(np.linalg.norm(k)) * float(np.linalg.norm(m))
    if norms == 0.0:
        return float("nan")
    return cross / norms


def kept(h: np.ndarray) -> np.ndarray:
    """`h [n, d]` as a node keeps it: centered over the `n` examples, divided by its root
    mean square (1 when constant), float16 `[n, d]`."""
    centered = _centered(h)
    rms = float(np.sqrt(np.mean(centered**2)))
    return (centered / (rms if rms > 0 else 1.0)).astype(np.float16)
