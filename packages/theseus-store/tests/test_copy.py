"""`theseus-store copy`: a whole store into another, on either backend, resumable, verified.

What the copy holds is compared with the source through the store's public reads (nodes,
parents, values, every artifact version's bytes, checkpoints and their files, job
records), not through the copy's own verification.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import _ui_store
import pytest

from theseus.store import Node, Store, StoreError
from theseus.store import _copy as copy_module
from theseus.store.cli import main


def _source(folder: Path) -> dict[str, Node]:
    """The browser tests' store (branch, resume, PDFs, hostile text) and awkward values."""
    nodes = _ui_store.build(folder)
    with Store(folder) as store:
        store.log(
            nodes["base0"],
            {"neg_zero": -0.0, "inf": math.inf, "big": 2**63 - 1, "tiny": 5e-324, "b": False},
        )
        store.put(nodes["base0"], "big", "big.bin", bytes(range(256)) * 1024)  # a blob file
    return nodes


def _files(folder: Path) -> dict[str, str]:
    """Every file's hash (SQLite's own -wal and -shm files left out: a reader makes them)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.endswith(("-wal", "-shm"))
    }


def _snapshot(folder: Path) -> dict[str, Any]:
    """Everything a reader sees, in a form two stores can be compared by."""
    seen: dict[str, Any] = {}
    with Store(folder, create=False, readonly=True) as store:
        for node in store.query().all():
            values = {k: (type(v).__name__, repr(v)) for k, v in store.values(node).items()}
            artifacts = {
                name: [
                    (a.version, a.filename, hashlib.sha256(a.content).hexdigest())
                    for a in store.history(node, name)
                ]
                for name in store.get(node)
            }
            checkpoints = [
                (c.step, c.meta, Path(c.path).relative_to(store.root.parent).as_posix(),
                 _files(Path(c.path)))
                for c in store.checkpoints(node)
            ]  # fmt: skip
            seen[node.serialize()] = (
                [p.serialize() for p in store.parents(node)],
                values,
                artifacts,
                checkpoints,
                store.job_config(node),
            )
    return seen


def test_a_copy_reads_as_its_source_and_a_second_copy_adds_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "a" / "store"
    _source(source)
    before = _files(source.parent)
    assert main(["copy", str(source.parent), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "verified" in out
    assert _snapshot(tmp_path / "b" / "store") == _snapshot(source)
    assert _files(source.parent) == before  # the source is only read
    assert main(["copy", str(source.parent), str(tmp_path / "b")]) == 0
    again = capsys.readouterr().out
    assert "nodes: 16 (0 added)" in again and "0 rows added, 0 folders brought" in again
    assert _snapshot(tmp_path / "b" / "store") == _snapshot(source)


def test_a_destination_with_other_nodes_is_refused_unless_merged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _source(tmp_path / "a" / "store")
    other = Node.new("other")
    with Store(tmp_path / "c" / "store") as store:
        store.log(other, {"x": 1})
    kept = _files(tmp_path / "c")
    assert main(["copy", str(tmp_path / "a"), str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "already holds nodes" in err and "--merge" in err and err.count("\n") == 1
    assert _files(tmp_path / "c") == kept
    assert main(["copy", str(tmp_path / "a"), str(tmp_path / "c"), "--merge"]) == 0
    merged = _snapshot(tmp_path / "c" / "store")
    assert merged.pop(other.serialize())[1] == {"x": ("int", "1")}
    assert merged == _snapshot(tmp_path / "a" / "store")


def test_an_interrupted_copy_is_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _source(tmp_path / "a" / "store")
    real = copy_module._copy_checkpoints

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(copy_module, "_copy_checkpoints", interrupted)
    assert main(["copy", str(tmp_path / "a"), str(tmp_path / "b")]) == 130
    [said] = capsys.readouterr().err.splitlines()  # one line, no traceback
    assert said.startswith("theseus-store: copy interrupted (Ctrl-C) after the stage 'artifacts")
    assert "Run the same command again to finish it" in said
    monkeypatch.setattr(copy_module, "_copy_checkpoints", real)
    assert main(["copy", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert _snapshot(tmp_path / "b" / "store") == _snapshot(tmp_path / "a" / "store")


@pytest.mark.postgres
def test_sqlite_to_postgresql_and_back(pg_url: Any, tmp_path: Path) -> None:
    _source(tmp_path / "a" / "store")
    url = pg_url(tmp_path / "pg")
    assert main(["copy", str(tmp_path / "a"), url]) == 0
    with Store(tmp_path / "pg" / "store") as store:
        assert store.database.startswith("postgresql://")
    assert _snapshot(tmp_path / "pg" / "store") == _snapshot(tmp_path / "a" / "store")
    assert main(["copy", url, str(tmp_path / "back")]) == 0
    assert (tmp_path / "back" / "store" / "store.sqlite").exists()
    assert _snapshot(tmp_path / "back" / "store") == _snapshot(tmp_path / "a" / "store")


@pytest.mark.postgres
def test_an_interrupted_copy_into_postgresql_is_resumed(
    pg_url: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _source(tmp_path / "a" / "store")
    url = pg_url(tmp_path / "pg")
    real = copy_module._copy_bytes
    monkeypatch.setattr(copy_module, "_copy_bytes", lambda *a: (_ for _ in ()).throw(OSError))
    with pytest.raises(OSError):
        main(["copy", str(tmp_path / "a"), url])
    monkeypatch.setattr(copy_module, "_copy_bytes", real)
    assert main(["copy", str(tmp_path / "a"), url]) == 0
    assert _snapshot(tmp_path / "pg" / "store") == _snapshot(tmp_path / "a" / "store")


def test_the_copy_refuses_a_store_into_itself(tmp_path: Path) -> None:
    _source(tmp_path / "a" / "store")
    with (
        Store(tmp_path / "a" / "store") as src,
        Store(tmp_path / "a" / "store") as dst,
        pytest.raises(StoreError, match="same store"),
    ):
        copy_module.copy_store(src, dst)


def test_an_interrupted_copy_is_marked_unfinished_until_a_run_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _source(tmp_path / "a" / "store")
    real = copy_module._copy_checkpoints

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(copy_module, "_copy_checkpoints", interrupted)
    assert main(["copy", str(tmp_path / "a"), str(tmp_path / "b")]) == 130
    [said] = capsys.readouterr().err.splitlines()
    assert "marked an unfinished copy until then" in said
    # what the part holds looks like a store: every reader is told it is not whole
    assert main(["fsck", str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert f"is an unfinished copy of {tmp_path / 'a'}" in out
    assert f"Run `theseus-store copy {tmp_path / 'a'} {tmp_path / 'b'}` again" in out
    assert main(["runs", str(tmp_path / "b")]) == 0
    [warned] = capsys.readouterr().err.splitlines()
    assert warned.startswith("theseus-store: warning: ") and "unfinished copy" in warned
    monkeypatch.setattr(copy_module, "_copy_checkpoints", real)
    assert main(["copy", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert main(["fsck", str(tmp_path / "b")]) == 0
    assert main(["runs", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().err == ""


def _root_folders(root: Path) -> None:
    """What `theseus data prepare` and `theseus import` leave beside a store: a prepared
    dataset (its header written last), a tokenizer, and a preparation's temporary file."""
    dataset = root / "data" / "synthetic"
    dataset.mkdir(parents=True)
    (dataset / "train.bin").write_bytes(bytes(range(256)) * 64)
    (dataset / "val.bin").write_bytes(b"\x01\x02" * 100)
    (dataset / "header.json").write_text('{"format": 1, "tokenizer": "tok"}')
    (root / "data" / ".synthetic.tmp-1").write_bytes(b"half")
    (root / "tokenizers" / "tok").mkdir(parents=True)
    (root / "tokenizers" / "tok" / "tokenizer.json").write_text('{"model": "bpe"}')


def test_a_copy_between_roots_brings_their_data_and_tokenizers_and_keeps_the_destinations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _source(tmp_path / "a" / "store")
    _root_folders(tmp_path / "a")
    own = tmp_path / "b" / "tokenizers" / "tok" / "tokenizer.json"
    own.parent.mkdir(parents=True)
    own.write_text('{"model": "the destination\'s own"}')
    assert main(["copy", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "data and tokenizers: 1 folder brought; kept the destination's own tokenizers/tok" in out
    assert _files(tmp_path / "b" / "data") == {
        k: v for k, v in _files(tmp_path / "a" / "data").items() if not k.startswith(".")
    }
    assert own.read_text() == '{"model": "the destination\'s own"}'
    assert main(["copy", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert "data and tokenizers: 0 folders brought" in capsys.readouterr().out


def test_a_dataset_a_copy_was_interrupted_in_is_absent_not_torn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _source(tmp_path / "a" / "store")
    _root_folders(tmp_path / "a")
    real = copy_module._link_or_copy
    calls: list[str] = []

    def stopped_after_one(source: str, target: str) -> None:
        if "/data/" in source:  # a dataset's file (checkpoint folders come before)
            if calls:
                raise KeyboardInterrupt
            calls.append(source)
        real(source, target)

    monkeypatch.setattr(copy_module, "_link_or_copy", stopped_after_one)
    assert main(["copy", str(tmp_path / "a"), str(tmp_path / "b")]) == 130
    assert "after the stage 'checkpoints" in capsys.readouterr().err
    # one file of the dataset was copied: the dataset is not there (no header, no folder)
    assert len(calls) == 1 and not (tmp_path / "b" / "data" / "synthetic").exists()
    assert main(["fsck", str(tmp_path / "b")]) == 1
    monkeypatch.setattr(copy_module, "_link_or_copy", real)
    assert main(["copy", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert _files(tmp_path / "b" / "data") == {
        k: v for k, v in _files(tmp_path / "a" / "data").items() if not k.startswith(".")
    }
    assert _files(tmp_path / "b" / "tokenizers") == _files(tmp_path / "a" / "tokenizers")


@pytest.mark.postgres
def test_ctrl_c_into_postgresql_says_where_it_stands_without_the_password(
    pg_url: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _source(tmp_path / "a" / "store")
    _root_folders(tmp_path / "a")
    url = pg_url(tmp_path / "pg").replace("@", ":hidden-pw@", 1)  # trust ignores it
    real = copy_module._copy_checkpoints
    monkeypatch.setattr(
        copy_module, "_copy_checkpoints", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    assert main(["copy", str(tmp_path / "a"), url]) == 130
    [said] = capsys.readouterr().err.splitlines()
    assert "hidden-pw" not in said and f"?files={tmp_path / 'pg'} holds part of the copy" in said
    assert main(["fsck", str(tmp_path / "pg")]) == 1  # the folder alone names the store
    assert "is an unfinished copy of" in capsys.readouterr().out
    monkeypatch.setattr(copy_module, "_copy_checkpoints", real)
    assert main(["copy", str(tmp_path / "a"), url]) == 0
    assert _snapshot(tmp_path / "pg" / "store") == _snapshot(tmp_path / "a" / "store")
    assert _files(tmp_path / "pg" / "data") == {
        k: v for k, v in _files(tmp_path / "a" / "data").items() if not k.startswith(".")
    }
    assert main(["fsck", str(tmp_path / "pg")]) == 0
