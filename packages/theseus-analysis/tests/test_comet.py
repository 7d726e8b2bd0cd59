"""Comet: analysis files also go to Comet, tested for real with Comet's offline archives.

Every test that starts Comet runs it in offline mode (`COMET_START_ONLINE=false`), with
its server URL at a closed local port and the socket layer refusing every connection
(any attempt fails the test), so nothing can reach the network. No warning filters are
needed: comet-ml 3.58 emits no Python warnings here (its messages go to logging).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from theseus.analysis import AnalysisBase, AnalysisError, AnalysisResult, _comet
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.quick import quick
from theseus.store import Node

# Tests that need comet-ml carry `comet` (skipped where it is absent); the others do not
# import it, and the error for a missing comet-ml is tested everywhere.

TINY = {
    "architecture/n_layers": 1,
    "architecture/n_embd": 32,
    "architecture/n_head": 2,
    "architecture/block_size": 32,
    "training/batch_size": 8,
}


class Crop(AnalysisBase, PretrainGPT):
    TARGET = SelfAttention
    NAME = "crop"

    def select(self, paths: list[str]) -> str:
        return paths[0]

    def analyze(self, layer: Any, inputs: Any) -> Any:
        return {"mean": inputs.x.mean()}

    def plot(self, results: Any) -> Any:
        return {"mean": float(results["mean"])}


class Heat(AnalysisBase, PretrainGPT):
    TARGET = SelfAttention
    NAME = "heat"

    def select(self, paths: list[str]) -> str:
        return paths[0]

    def analyze(self, layer: Any, inputs: Any) -> Any:
        return inputs.x[0, :8, :8]

    def plot(self, results: Any) -> Any:
        return self.heatmap(np.asarray(results), xlabel="Feature", ylabel="Token")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("root")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    return root


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Comet offline, archives under the returned folder, no network; closes Comet after."""
    archives = tmp_path / "comet"
    monkeypatch.chdir(tmp_path)  # no ./.env or ./.comet.config of the repository is read
    monkeypatch.setenv("COMET_START_ONLINE", "false")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(archives))
    monkeypatch.setenv("COMET_URL_OVERRIDE", "http://127.0.0.1:9/clientlib/")
    monkeypatch.setenv("COMET_ERROR_TRACKING_ENABLE", "false")
    monkeypatch.setenv("COMET_DISABLE_AUTO_LOGGING", "1")
    for name in ("COMET_API_KEY", "COMET_PROJECT_NAME", "COMET_WORKSPACE", "COMET_EXPERIMENT_KEY"):
        monkeypatch.delenv(name, raising=False)
    attempts: list[object] = []

    def refuse_connect(self: socket.socket, address: object) -> None:
        attempts.append(address)
        raise OSError("test_comet: no network")

    def refuse_lookup(*args: object, **kwargs: object) -> Any:
        attempts.append(args)
        raise OSError("test_comet: no network")

    monkeypatch.setattr(socket.socket, "connect", refuse_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse_connect)
    monkeypatch.setattr(socket, "getaddrinfo", refuse_lookup)
    try:
        yield archives
    finally:
        _comet.close()
    assert attempts == [], f"Comet tried the network in offline mode: {attempts}"


def _run(
    root: Path, cls: type, project: str = "theseus-test", run: str = "c"
) -> tuple[Any, AnalysisResult]:
    with quick(root) as q:
        q.build(cls, run)
        q.config["logging/comet"] = project
        for key, value in TINY.items():
            q.config[key] = value
        job = q.create()
        result = job()
    assert isinstance(result, AnalysisResult)
    return job, result


def _archives(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.zip")) if folder.exists() else []


def _read(archive: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, bytes]]:
    """(experiment.json, messages.json as a list, {asset name: bytes}) of an archive."""
    with zipfile.ZipFile(archive) as z:
        meta = json.loads(z.read("experiment.json"))
        messages = [json.loads(line) for line in z.read("messages.json").splitlines() if line]
        assets = {}
        for m in messages:
            if m["type"] == "file_upload":
                p = m["payload"]
                assets[p["additional_params"]["fileName"]] = z.read(p["file_path"])
    return meta, messages, assets


def _upload(messages: list[dict[str, Any]], filename: str) -> dict[str, Any]:
    found = [
        m["payload"]
        for m in messages
        if m["type"] == "file_upload" and m["payload"]["additional_params"]["fileName"] == filename
    ]
    assert len(found) == 1, [m["type"] for m in messages]
    return found[0]


@pytest.mark.comet
def test_json_result_is_an_asset_at_the_node_seq(root: Path, offline: Path) -> None:
    _, result = _run(root, Crop)
    assert result.path is not None and result.path.name == "crop.json"
    _comet.close()

    (archive,) = _archives(offline)
    meta, messages, assets = _read(archive)
    assert meta["project_name"] == "theseus-test"
    assert assets == {"crop.json": result.path.read_bytes()}  # our file, nothing else
    upload = _upload(messages, "crop.json")
    assert upload["additional_params"]["step"] == result.node.seq
    assert upload["metadata"] == {"analysis": "crop", "node": str(result.node)}
    name = f"{result.node.name}~{result.node.nonce}"
    others = {
        m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"
    }
    assert others.get("Name") == name
    # No code, git, environment, system metrics, console output or CLI arguments.
    kinds = {m["type"] for m in messages}
    assert kinds <= {"file_upload", "log_other", "parameter_msg", "metric_msg"}, kinds
    params = {m["payload"]["param"]["paramName"] for m in messages if m["type"] == "parameter_msg"}
    assert params <= {"curr_step"}, params


@pytest.mark.comet
@pytest.mark.slow  # the default suite keeps the JSON end-to-end test
def test_figure_result_sends_the_pdf_bytes(root: Path, offline: Path) -> None:
    _, result = _run(root, Heat, run="h")
    assert result.path is not None and result.path.name == "heat.pdf"
    _comet.close()
    (archive,) = _archives(offline)
    _, messages, assets = _read(archive)
    assert assets["heat.pdf"] == result.path.read_bytes()
    assert assets["heat.pdf"].startswith(b"%PDF")
    assert _upload(messages, "heat.pdf")["additional_params"]["step"] == result.node.seq


def test_not_configured_sends_nothing(
    root: Path, offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "comet_ml", None)  # it must not even be imported
    job, result = _run(root, Crop, project="", run="off")
    assert result.path is not None and result.artifact is not None  # the file and artifact
    assert job.configuration["logging/comet"] == ""
    assert not _comet.enabled(job.configuration)
    _comet.close()
    assert not offline.exists()


def test_enabled_by_the_setting_or_the_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMET_API_KEY", raising=False)
    assert not _comet.enabled({})  # the setting is not declared: KeyError
    assert not _comet.enabled(None)
    assert not _comet.enabled({"logging/comet": ""})
    assert _comet.enabled({"logging/comet": "proj"})
    monkeypatch.setenv("COMET_API_KEY", "not-a-real-key")
    assert _comet.enabled({}) and _comet.enabled({"logging/comet": ""})


def test_missing_comet_ml_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "comet_ml", None)
    _comet.close()
    node = Node.new("r", project="p", group="g")
    with pytest.raises(AnalysisError, match=r"pip install 'theseus-analysis\[comet\]'"):
        _comet.publish({"logging/comet": "proj"}, node, "a", "a.json", b"{}\n")
    monkeypatch.setenv("COMET_API_KEY", "not-a-real-key")
    with pytest.raises(AnalysisError, match=r"pip install 'theseus-analysis\[comet\]'"):
        _comet.publish({}, node, "a", "a.json", b"{}\n")


@pytest.mark.comet
def test_online_without_an_api_key_fails_at_once(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not offline and no key: a clear error before comet-ml tries its server."""
    import comet_ml

    monkeypatch.delenv("COMET_START_ONLINE")
    if comet_ml.get_config().get_string(None, "comet.api_key"):
        pytest.skip("a Comet config file on this machine has an API key")
    node = Node.new("r", project="p", group="g")
    with pytest.raises(AnalysisError, match=r"COMET_API_KEY.*COMET_START_ONLINE=false"):
        _comet.publish({"logging/comet": "proj"}, node, "a", "a.json", b"{}\n")
    assert not offline.exists()


@pytest.mark.comet
@pytest.mark.slow  # the default suite keeps the JSON end-to-end test
def test_lineages_interleaved_keep_one_experiment_each(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Comet ends the running experiment when another starts; nothing may be lost."""
    a = Node.new("r", project="p", group="g")
    b = Node.new("s", project="p", group="g")
    config = {"logging/comet": "proj"}
    _comet.publish(config, a, "x", "x.json", b"a0")
    _comet.publish(config, b, "x", "x.json", b"b0")
    _comet.publish(config, a.next(), "x", "x.json", b"a1")
    _comet.publish(config, a.next(), "y", "y.json", b"a1y")
    # Only the key (no setting): Comet's project, else the node's project.
    monkeypatch.setenv("COMET_API_KEY", "not-a-real-key")
    monkeypatch.setenv("COMET_PROJECT_NAME", "from-comet")
    c = Node.new("t", project="q", group="g")
    _comet.publish({}, c, "x", "x.json", b"c0")
    monkeypatch.delenv("COMET_PROJECT_NAME")
    d = Node.new("u", project="fromnode", group="g")
    _comet.publish({}, d, "x", "x.json", b"d0")
    _comet.close()

    per_archive = []  # (experiment key, project, sorted [(asset, bytes, step)])
    for archive in _archives(offline):
        meta, messages, assets = _read(archive)
        steps = {n: _upload(messages, n)["additional_params"]["step"] for n in assets}
        files = sorted((n, content, steps[n]) for n, content in assets.items())
        per_archive.append((meta["offline_id"], meta["project_name"], files))
    by_content = {files[0][1]: (key, project, files) for key, project, files in per_archive}
    assert len(per_archive) == len(by_content) == 5  # a, b, a again, c, d: nothing dropped
    assert by_content[b"a0"][2] == [("x.json", b"a0", 0)]
    assert by_content[b"a1"][2] == [("x.json", b"a1", 1), ("y.json", b"a1y", 1)]
    assert by_content[b"b0"][2] == [("x.json", b"b0", 0)]
    assert by_content[b"c0"][2] == [("x.json", b"c0", 0)]
    assert by_content[b"a0"][0] == by_content[b"a1"][0]  # one experiment key per lineage
    assert len({by_content[c][0] for c in (b"a0", b"b0", b"c0")}) == 3
    assert [by_content[c][1] for c in (b"a0", b"b0", b"c0")] == ["proj", "proj", "from-comet"]
    import comet_ml

    if comet_ml.get_config().get_string(None, "comet.project_name") is None:  # no config file
        assert by_content[b"d0"][1] == "fromnode"


@pytest.mark.comet
@pytest.mark.slow  # the default suite keeps the JSON end-to-end test
def test_process_exit_writes_the_archive_without_close(
    offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """comet-ml's own exit hook ends the open experiment, so the archive is written.

    The child also checks this module's import defaults: with the environment silent
    about them, comet-ml starts no error reporting and installs no import hooks.
    """
    monkeypatch.delenv("COMET_ERROR_TRACKING_ENABLE")
    monkeypatch.delenv("COMET_DISABLE_AUTO_LOGGING")
    script = textwrap.dedent(
        """
        import os, socket, sys
        def refuse(*args):
            raise SystemExit(f"network attempt: {args}")
        socket.socket.connect = socket.socket.connect_ex = refuse
        socket.getaddrinfo = refuse
        from theseus.analysis import _comet
        from theseus.store import Node
        node = Node.new("r", project="p", group="g")
        _comet.publish({"logging/comet": "proj"}, node, "x", "x.json", b"exit")
        import comet_ml.error_tracking.api as tracking
        assert not tracking.initialized(), "Sentry error reporting started"
        hooks = [f for f in sys.meta_path if type(f).__name__ == "CometModuleFinder"]
        assert not hooks, hooks
        assert "COMET_ERROR_TRACKING_ENABLE" not in os.environ  # restored after import
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    (archive,) = _archives(offline)
    assert _read(archive)[2] == {"x.json": b"exit"}
