"""Checkpoint folders: fsck finds what a crash left there and sets it aside, never deletes."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from theseus.store import FolderLock, Node, Store, registered_checkpoints, set_aside, strays
from theseus.store.cli import main


def _step(folder: Path, name: str, payload: str = "weights") -> Path:
    path = folder / name
    path.mkdir(parents=True)
    (path / "state").write_text(payload)
    return path


def _theseus_root(tmp_path: Path) -> tuple[Store, Path, Node]:
    """A store at ROOT/store with one registered checkpoint at ROOT/checkpoints/.../<nonce>/4."""
    store = Store(tmp_path / "store")
    node = Node("p.g.run", "abc123", 3)
    folder = tmp_path / "checkpoints" / "p" / "g" / "run" / node.nonce
    store.checkpoint(node, _step(folder, "4"), step=4)
    return store, folder, node


def test_strays_are_the_step_folders_no_row_names(tmp_path: Path) -> None:
    store, folder, _ = _theseus_root(tmp_path)
    _step(folder, "12")
    _step(folder, "8")
    _step(folder, "16.orbax-checkpoint-tmp-1733051234")
    (folder / "notes").mkdir()  # neither a step nor a temporary folder
    unregistered, interrupted = strays(folder, registered_checkpoints(store))
    assert [p.name for p in unregistered] == ["8", "12"]  # by step, not by text
    assert [p.name for p in interrupted] == ["16.orbax-checkpoint-tmp-1733051234"]
    assert registered_checkpoints(store) == {folder / "4"}
    store.close()


def test_set_aside_moves_and_never_overwrites(tmp_path: Path) -> None:
    folder = tmp_path / "lineage"
    first = _step(folder, "8", "first")
    (moved,) = set_aside([first])
    assert moved == folder / "unregistered" / "8" and (moved / "state").read_text() == "first"
    second = _step(folder, "8", "second")
    (again,) = set_aside([second])
    assert again == folder / "unregistered" / "8-1"
    assert (moved / "state").read_text() == "first" and (again / "state").read_text() == "second"


def test_fsck_reports_then_repairs_checkpoint_leftovers(tmp_path: Path) -> None:
    store, folder, _ = _theseus_root(tmp_path)
    _step(folder, "8", "committed, never indexed")
    _step(folder, "12.orbax-checkpoint-tmp-99", "half written")
    # a lineage killed before its first registration: its run had claimed the folder
    early = tmp_path / "checkpoints" / "p" / "g" / "other" / "zz9"
    store.folders.take(early)
    _step(early, "4")
    # a folder of a lineage the store does not know, which this root never claimed
    # (another root's through a checkpoints/ that is a symlink into this one): left alone
    unknown = _step(tmp_path / "checkpoints" / "p" / "g" / "else" / "yy8", "4")

    report = store.fsck()
    assert report.clean  # leftovers, not problems: every row still has what it names
    assert report.unregistered_checkpoints == [early / "4", folder / "8"]
    assert report.interrupted_checkpoints == [folder / "12.orbax-checkpoint-tmp-99"]
    assert "unregistered checkpoint" in report.render() and str(folder / "8") in report.render()
    assert (folder / "8").is_dir() and not report.set_aside  # a plain fsck changes nothing

    repaired = store.fsck(repair=True)
    assert sorted(repaired.set_aside) == sorted(
        [
            early / "unregistered" / "4",
            folder / "unregistered" / "8",
            folder / "unregistered" / "12.orbax-checkpoint-tmp-99",
        ]
    )
    assert (folder / "unregistered" / "8" / "state").read_text() == "committed, never indexed"
    assert (folder / "4" / "state").read_text() == "weights"  # the registered one stays
    assert unknown.is_dir() and [f for f, _ in repaired.foreign_folders] == [unknown.parent]
    after = store.fsck()
    assert not after.unregistered_checkpoints and not after.interrupted_checkpoints
    store.close()


def test_fsck_leaves_a_folder_with_a_live_writer_alone(tmp_path: Path) -> None:
    store, folder, _ = _theseus_root(tmp_path)
    _step(folder, "8")
    writer = FolderLock(folder)
    assert writer.acquire()
    try:
        for repair in (False, True):
            report = store.fsck(repair=repair)
            assert report.busy_folders == [folder] and not report.unregistered_checkpoints
        assert (folder / "8").is_dir()
    finally:
        writer.release()
    assert store.fsck(repair=True).set_aside == [folder / "unregistered" / "8"]
    store.close()


def test_the_writer_lock_is_exclusive_across_processes_and_dies_with_its_holder(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "lineage"
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from theseus.store import FolderLock
        lock = FolderLock(Path({str(folder)!r}))
        assert lock.acquire()
        print("held", flush=True)
        sys.stdin.readline()
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            lock = FolderLock(folder)
            assert lock.in_use() and not lock.acquire()
            assert lock.holder() == f"pid {holder.pid} on {socket.gethostname()}"
            holder.kill()  # SIGKILL: the file stays, the lock goes with the process
            holder.wait(timeout=30)
            assert (folder / ".writer.lock").exists()
            assert not lock.in_use() and lock.acquire() and lock.held
            lock.release()
        finally:
            if holder.poll() is None:
                holder.kill()


def test_cli_fsck_prints_and_repairs_checkpoint_leftovers(tmp_path: Path, capsys: object) -> None:
    store, folder, _ = _theseus_root(tmp_path)
    store.close()
    _step(folder, "8")
    assert main(["fsck", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert (
        f"unregistered checkpoint (complete, never indexed; --repair sets it aside): {folder / '8'}"
        in out
    )
    assert main(["fsck", str(tmp_path / "store"), "--repair"]) == 0
    assert f"set aside: {folder / 'unregistered' / '8'}" in capsys.readouterr().out  # type: ignore[attr-defined]


def test_a_folder_a_rows_node_and_step_name_is_never_a_stray(tmp_path: Path) -> None:
    """A row that points elsewhere (a missing absolute path) still protects the layout
    folder of its (node, step); fsck reports the row and leaves both places alone."""
    store, folder, node = _theseus_root(tmp_path)
    elsewhere = _step(tmp_path / "outside", "6")
    store.checkpoint(node, elsewhere, step=6)
    elsewhere.rename(tmp_path / "outside" / "gone")
    layout = _step(folder, "6", "the same step, at its layout place")
    report = store.fsck(repair=True)
    assert layout.is_dir() and not report.set_aside and not report.unregistered_checkpoints
    (problem,) = report.problems
    assert problem.startswith(f"The registered checkpoint {elsewhere} (node {node}, step 6)")
    assert "put the folder back there or restore it from a backup" in problem
    assert not elsewhere.exists()  # fsck made nothing where the row points
    assert "2 registered checkpoints checked" in report.render().splitlines()[0]
    store.close()


def test_a_step_folder_without_orbaxs_commit_marker_is_an_interrupted_save(
    tmp_path: Path,
) -> None:
    store, folder, _ = _theseus_root(tmp_path)
    unfinished = folder / "8"
    (unfinished / "state").mkdir(parents=True)
    (unfinished / "state" / "manifest.ocdbt").write_text("orbax was here")  # no marker
    finished = _step(folder, "10")
    (finished / "_CHECKPOINT_METADATA").write_text("{}")
    report = store.fsck()
    assert report.interrupted_checkpoints == [unfinished]
    assert report.unregistered_checkpoints == [finished]
    repaired = store.fsck(repair=True)
    assert sorted(p.name for p in repaired.set_aside) == ["10", "8"]
    store.close()
