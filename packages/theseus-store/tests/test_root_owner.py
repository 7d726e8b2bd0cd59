"""One root never touches another root's checkpoints: partial copies, shared trees, twin rows.

The reference is the file system: every step folder is made here by hand with
bytes of its own, and each test compares a digest of every file under the other
root's folders before and after the repair or resume under test.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from theseus.store import Node, Store, StorePermissionError, open_lineage_folder

FORMAT2 = Path(__file__).parent / "data" / "format2-root"
LINEAGE = Path("general", "default", "legacy", "12345678")
DIGITS = Path("proj", "2024", "7", "00000001")


def _digest(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` (relative path) and the SHA-256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _step(folder: Path, payload: str) -> Path:
    (folder / "state").mkdir(parents=True)
    (folder / "state" / "data").write_text(payload)
    (folder / "_CHECKPOINT_METADATA").write_text("{}")
    return folder


def _format2_original(tmp_path: Path) -> Path:
    """The format 2 fixture as the root it was written in: rows absolute into it."""
    root = tmp_path / "original"
    shutil.copytree(FORMAT2, root)
    with contextlib.closing(sqlite3.connect(root / "store" / "store.sqlite")) as conn:
        paths = [Path(p) for (p,) in conn.execute("SELECT path FROM checkpoints")]
        (old,) = {Path(*p.parts[:4]) for p in paths}  # /tmp/<scratch>/root
        conn.execute("UPDATE checkpoints SET path = replace(path, ?, ?)", (str(old), str(root)))
        conn.commit()
    for step in (2, 4):
        _step(root / "checkpoints" / LINEAGE / str(step), f"original step {step}")
    _step(root / "checkpoints" / DIGITS / "3", "original digits")
    _step(root / "elsewhere" / "9", "original elsewhere")
    return root


def test_repairing_a_partial_copy_leaves_the_original_root_alone(tmp_path: Path) -> None:
    """The issue's case: a format 2 root copied with only its latest checkpoint, the copy
    repaired. Before the fix the original's lineage folder was emptied (its step 4 and,
    through the copy's absolute row, every step the copy did not name)."""
    original = _format2_original(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(original / "store", copy / "store")
    for latest in (LINEAGE / "4", DIGITS / "3"):
        shutil.copytree(original / "checkpoints" / latest, copy / "checkpoints" / latest)
    before = _digest(original)
    with Store(copy / "store") as store:
        report = store.fsck(repair=True)
        assert _digest(original) == before, report.render()
        # the copy's own rows moved to its tree; step 2 and the folder elsewhere stay
        # where the original's rows pointed: outside this root, reported, untouched
        assert report.outside == [
            original / "checkpoints" / LINEAGE / "2",
            original / "elsewhere" / "9",
        ], report.render()
        assert "registered outside this root" in report.render()
        assert not report.set_aside and not report.unregistered_checkpoints
        assert report.clean, report.render()


def _shared_roots(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Two roots whose checkpoints/ are symlinks to one folder."""
    shared = tmp_path / "shared-checkpoints"
    shared.mkdir()
    roots = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "checkpoints").symlink_to(shared)
        roots.append(tmp_path / name)
    return roots[0], roots[1], shared


def _train(store: Store, root: Path, run: str, nonce: str, steps: list[int]) -> Path:
    """What a trainer does: take the lineage folder, write each step, register it."""
    folder = root / "checkpoints" / "general" / "default" / run / nonce
    open_lineage_folder(store, folder)
    for step in steps:
        path = _step(folder / str(step), f"{root.name} {run} {step}")
        store.checkpoint(Node(f"general.default.{run}", nonce, step), path, step=step)
    return folder


def test_a_copy_made_with_its_symlinks_never_moves_the_originals_checkpoints(
    tmp_path: Path,
) -> None:
    a, _, shared = _shared_roots(tmp_path)
    with Store(a / "store") as store:
        folder = _train(store, a, "r", "abcd1234", [2])
    shutil.copytree(a, tmp_path / "copy", symlinks=True)  # `cp -a`: the same checkpoints/
    with Store(a / "store") as store:  # the original trains on: step 4 only it registers
        _train(store, a, "r", "abcd1234", [4])
    before = _digest(shared)
    with Store(tmp_path / "copy" / "store") as store:
        report = store.fsck(repair=True)
        assert not report.set_aside and not report.unregistered_checkpoints, report.render()
        ((seen, whose),) = report.foreign_folders
        assert seen == folder.resolve() and str(a / "store") in whose
        with pytest.raises(StorePermissionError, match=r"belongs to the root whose store"):
            open_lineage_folder(store, tmp_path / "copy" / folder.relative_to(a))
    assert _digest(shared) == before
    with Store(a / "store") as store:  # the original still repairs its own folder
        (folder / "6").mkdir()
        assert store.fsck(repair=True).set_aside == [folder.resolve() / "unregistered" / "6"]


def test_two_roots_sharing_one_checkpoint_folder_repair_only_their_own(tmp_path: Path) -> None:
    a, b, shared = _shared_roots(tmp_path)
    with Store(a / "store") as store_a, Store(b / "store") as store_b:
        mine = _train(store_a, a, "r", "aaaa1111", [2])
        theirs = _train(store_b, b, "r", "bbbb2222", [2])
        (mine / "8").mkdir()  # a's unregistered leftover
        (theirs / "8").mkdir()  # b's
        before = _digest(theirs)
        report = store_a.fsck(repair=True)
        assert report.set_aside == [mine.resolve() / "unregistered" / "8"]
        assert [f for f, _ in report.foreign_folders] == [theirs.resolve()]
        assert _digest(theirs) == before and (theirs / "8").is_dir()
        assert store_b.fsck().unregistered_checkpoints == [theirs.resolve() / "8"]
    assert (shared / "general" / "default" / "r" / "bbbb2222" / "2").is_dir()


def test_a_moved_root_keeps_its_folders_and_its_copy_owns_its_own(tmp_path: Path) -> None:
    first = tmp_path / "first"
    with Store(first / "store") as store:
        folder = _train(store, first, "r", "abcd1234", [2])
    shutil.copytree(first, tmp_path / "copy")  # a real copy: new folders of its own
    first.rename(tmp_path / "moved")
    for where in ("moved", "copy"):
        root = tmp_path / where
        with Store(root / "store") as store:
            lineage = root / folder.relative_to(first)
            (lineage / "6").mkdir()
            report = store.fsck(repair=True)
            assert report.set_aside == [lineage / "unregistered" / "6"], report.render()
            assert not report.foreign_folders
            _train(store, root, "r", "abcd1234", [8])  # resume: the folder is taken again
            assert json.loads((lineage / ".theseus-root").read_text())["path"] == str(
                root / "store"
            )


def test_a_checkpoint_inside_the_store_and_one_in_the_tree_are_two_rows(tmp_path: Path) -> None:
    """``ROOT/store/checkpoints/a`` and ``ROOT/checkpoints/a`` are stored as the same text
    ``checkpoints/a``: before format 4 the second registration returned the first's entry
    and registered nothing."""
    node = Node("general.default.r", "abcd1234", 3)
    Store(tmp_path / "store").close()
    inner = _step(tmp_path / "store" / "checkpoints" / "a", "inner")
    outer = _step(tmp_path / "checkpoints" / "a", "outer")
    with Store(tmp_path / "store") as store:
        store.checkpoint(node, inner, {"where": "inner"}, step=3)
        second = store.checkpoint(node, outer, {"where": "outer"}, step=3)
        assert second.path == str(outer) and second.meta == {"where": "outer"}
        assert [(c.path, c.meta) for c in store.checkpoints(node)] == [
            (str(inner), {"where": "inner"}),
            (str(outer), {"where": "outer"}),
        ]


def test_migrating_rows_that_become_one_text_keeps_both(tmp_path: Path) -> None:
    """A format 2 store with absolute rows at ``ROOT/store/checkpoints/a`` and
    ``ROOT/checkpoints/a``: the migration rewrites both to ``checkpoints/a``; before
    format 4 it failed on format 3's unique index (or its de-duplication dropped one)."""
    node = Node("general.default.r", "abcd1234", 3)
    Store(tmp_path / "store").close()
    inner = _step(tmp_path / "store" / "checkpoints" / "a", "inner")
    outer = _step(tmp_path / "checkpoints" / "a", "outer")
    with Store(tmp_path / "store") as store:
        store.checkpoint(node, inner, step=3)
        store.checkpoint(node, outer, step=3)
    with contextlib.closing(sqlite3.connect(tmp_path / "store" / "store.sqlite")) as conn:
        # what format 2 wrote: absolute paths, one row per (node, step, path)
        conn.execute("DROP INDEX checkpoints_unique")
        for cid, path in ((1, inner), (2, outer)):
            conn.execute(
                "UPDATE checkpoints SET path = ?, relative = 0 WHERE id = ?", (str(path), cid)
            )
        conn.execute("CREATE UNIQUE INDEX checkpoints_once ON checkpoints(node, step, path)")
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'format'")
        conn.commit()
    (tmp_path / "store" / "theseus-store.json").write_text('{"format": 2}\n')
    with Store(tmp_path / "store") as store:
        assert [c.path for c in store.checkpoints(node)] == [str(inner), str(outer)]
        assert store.fsck().clean
