"""Every spelling of a root is one store: paths are kept and compared canonical.

A run may register its checkpoints through a symlink to its root, or through
``--root ../runs`` from a subfolder, and be resumed or checked through another
spelling. Rows hold the canonical path, so a registered checkpoint stays
registered even after the spelling it was written through is gone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from theseus.store import Node, Store, canonical_path
from theseus.store.cli import main

NODE = Node("general.default.r", "12345678", 0)


def _step(root: Path, step: int) -> Path:
    path = root / "checkpoints" / "general" / "default" / "r" / "12345678" / str(step)
    (path / "state").mkdir(parents=True)
    (path / "state" / "data").write_bytes(b"weights")
    return path


def test_canonical_path_folds_every_spelling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(real / "sub")
    expected = real.resolve()
    for spelling in ("../", "..", str(tmp_path / "link"), f"{tmp_path}/link/", f"{real}/./sub/.."):
        assert canonical_path(spelling) == expected, spelling
    assert canonical_path(Path("~")) == Path.home().resolve()


def test_a_root_opened_through_a_symlink_is_stored_canonical(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    with Store(tmp_path / "link" / "store") as store:
        assert store.root == (real / "store").resolve()
        assert repr(store) == f"Store({str((real / 'store').resolve())!r})"


def test_checkpoints_registered_through_a_vanished_symlink_stay_registered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = tmp_path / "real"
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    steps = [_step(real, 2), _step(real, 4)]
    with Store(link / "store") as store:
        for step in (2, 4):
            store.checkpoint(NODE, link / "checkpoints/general/default/r/12345678" / f"{step}/")
        listed = [c.path for c in store.checkpoints(NODE)]
    assert listed == [str(p.resolve()) for p in steps]
    link.unlink()  # the spelling the run used is gone; the root is where it always was
    with Store(real / "store") as store:
        report = store.fsck(repair=True)
        assert report.clean, report.render()
        assert not report.set_aside and not report.unregistered_checkpoints
    assert main(["fsck", str(real / "store")]) == 0
    capsys.readouterr()
    assert all(p.is_dir() for p in steps)


def test_a_relative_root_from_a_subfolder_is_one_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "runs"
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (work / "up").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    step = _step(root, 2)
    monkeypatch.chdir(work)
    # `up/..` is `tmp_path/elsewhere/..` to the file system, not `work` as a text edit says
    spelled = Path("up") / ".." / "runs"
    with Store(spelled / "store") as store:
        assert store.root == (root / "store").resolve()
        store.checkpoint(NODE, spelled / os.path.relpath(step, root), step=2)
        assert [c.path for c in store.checkpoints(NODE)] == [str(step.resolve())]
    monkeypatch.chdir(tmp_path)
    with Store("runs/store/") as store:
        report = store.fsck(repair=True)
        assert report.clean and not report.set_aside, report.render()
    assert step.is_dir()
