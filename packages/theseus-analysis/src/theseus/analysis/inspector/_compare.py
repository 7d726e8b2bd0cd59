"""Statistics of one recording and the key-by-key comparison of two (NumPy only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._errors import InspectorOptionError
from ._paths import KeyMap

__all__ = ["KeyComparison", "compare_recordings", "key_statistics", "remap_keys"]

STATUSES = ("close", "differs", "shape", "only-file", "only-ref")


def _float(array: Any) -> np.ndarray:
    array = np.asarray(array)
    if np.iscomplexobj(array):
        return array.astype(np.complex128)
    return array.astype(np.float64)


def key_statistics(array: Any) -> dict[str, Any]:
    """Shape, dtype and summary numbers of one array.

    ``mean``, ``std``, ``min`` and ``max`` are over the finite elements (``nan``
    when there is none); ``nan`` and ``inf`` count the others.

    Args:
        array: any array NumPy can read.

    Returns:
        ``{"shape", "dtype", "mean", "std", "min", "max", "nan", "inf"}``.
    """
    raw = np.asarray(array)
    values = _float(raw).real.reshape(-1)
    finite = values[np.isfinite(values)]
    empty = finite.size == 0
    return {
        "shape": tuple(raw.shape),
        "dtype": str(raw.dtype),
        "mean": float("nan") if empty else float(finite.mean()),
        "std": float("nan") if empty else float(finite.std()),
        "min": float("nan") if empty else float(finite.min()),
        "max": float("nan") if empty else float(finite.max()),
        "nan": int(np.isnan(values).sum()),
        "inf": int(np.isinf(values).sum()),
    }


def remap_keys(keys: Sequence[str], key_map: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Rename keys by regular expressions applied in order (each ``re.sub`` on the result).

    Args:
        keys: the original keys.
        key_map: ``(pattern, replacement)`` pairs; replacements may use ``\\1``.

    Returns:
        ``{new_key: original_key}`` in the original order.

    Raises:
        InspectorOptionError: a pattern is not a valid regular expression.
        KeyCollisionError: two keys end up with one name.
    """
    rename = KeyMap(key_map)
    return {rename(key): key for key in keys}


@dataclass(frozen=True)
class KeyComparison:
    """The comparison of one key.

    Attributes:
        key: the name (after remapping).
        status: ``"close"``, ``"differs"``, ``"shape"`` (shapes differ),
            ``"only-file"`` or ``"only-ref"``.
        max_abs: the largest ``|x - ref|`` (``None`` when not compared).
        max_rel: the largest ``|x - ref| / |ref|`` over elements (``inf`` where
            ``ref`` is 0 and ``x`` is not).
        exceed: elements outside ``atol + rtol * |ref|``.
        total: elements compared.
        shapes: the two shapes (``None`` for a missing side).
        original: the key's name in the file before remapping.
    """

    key: str
    status: str
    max_abs: float | None = None
    max_rel: float | None = None
    exceed: int = 0
    total: int = 0
    shapes: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None)
    original: str | None = None


def _compare(key: str, original: str, x: Any, ref: Any, rtol: float, atol: float) -> KeyComparison:
    a, r = _float(x), _float(ref)
    shapes = (tuple(a.shape), tuple(r.shape))
    if a.shape != r.shape:
        return KeyComparison(key, "shape", shapes=shapes, original=original)
    same = (a == r) | (np.isnan(a) & np.isnan(r))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        error = np.where(same, 0.0, np.abs(a - r))
        error = np.where(np.isnan(error), np.inf, error)
        relative = np.where(error == 0, 0.0, error / np.abs(r))
        exceed = int((error > atol + rtol * np.abs(r)).sum())
    max_abs = float(error.max()) if error.size else 0.0
    max_rel = float(np.nan_to_num(relative, nan=np.inf).max()) if error.size else 0.0
    status = "close" if exceed == 0 else "differs"
    return KeyComparison(key, status, max_abs, max_rel, exceed, int(a.size), shapes, original)


def compare_recordings(
    data: Mapping[str, Any],
    ref: Mapping[str, Any],
    key_map: Sequence[tuple[str, str]] = (),
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> list[KeyComparison]:
    """Compare two recordings key by key.

    ``key_map`` renames the keys of ``data`` (not of ``ref``) before aligning by
    name; an element is close when ``|x - ref| <= atol + rtol * |ref|`` (NaN
    matches NaN, an infinity the same infinity).

    Args:
        data: the recording under test, ``{key: array}``.
        ref: the reference recording.
        key_map: ordered ``(pattern, replacement)`` renames for ``data``'s keys.
        rtol: relative tolerance, against the reference.
        atol: absolute tolerance.

    Returns:
        One comparison per key: ``data``'s keys in order, then keys only in ``ref``.

    Raises:
        InspectorOptionError: negative tolerances or an invalid pattern.
        KeyCollisionError: the key map sends two keys to one name.
    """
    if rtol < 0 or atol < 0:
        raise InspectorOptionError(f"rtol and atol must be >= 0, got rtol={rtol}, atol={atol}.")
    renamed = remap_keys(list(data), key_map)
    results = []
    for key, original in renamed.items():
        if key not in ref:
            shape = tuple(np.shape(data[original]))
            results.append(KeyComparison(key, "only-file", shapes=(shape, None), original=original))
        else:
            results.append(_compare(key, original, data[original], ref[key], rtol, atol))
    for key in ref:
        if key not in renamed:
            shape = tuple(np.shape(ref[key]))
            results.append(KeyComparison(key, "only-ref", shapes=(None, shape), original=None))
    return results
