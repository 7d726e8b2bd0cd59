"""The README's code blocks run against a real store and print what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


def test_readme_session_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 3
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "checkpoints" / "1").mkdir(parents=True)
    pdf_bytes = b"%PDF-1.5\n" + bytes(range(256)) * 71
    scope = {"yaml_text": "lr: 0.1\n", "pdf_bytes": pdf_bytes, "metrics": {"a": 1, "b": 2.0}}
    exec(blocks[0], scope)
    exec(blocks[1], scope)
    lines = capsys.readouterr().out.splitlines()
    node, entry = scope["node"], scope["entry"]
    assert lines[0].split() == ["lm.default.train-gpt", node.nonce, "2", "1", "1"]  # type: ignore[attr-defined]
    assert lines[1] == f"{node} {tmp_path / 'results' / 'checkpoints' / '1'} 1"
    assert lines[2] == f"[('activations', 'activations.pdf', {len(pdf_bytes)})]"
    assert scope["pdf"] == pdf_bytes and scope["same"] == entry
    scope["store"].close()  # type: ignore[attr-defined]


def test_readme_running_block_serves_a_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("starlette", reason="the ui extra is not installed (theseus-store[ui])")
    from theseus.store import Node, Store

    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    monkeypatch.chdir(tmp_path)
    with Store(tmp_path / "theseus-demo" / "store") as store:  # a Theseus root's store
        store.log(Node.new("demo"), {"val/loss": 1.5})
    exec(blocks[2], {})
    (printed,) = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", printed), printed
