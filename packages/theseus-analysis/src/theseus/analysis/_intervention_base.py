"""`InterventionBase`: an analysis whose selected calls' outputs are replaced.

The trace runs on to its end with each selected call's output replaced by
`intervene(site)`, inside one compiled function (`_intervene.compile_intervention`);
`measure` judges each forward and `analyze` turns the measures into results. The
rest (configuration, setup, `select`, `plot`, publishing) is `AnalysisBase`'s.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from theseus.analysis._base import AnalysisBase, C, M
from theseus.analysis._errors import AnalysisError
from theseus.analysis._intervene import compile_intervention
from theseus.analysis._sites import Effect, Hooks, Outcome, Site

__all__ = ["InterventionBase"]


class InterventionBase(AnalysisBase[C, M]):
    """Base of interventions: `class A(InterventionBase, MyTrainer)`.

    An intervention replaces what each selected call returns and lets the trace run on
    to its end, inside the same compiled function as an observation. Declare `TARGET`
    and `NAME` and implement `select`, `intervene` and `plot`, as for an analysis.

    - `intervene(site)` returns the call's replacement (same shapes; see `Site`).
      `theseus.analysis.interventions` has the common ones: `zero`, `mean`,
      `steer`, `patch`, `ablate_head`, `patch_head`.
    - `select()` returning a list sweeps: one intervened forward per selected path,
      each with only that call replaced. `variants(layer)` returning `n` sweeps `n`
      interventions at each path (`site.variant` says which: every head of a layer).
    - `measure(outcome)` is what each forward is judged by (default: the loss).
    - `analyze(effect)` turns the measures into the results (default: `effect.change`,
      the measure with each intervention minus without).
    - `corrupt(batch)`, when defined, makes the batch the interventions run on; the
      batch itself is then the source, and `site.source` holds the call's arguments and
      output on it (activation patching: clean source, corrupted target).
    - `ESTIMATE = "linear"` estimates every effect from one forward and one backward
      (attribution patching) instead of running each intervened forward.

    All of these run under `jax.jit` and must compute with `jax.numpy` from what they
    are given (fixed settings from `self.args`).
    """

    ESTIMATE: ClassVar[str] = "exact"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        estimate = vars(cls).get("ESTIMATE")
        if estimate is not None and estimate not in ("exact", "linear"):
            raise TypeError(
                f"{cls.__name__}.ESTIMATE = {estimate!r}; use 'exact' (run every intervened "
                "forward) or 'linear' (attribution patching: one forward and one backward)"
            )

    @abc.abstractmethod
    def intervene(self, site: Site) -> Any:
        """The selected call's replacement output (shapes and dtypes of `site.output`)."""

    def variants(self, layer: Any) -> int | None:
        """How many interventions to sweep at this selected call (None: one, no axis)."""
        return None

    def measure(self, outcome: Outcome) -> Any:
        """What each forward is judged by: a pytree of arrays (default: `outcome.loss`)."""
        if outcome.loss is None:
            raise AnalysisError(
                f"{type(self).__name__}: the trace returns no loss to measure; override "
                "measure(outcome) to read what it returns (outcome.output)"
            )
        return outcome.loss

    def corrupt(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch the interventions run on (not defined: the batch itself, no source)."""
        raise NotImplementedError  # never called unless a subclass defines it

    def analyze(self, effect: Effect) -> Any:  # type: ignore[override]
        """The results from the measures (default: `effect.change`)."""
        return effect.change

    def _compiled_analysis(self) -> Any:
        if self._analysis_fn is None:
            selection = self._prepare()
            cls = type(self)

            def count() -> None:
                self.traces += 1

            defines_corrupt = cls.corrupt is not InterventionBase.corrupt
            hooks = Hooks(
                intervene=self._traced("intervene"),
                measure=self._traced("measure"),
                analyze=self._traced("analyze"),
                variants=self._traced("variants"),
                corrupt=self._traced("corrupt") if defines_corrupt else None,
                estimate=self.ESTIMATE,
            )
            self._analysis_fn = compile_intervention(
                cls.trace,  # type: ignore[attr-defined]
                hooks,
                selection,
                self.sharding,
                cls.__name__,
                on_trace=count,
            )
        return self._analysis_fn

    def _traced(self, method: str) -> Any:
        """`method`, called with reads of the mutable state and batch turned into errors."""

        def call(*args: Any) -> Any:
            self._in_analyze = method
            try:
                return self._call(method, *args)
            finally:
                self._in_analyze = False

        return call
