"""Sending analysis files to Comet, when it is configured (the `[comet]` extra, comet-ml).

When it is on
    The `logging/comet` setting names a Comet project; or, with that setting '' or
    absent, the environment has `COMET_API_KEY`. Then the project is Comet's own
    configured one (`COMET_PROJECT_NAME`, a `.comet.config`) or else the node's
    project (the first part of `project.group.run`).

What goes there
    One Comet experiment per lineage (a node's name and nonce), named
    `project.group.run~nonce`. Its key is derived from workspace, project, name and
    nonce, so a lineage always maps to the same experiment: a resumed run (a later
    process) appends to it. Each PDF or JSON file becomes an asset of that name at
    step `node.seq`, with metadata `{"analysis": NAME, "node": "name~nonce~seq"}`.
    Nothing else: code, git, environment, system metrics, console output, CLI
    arguments, framework auto-logging and CO2 tracking are all turned off, and the
    end-of-run summary is not printed.

Online or offline
    Comet's own configuration decides, nothing of ours: `comet.start.online`, i.e.
    `COMET_START_ONLINE=false` (or the same key in a Comet config file) makes
    `comet_ml.start` create an `OfflineExperiment`, which writes a zip archive to
    `COMET_OFFLINE_DIRECTORY` (Comet's default: `.cometml-runs` in the working folder),
    to send later with `comet upload FILE.zip`. Setting `COMET_OFFLINE_DIRECTORY`
    alone does not mean offline: Comet also uses it for the fallback archive of an
    online experiment that loses its connection. Online without an API key
    (`COMET_API_KEY`, `comet login`) is an error at once. An offline experiment opens
    no connection. When this module first imports comet-ml it turns off, unless the
    environment sets them, comet-ml's error reporting to Sentry
    (`COMET_ERROR_TRACKING_ENABLE`) and its import hooks that patch other frameworks
    (`COMET_DISABLE_AUTO_LOGGING`); both are read only at import.

Ending
    comet-ml keeps one running experiment per process, and starting another ends the
    previous one (later logging to an ended experiment is silently dropped). So this
    module holds at most one open experiment: a file of another lineage ends it
    first and opens that lineage's; a later file of the first lineage opens it again
    by its key (online: appended; offline: one more archive with the same key, merged
    on upload). `close()` ends the open experiment (sends it, or writes its archive).
    When the process exits, comet-ml's own exit hook ends it too, so an offline
    archive is written without `close()`. If your own code runs a Comet experiment
    in the same process, the first analysis file sent here ends it (comet-ml's rule).
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from typing import Any

from theseus.analysis._errors import AnalysisError
from theseus.store import Node

__all__ = ["close", "enabled", "publish"]

_INSTALL = "pip install 'theseus-analysis[comet]'"

# comet-ml settings it reads only at import: our defaults, unless the environment sets them.
_IMPORT_DEFAULTS = {
    "COMET_DISABLE_AUTO_LOGGING": "1",  # no import hooks patching torch, keras, mlflow, ...
    "COMET_ERROR_TRACKING_ENABLE": "false",  # no error reports to comet-ml's Sentry
}

_lock = threading.RLock()  # close() runs inside publish() too
_open: tuple[str, Any] | None = None  # (experiment key, experiment) of the one open experiment


def _setting(configuration: Any) -> str:
    """The `logging/comet` project, or '' when unset or not declared."""
    if configuration is None:
        return ""
    try:
        project = configuration["logging/comet"]
    except KeyError:
        return ""
    return str(project) if project else ""


def enabled(configuration: Any) -> bool:
    """Whether analysis files go to Comet for this configuration (never imports comet-ml)."""
    return bool(_setting(configuration) or os.environ.get("COMET_API_KEY"))


def check(configuration: Any) -> None:
    """Fail early (at setup) when Comet is configured but comet-ml cannot be imported.

    Raises:
        AnalysisError: with the command that installs it.
    """
    if enabled(configuration):
        _comet()


def _comet() -> Any:
    """comet-ml, first imported with `_IMPORT_DEFAULTS`; a clear error when it is missing."""
    added = (
        [] if "comet_ml" in sys.modules else [k for k in _IMPORT_DEFAULTS if k not in os.environ]
    )
    os.environ.update({k: _IMPORT_DEFAULTS[k] for k in added})
    try:
        import comet_ml
    except ImportError as exc:
        raise AnalysisError(
            f"Comet is configured (logging/comet or COMET_API_KEY) but comet-ml is not "
            f"installed ({exc}); {_INSTALL}, or set logging/comet to '' and unset COMET_API_KEY"
        ) from exc
    finally:
        for key in added:
            os.environ.pop(key, None)
    return comet_ml


def _experiment_config(comet_ml: Any, name: str) -> Any:
    return comet_ml.ExperimentConfig(
        name=name,
        log_code=False,
        log_graph=False,
        parse_args=False,
        log_git_metadata=False,
        log_git_patch=False,
        log_env_details=False,
        log_env_gpu=False,
        log_env_host=False,
        log_env_cpu=False,
        log_env_network=False,
        log_env_disk=False,
        auto_output_logging=False,
        auto_param_logging=False,
        auto_metric_logging=False,
        auto_log_co2=False,
        display_summary_level=0,
    )


def _experiment(configuration: Any, node: Node) -> Any:
    """The open experiment of `node`'s lineage, ending another lineage's first."""
    global _open
    comet_ml = _comet()
    config = comet_ml.get_config()
    project = (
        _setting(configuration)
        or config.get_string(None, "comet.project_name")
        or node.name.split(".")[0]
    )
    workspace = config.get_string(None, "comet.workspace") or ""
    run = f"{node.name}~{node.nonce}"
    key = hashlib.sha256(f"{workspace}\0{project}\0{run}".encode()).hexdigest()[:40]
    if _open is not None and _open[0] == key and not _open[1].ended:
        return _open[1]
    close()
    online = config.get_bool(None, "comet.start.online", default=None) is not False
    if online and not config.get_string(None, "comet.api_key"):
        raise AnalysisError(
            f"Comet is configured (logging/comet = {project!r}) for its online service but "
            "has no API key: set COMET_API_KEY (or run `comet login`); to write offline "
            "archives instead set COMET_START_ONLINE=false (and COMET_OFFLINE_DIRECTORY); "
            "or set logging/comet to ''"
        )
    try:
        experiment = comet_ml.start(
            project_name=project,
            experiment_key=key,
            mode="get_or_create",
            experiment_config=_experiment_config(comet_ml, run),
        )
    except Exception as exc:
        raise AnalysisError(
            f"Comet could not start an experiment for {run} in project {project!r}: {exc}. "
            "For Comet's service set COMET_API_KEY (and COMET_WORKSPACE if needed); to "
            "write offline archives instead set COMET_START_ONLINE=false (and "
            "COMET_OFFLINE_DIRECTORY); or set logging/comet to '' and unset COMET_API_KEY"
        ) from exc
    _open = (key, experiment)
    return experiment


def publish(configuration: Any, node: Node, name: str, filename: str, content: bytes) -> None:
    """Log `content` as asset `filename` at step `node.seq`, when Comet is configured.

    Args:
        configuration: the job's configuration (a Tree, a mapping, or None).
        node: the node the file belongs to.
        name: the analysis `NAME`.
        filename: the file's name (`NAME.pdf` or `NAME.json`), the asset's name.
        content: the file's bytes.

    Raises:
        AnalysisError: Comet is configured but comet-ml is not installed, it is online
            without an API key, or Comet could not start the experiment.
    """
    if not enabled(configuration):
        return
    with _lock:
        experiment = _experiment(configuration, node)
        experiment.log_asset_data(
            content,
            name=filename,
            step=node.seq,
            metadata={"analysis": name, "node": str(node)},
        )


def close() -> None:
    """End the open experiment, if any: send what is pending, or write its offline archive."""
    global _open
    with _lock:
        if _open is not None:
            _, experiment = _open
            _open = None
            experiment.end()
