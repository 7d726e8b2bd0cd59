"""Registered checkpoints never move: digit names, live writers, missing folders.

The reference is the file system itself: the folders created here by hand, and
whether they still exist at the same paths after fsck and fsck --repair.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from theseus.store import Node, Store
from theseus.store.cli import main

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
sys.stdin.read()
"""


def _registered(root: Path, run: str, nonce: str, steps: list[int]) -> tuple[Store, list[Path]]:
    store = Store(root / "store")
    folder = root / "checkpoints" / "general" / "default" / run / nonce
    paths = []
    for seq, step in enumerate(steps):
        path = folder / str(step)
        (path / "state").mkdir(parents=True)
        (path / "state" / "data").write_bytes(b"weights")
        store.checkpoint(Node(f"general.default.{run}", nonce, seq), path, step=step)
        paths.append(path)
    return store, paths


@pytest.mark.parametrize(
    ("run", "nonce"), [("r", "12345678"), ("2024", "abcdef01"), ("7", "00000000")]
)
def test_repair_with_a_live_writer_moves_no_registered_checkpoint(
    tmp_path: Path, run: str, nonce: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store, paths = _registered(tmp_path, run, nonce, [2, 4])
    stray = paths[0].parent / "6"  # complete, never registered
    stray.mkdir()
    lock = paths[0].parent / ".writer.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        report = store.fsck(repair=True)
        assert main(["fsck", str(tmp_path / "store"), "--repair"]) == 0
        assert all(p.is_dir() for p in paths) and stray.is_dir()  # a live writer's folder
        assert report.busy_folders == [paths[0].parent] and not report.set_aside
    finally:
        holder.communicate(b"")
    capsys.readouterr()
    report = store.fsck(repair=True)  # the writer is gone: only the stray moves
    assert all(p.is_dir() for p in paths) and not stray.exists()
    assert report.set_aside == [paths[0].parent / "unregistered" / "6"]
    assert {c.path for n in store.query().nonce(nonce).all() for c in store.checkpoints(n)} == {
        str(p) for p in paths
    }
    store.close()


def test_a_missing_registered_checkpoint_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, paths = _registered(tmp_path, "r", "12345678", [2, 4])
    for entry in (paths[1] / "state").iterdir():
        entry.unlink()
    (paths[1] / "state").rmdir()
    paths[1].rmdir()
    report = store.fsck()
    assert not report.clean and any(str(paths[1]) in p for p in report.problems)
    assert main(["fsck", str(tmp_path / "store")]) == 1
    store.close()
