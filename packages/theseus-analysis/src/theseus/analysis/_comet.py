"""Sending analysis files to Comet, when it is configured.

Comet is on when the `logging/comet` setting names a project or `COMET_API_KEY` is
set. Each file goes to one experiment per run (`project.group.run~nonce`) as an
asset whose step is the node's `seq`. Comet's own settings decide where it goes:
`COMET_API_KEY` for the service, or offline mode (`COMET_OFFLINE_DIRECTORY`,
`comet_ml.start(online=False)`) to write archives to disk. Needs the `[comet]` extra.
"""

from __future__ import annotations

import os
from typing import Any

from theseus.analysis._errors import AnalysisError
from theseus.store import Node

__all__ = ["enabled", "publish"]

_experiments: dict[tuple[str, str], Any] = {}


def _project(configuration: Any) -> str | None:
    try:
        project = configuration["logging/comet"]
    except KeyError:
        project = ""
    if project:
        return str(project)
    if os.environ.get("COMET_API_KEY"):
        return os.environ.get("COMET_PROJECT_NAME", "theseus")
    return None


def enabled(configuration: Any) -> bool:
    """Whether analysis files go to Comet for this configuration."""
    return _project(configuration) is not None


def _experiment(project: str, node: Node) -> Any:
    run = f"{node.name}~{node.nonce}"
    key = (project, run)
    if key not in _experiments:
        try:
            import comet_ml
        except ImportError:
            raise AnalysisError(
                "Comet is configured (logging/comet or COMET_API_KEY) but comet-ml is not "
                "installed; pip install 'theseus-analysis[comet]', or unset logging/comet"
            ) from None
        online = os.environ.get("COMET_OFFLINE_DIRECTORY") is None
        experiment = comet_ml.start(project_name=project, online=online)
        experiment.set_name(run)
        _experiments[key] = experiment
    return _experiments[key]


def publish(configuration: Any, node: Node, name: str, filename: str, content: bytes) -> None:
    """Log `content` as asset `filename` at step `node.seq`, when Comet is configured."""
    project = _project(configuration)
    if project is None:
        return
    experiment = _experiment(project, node)
    experiment.log_asset_data(
        content, name=filename, step=node.seq, metadata={"analysis": name, "node": str(node)}
    )
