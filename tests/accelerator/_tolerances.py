"""The accelerator set's tolerances, all of them: per platform and dtype, from the dtype's eps.

Every comparison in the set is `max|ours - reference| <= tolerance * max|reference|`
(relative to the compared values' scale), where

    tolerance(kind, dtype, platform) = finfo(dtype).eps * ULPS[platform][kind]

and `kind` says what the two sides are:

- `"reference"`: float32 on the platform, under `precise()` (matrix products at
  'highest' precision), against a float64 NumPy computation of the same definition
  (including a log-softmax taken in float64 from the platform's logits).
- `"recompiled"`: the same float32 arithmetic as two programs on one platform, both
  under `precise()`: eager against compiled, the KV cache against the full recompute.
- `"bitwise"`: the same program on the same inputs (a resumed run against an
  uninterrupted one): 0.
- `"fused"`: a fused attention kernel in bfloat16 against the float32 reference path
  (forward or gradient of one call): 2 eps of bfloat16 (a v5e gave 0.35 forward, 0.5
  gradient); `"fused_model"`: the logits of a two-layer model on the kernel against the
  same model on the reference: 8.

Values restored on another platform are compared with the sum of both platforms'
`"reference"` tolerances (each side is that close to the truth): `across`.

Why these multiples. CPU: IEEE float32 with nearly correctly rounded `exp`, `log`,
`tanh` and `erf`; a 2-layer forward against float64 stays within 1e-5 of its scale
(84 eps), as the default suite's tests assert, and within 5 eps in this set. TPU: under
'highest' a float32 matrix product agrees with float64 to about seven digits (six bf16
passes), but `exp`, `log`, `tanh` and `erf` are approximations that agree to four or
five digits (as reported for a TPU v5e with JAX 0.10.2; this set has not yet been run on
one to measure its own); so 4096 eps (4.9e-4, five times 1e-4) against float64, and 512
eps (6.1e-5) between two programs, which share those approximations. GPU: its transcendental functions are accurate to a
few ulps, but reductions are reordered between programs; the CPU's multiples times 4.
An unknown platform gets the TPU's. The session ends with a line of the largest ratio
each kind showed (`seen_line`): tighten a multiple from it, and never loosen one to make
a test pass without finding out why the numbers moved.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "SEEN",
    "ULPS",
    "across",
    "assert_close",
    "platform",
    "precise",
    "seen_line",
    "tolerance",
]

#: Multiples of the dtype's eps, per platform and kind of comparison.
ULPS: dict[str, dict[str, float]] = {
    "cpu": {"reference": 128, "recompiled": 16, "bitwise": 0, "fused": 2, "fused_model": 8},
    "gpu": {"reference": 512, "recompiled": 64, "bitwise": 0, "fused": 2, "fused_model": 8},
    "tpu": {"reference": 4096, "recompiled": 512, "bitwise": 0, "fused": 2, "fused_model": 8},
}


def platform() -> str:
    """The platform the set runs on: JAX's default backend (`tpu`, `gpu` or `cpu`)."""
    return jax.default_backend()


def tolerance(kind: str, dtype: Any = np.float32, on: str | None = None) -> float:
    """`eps(dtype) * ULPS[on][kind]`, relative to the compared values' scale.

    Args:
        kind: `"reference"`, `"recompiled"` or `"bitwise"`.
        dtype: the dtype the compared values were computed in.
        on: the platform (default: the one the set runs on).
    """
    multiples = ULPS.get(on or platform(), ULPS["tpu"])
    if kind not in multiples:
        raise ValueError(f"tolerance kind {kind!r}; expected one of {sorted(multiples)}")
    return float(jnp.finfo(dtype).eps) * multiples[kind]  # jnp: knows bfloat16


def across(first: str, second: str, dtype: Any = np.float32) -> float:
    """Values computed on platform `first` against the same on `second` (each to the truth)."""
    return tolerance("reference", dtype, first) + tolerance("reference", dtype, second)


def assert_close(
    ours: Any,
    reference: Any,
    kind: str | float,
    dtype: Any = np.float32,
    what: str = "",
    scale: float | None = None,
) -> float:
    """Assert `max|ours - reference| <= tolerance * scale`; return the ratio to the scale.

    Args:
        ours: the values under test (any array-like).
        reference: what they must equal (float64 where it is a NumPy reference).
        kind: a kind of `tolerance`, or the tolerance itself (`across(...)`).
        dtype: the dtype `ours` was computed in.
        what: names the compared values in the failure message.
        scale: the size the difference is measured against (default `max|reference|`;
            a change is measured against the values it changes).
    """
    ours64 = np.asarray(ours, np.float64)
    ref64 = np.asarray(reference, np.float64)
    assert ours64.shape == ref64.shape, f"{what}: shape {ours64.shape} != {ref64.shape}"
    allowed = tolerance(kind, dtype) if isinstance(kind, str) else float(kind)
    if scale is None:
        scale = float(np.abs(ref64).max()) if ref64.size else 0.0
    error = float(np.abs(ours64 - ref64).max()) if ref64.size else 0.0
    ratio = error / scale if scale else error
    name = kind if isinstance(kind, str) else "across"
    SEEN[name] = max(SEEN.get(name, 0.0), ratio)
    LIMIT[name] = allowed
    assert error <= allowed * scale, (
        f"{what or 'values'} on {platform()}: max|difference| {error:.3e} is "
        f"{ratio:.3e} of the scale {scale:.3e}; allowed {allowed:.3e} ({name})"
    )
    return ratio


#: The largest ratio `assert_close` saw per kind in this process (the session's summary).
SEEN: dict[str, float] = {}
#: The tolerance each kind was held to (its dtype's), for the summary's shares.
LIMIT: dict[str, float] = {}


def seen_line() -> str:
    """One line: each kind's largest ratio seen, in eps of float32 and as a share of its
    tolerance (`across` against the CPU's and this platform's)."""
    here, eps = platform(), float(np.finfo(np.float32).eps)
    parts = []
    for kind, ratio in sorted(SEEN.items()):
        allowed = across("cpu", here) if kind == "across" else LIMIT.get(kind, tolerance(kind))
        share = ratio / allowed if allowed else float("inf") if ratio else 0.0
        parts.append(f"{kind} {ratio:.2e} ({ratio / eps:.0f} eps, {share:.0%} of its tolerance)")
    return f"largest differences on {here}: " + "; ".join(parts)


@contextlib.contextmanager
def precise() -> Iterator[None]:
    """Matrix products at 'highest' precision: float32-accurate on a TPU (whose default
    is one bf16 pass), unchanged on a CPU."""
    with jax.default_matmul_precision("highest"):
        yield
