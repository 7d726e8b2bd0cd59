"""`AnalysisSettings`: what every analysis reads beside its trainer's settings.

`inspection/prompt` (a text traced instead of the node's batch) and `logging/comet`
(where files also go) are the analyses' own, declared here, in theseus-analysis.
`AnalysisBase.analysis_config()` is the one hook through which an analysis adds its
settings to whatever runs it: these, its `CONFIG` and its `SETTINGS`. A standalone
analysis composes them after its trainer's; a trainer composes them for each entry of
its `ANALYSIS` (theseus-core asks through the `TandemAnalysis` protocol and never
imports this package). Earlier versions declared both keys on every trainer; files that
hold them still load there (`BaseTrainerConfig.RETIRED`), and the keys are spelled as
before.
"""

from __future__ import annotations

from dataclasses import dataclass

from theseus.config import field

__all__ = ["AnalysisSettings"]


@dataclass(frozen=True)
class AnalysisSettings:
    """The settings every analysis reads (and a trainer that runs analyses in tandem)."""

    prompt: str = field(
        "inspection/prompt",
        default="",
        help="text that analyses (and their find/debug) trace instead of the node's batch "
        "('' = the batch)",
    )
    comet: str = field(
        "logging/comet",
        default="",
        help="Comet project that analysis figures and JSON also go to ('' = off)",
    )
