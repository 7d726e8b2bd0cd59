"""Input boundary: turn array-likes into host NumPy data and reject what cannot be drawn.

theseus.plot never imports JAX. Anything that implements the NumPy array
protocol (``__array__``: JAX, PyTorch CPU tensors, xarray, ...) is converted
with ``np.asarray``, which copies a device array to the host. Data frames
(pandas, or anything with ``__dataframe__``) are passed to seaborn untouched so
their column names survive. Dicts and lists are converted element by element.
Low-precision floats that matplotlib cannot handle (``bfloat16``, float8) are
widened to ``float32``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from theseus.plot._errors import PlotTypeError, PlotValueError


def is_frame(value: Any) -> bool:
    """Return whether ``value`` is a data frame or series seaborn reads natively."""
    root = type(value).__module__.split(".")[0]
    return root in ("pandas", "polars") or hasattr(value, "__dataframe__")


def _widen(array: np.ndarray) -> np.ndarray:
    # ml_dtypes (bfloat16, float8_*) register as kind "V"; matplotlib cannot plot them.
    if array.dtype.kind == "V" and array.dtype.type.__module__.startswith("ml_dtypes"):
        return array.astype(np.float32)
    return array


def to_host(value: Any) -> Any:
    """Convert array-likes inside ``value`` to NumPy, leaving everything else alone.

    Args:
        value: ``None``, a key (string), a NumPy or foreign array, a data frame,
            or a dict/list/tuple of those.

    Returns:
        The same structure with every foreign array replaced by an ``np.ndarray``.
    """
    if value is None or isinstance(value, (str, bytes, np.generic)):
        return value
    if isinstance(value, np.ndarray):
        return _widen(value)
    if is_frame(value):
        return value
    if isinstance(value, Mapping):
        return {key: to_host(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        converted = [to_host(item) for item in value]
        if all(new is old for new, old in zip(converted, value, strict=True)):
            return value
        return converted
    if hasattr(value, "__array__"):
        return _widen(np.asarray(value))
    return value


def _numeric(values: Any, name: str, helper: str) -> np.ndarray:
    if np.iscomplexobj(values):
        raise PlotTypeError(
            f"{helper}() needs real numbers for {name}, got complex ones; plot the part "
            "you mean, e.g. np.abs(values) or values.real."
        )
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        kind = type(values).__name__
        raise PlotTypeError(
            f"{helper}() needs numbers for {name}, got a {kind} that NumPy cannot turn into "
            f"floats ({error}). Pass a numeric array, list or data frame."
        ) from error


def check_matrix(data: Any, helper: str = "heatmap") -> Any:
    """Check that ``data`` is a non-empty 2-D numeric matrix with a finite value somewhere.

    Args:
        data: A host array, nested list or data frame (after :func:`to_host`).
        helper: Name of the calling helper, used in messages.

    Returns:
        What to draw: a data frame as given (its labels are the ticks), anything else as
        a float64 matrix (a None in a nested list is a missing cell, NaN).

    Raises:
        PlotValueError: ``data`` is not 2-D, is empty, is NaN everywhere, or spans more
            than a float64 can hold (its colour scale would be infinite).
        PlotTypeError: ``data`` is not numeric, or is complex.
    """
    if data is None:
        raise PlotValueError(f"{helper}() needs data: pass a 2-D array [rows, columns], got None.")
    matrix = _numeric(data, "data", helper)
    if matrix.ndim != 2:
        hint = (
            "index it down to two axes, e.g. values[0]"
            if matrix.ndim > 2
            else "reshape it, e.g. values[None, :] for one row"
        )
        raise PlotValueError(
            f"{helper}() needs a 2-D array [rows, columns], got {matrix.ndim}-D data of "
            f"shape {matrix.shape}; {hint}."
        )
    if matrix.size == 0:
        raise PlotValueError(
            f"{helper}() got an empty array of shape {matrix.shape}; it needs at least one "
            "row and one column. Check the slice that produced it."
        )
    if np.isnan(matrix).all():
        raise PlotValueError(
            f"{helper}() got an array of shape {matrix.shape} whose values are all NaN, so "
            "there is nothing to colour. Check the computation that produced it (a 0/0, "
            "a masked reduction) or drop the NaNs first."
        )
    finite = matrix[np.isfinite(matrix)]
    with np.errstate(over="ignore"):
        span = float(finite.max()) - float(finite.min()) if finite.size else 0.0
    if not np.isfinite(span):
        raise PlotValueError(
            f"{helper}() got values from {finite.min():.3g} to {finite.max():.3g}, a range "
            "wider than a float64 holds, so the colour scale has no finite length; rescale "
            "them (e.g. divide by their largest magnitude) or set vmin= and vmax=."
        )
    return data if is_frame(data) else matrix


def _is_vector(value: Any) -> bool:
    return value is not None and not isinstance(value, (str, bytes)) and hasattr(value, "__len__")


def _lookup(data: Any, key: Any) -> Any:
    """Return the column ``key`` of ``data`` if it is one, else None."""
    if data is None or not (isinstance(data, Mapping) or is_frame(data)):
        return None
    getter = getattr(data, "get", None)
    if getter is None:
        return None
    try:
        return getter(key)
    except TypeError:  # an unhashable key
        return None


def _flat_floats(values: Any) -> np.ndarray | None:
    """Every value of a vector, matrix, dict of columns or list of columns, as floats.

    Returns None when the values are not numeric (strings, dates, mixed frames).
    """
    if isinstance(values, Mapping):
        parts = list(values.values())
    elif isinstance(values, (list, tuple)) and values and all(_is_vector(v) for v in values):
        parts = list(values)
    else:
        parts = [values]
    try:
        flat = [np.ravel(np.asarray(part, dtype=np.float64)) for part in parts]
    except (TypeError, ValueError):
        return None
    return np.concatenate(flat) if flat else np.empty(0)


def _count(values: Any) -> int | None:
    flat = _flat_floats(values)
    if flat is not None:
        return int(flat.size)
    size = getattr(values, "size", None)  # data frames with text columns
    return int(size) if isinstance(size, (int, np.integer)) else None


def check_vectors(data: Any, variables: Mapping[str, Any], helper: str) -> None:
    """Check the data of a bar/line/scatter call before seaborn sees it.

    Args:
        data: The ``data=`` argument after :func:`to_host` (may be None).
        variables: Semantic variables (``x``, ``y``, ``hue``, ...) after
            :func:`to_host`: each None, a key into ``data`` or a vector.
        helper: Name of the calling helper, used in messages.

    Raises:
        PlotValueError: nothing to plot, an empty input, ``x``/``y`` (or the
            whole of wide-form ``data``) NaN everywhere, or vectors of
            different lengths.
    """
    given = {name: value for name, value in variables.items() if value is not None}
    if data is None and not given:
        raise PlotValueError(
            f"{helper}() got nothing to plot: pass data= (an array, dict or data frame) "
            "or vectors x= and/or y=."
        )
    if data is not None and _count(data) == 0:
        raise PlotValueError(
            f"{helper}() got empty data (a {type(data).__name__} with no values). "
            "Pass at least one observation."
        )
    columns = {}
    for name, value in given.items():
        column = value if _is_vector(value) else _lookup(data, value)
        if column is not None:
            columns[name] = column
        elif isinstance(data, Mapping) or is_frame(data):
            keys = list(data.keys())
            shown = ", ".join(map(repr, keys[:12])) + (", ..." if len(keys) > 12 else "")
            raise PlotValueError(
                f"{helper}() got {name}={value!r}, which is not a column of data; its "
                f"columns are {shown or 'none'}. Name one of them, or pass {name}= a vector."
            )
    lengths = {name: len(column) for name, column in columns.items()}
    for name, length in lengths.items():
        if length == 0:
            raise PlotValueError(
                f"{helper}() got an empty {name} (length 0). Pass at least one observation."
            )
    if len(set(lengths.values())) > 1:
        listing = ", ".join(f"{name} has {length}" for name, length in lengths.items())
        raise PlotValueError(
            f"{helper}() needs vectors of one length, one entry per observation, but "
            f"{listing}. Align them (same number of points) before plotting."
        )
    for name in ("x", "y"):
        if name in columns:
            _check_not_all_nan(columns[name], name, helper)
    if data is not None and not columns:
        _check_not_all_nan(data, "data", helper)


def _check_not_all_nan(values: Any, name: str, helper: str) -> None:
    flat = _flat_floats(values)
    if flat is not None and flat.size and np.isnan(flat).all():
        raise PlotValueError(
            f"{helper}() got {name} whose {flat.size} values are all NaN, so there is "
            f"nothing to draw. Check the computation that produced {name} or drop the NaNs."
        )
