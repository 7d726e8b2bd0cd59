"""What an intervention's methods receive: the site, the forward's outcome, the effect.

`Site` is a selected call as `intervene(site)` sees it during an intervened forward,
`Call` a call's arguments and output on the source batch, `Outcome` what one forward
produced (as `measure` reads it), `Effect` the measures with and without the
interventions (what `analyze` receives); `Hooks` is the analysis's bound methods as
the compiled program calls them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from theseus.analysis._errors import AnalysisError

__all__ = ["Call", "Effect", "Hooks", "InterventionError", "Outcome", "Site"]


class InterventionError(AnalysisError):
    """An intervention that cannot run: a replacement of the wrong shape, a measure that
    is not a scalar where one is needed, a site inside a transform."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Call:
    """One call's arguments by name and what it returned (on the source batch, when patching)."""

    inputs: Any
    output: Any


@dataclasses.dataclass(frozen=True)
class Site:
    """A selected call, as `intervene(site)` sees it during an intervened forward.

    Attributes:
        path: the call's module path (`"blocks_1/attn"`).
        index: its position in the selection (0 for a single path).
        layer: the module bound to its variables (`site.layer.heads(site.inputs.x)`).
        inputs: the call's arguments by name (`site.inputs.x`).
        output: what the call returned; `intervene` returns a replacement of the same
            shapes and dtypes.
        variant: which of `variants(layer)` interventions this forward makes at this
            site (a traced int32 scalar: index arrays with it, e.g.
            `heads[:, :, site.variant]`); 0 when the analysis declares no variants.
        source: the same call on the source batch (`corrupt()` defined), else None.
    """

    path: str
    index: int
    layer: Any
    inputs: Any
    output: Any
    variant: Any
    source: Call | None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one forward produced, as `measure(outcome)` reads it.

    Attributes:
        output: what the trainer's `trace` returned.
        logits: `output[0]` when the trace returns `forward`'s `(logits, loss, metadata)`,
            else None.
        loss: `output[1]` likewise (the batch's mean cross-entropy), else None.
        batch: the rows this forward ran on (`batch["y"]`: the targets).
    """

    output: Any
    batch: Any
    logits: Any = None
    loss: Any = None

    @classmethod
    def of(cls, output: Any, batch: Any) -> Outcome:
        if isinstance(output, tuple) and len(output) >= 2:
            logits, loss = output[0], output[1]
            if isinstance(logits, jax.Array) and isinstance(loss, jax.Array | None):
                return cls(output, batch, logits, loss)
        return cls(output, batch)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Effect:
    """What `analyze(effect)` receives: `measure()` with and without the interventions.

    Attributes:
        baseline: `measure()` of the forward the interventions change, run without them
            (on `corrupt(batch)` when `corrupt` is defined, else on the batch).
        intervened: `measure()` of each intervened forward, stacked: a leading axis over
            the selected paths when `select()` returned a list, then one over the
            variants when `variants()` is defined. With `ESTIMATE = "linear"`, the
            linear estimates of those measures (attribution patching).
        source: `measure()` of the source batch (the batch itself) when `corrupt` is
            defined, else None.
    """

    baseline: Any
    intervened: Any
    source: Any = None

    @property
    def change(self) -> Any:
        """`intervened - baseline`, leaf by leaf (broadcast over the sweep's axes)."""
        return jax.tree.map(jnp.subtract, self.intervened, self.baseline)


@dataclasses.dataclass(frozen=True)
class Hooks:
    """The analysis's methods the engine calls (bound), and its choices."""

    intervene: Callable[[Site], Any]
    measure: Callable[[Outcome], Any]
    analyze: Callable[[Effect], Any]
    variants: Callable[[Any], int | None]
    corrupt: Callable[[dict[str, Any]], dict[str, Any]] | None
    estimate: str  # "exact" | "linear"
