"""Stores earlier releases wrote open, migrated: one row per checkpoint, canonical paths,
and the checkpoints of a moved root found at their new place.

The fixture ``data/legacy-store`` (format 1) was made by ``data/make_legacy_store.py``
with the code of commit 5dddae6: seven checkpoint rows for three checkpoints (plain
duplicates, and spellings through ``sub/..``), values and two artifact versions.
``data/format2-root`` (format 2) was made by ``data/make_format2_root.py`` with the
code of commit cda5cc4, in a scratch folder that no longer exists: its rows hold
absolute paths to that folder, as a root's rows do after ``mv``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from theseus.store import Node, Store, canonical_path

LEGACY = Path(__file__).parent / "data" / "legacy-store"
FIRST = Node("general.default.legacy", "12345678", 0)
SECOND = Node("general.default.legacy", "12345678", 1)
OTHER = Node("general.default.2024", "abcdef01", 0)


@pytest.fixture
def legacy(tmp_path: Path) -> Path:
    """A copy of the legacy store, with the step folders its rows name."""
    root = tmp_path / "store"
    shutil.copytree(LEGACY, root)
    for step in (2, 4, 6):
        (root / "ckpt" / str(step)).mkdir(parents=True)
    return root


def _rows(root: Path) -> list[tuple[int, int, str, int, int]]:
    with contextlib.closing(sqlite3.connect(root / "store.sqlite")) as conn:
        return list(
            conn.execute("SELECT id, node, path, relative, step FROM checkpoints ORDER BY id")
        )


def test_the_fixture_is_what_the_previous_release_wrote(legacy: Path) -> None:
    assert json.loads((legacy / "theseus-store.json").read_text()) == {"format": 1}
    assert len(_rows(legacy)) == 7 and any(".." in row[2] for row in _rows(legacy))


def test_opening_dedupes_canonicalizes_and_keeps_everything_else(legacy: Path) -> None:
    with Store(legacy) as store:
        # the earliest row of each checkpoint is kept, its path now canonical
        assert _rows(legacy) == [
            (1, 1, "ckpt/2", 1, 2),
            (4, 2, "ckpt/4", 1, 4),
            (6, 3, "ckpt/6", 1, 6),
        ]
        (entry,) = store.checkpoints(FIRST)
        assert entry.path == str(canonical_path(legacy / "ckpt" / "2")) and entry.meta == {"k": 1}
        assert [c.path for c in store.checkpoints(SECOND)] == [str(legacy / "ckpt" / "4")]
        assert store.query().nonce("12345678").latest_checkpoint() is not None
        assert store.values(FIRST) == {"train/loss": 2.5, "note": "first"}
        assert store.values(SECOND) == {"train/loss": 1.25}
        assert store.values(OTHER) == {"flag": True}
        assert store.get(FIRST)["notes"].content == b"legacy notes, second version"
        assert [a.content for a in store.history(FIRST, "notes")] == [
            b"legacy notes",
            b"legacy notes, second version",
        ]
        report = store.fsck(repair=True)
        assert report.clean, report.render()
        assert all((legacy / "ckpt" / str(step)).is_dir() for step in (2, 4, 6))
        assert not report.set_aside
        # registering again, through any spelling, adds no row
        again = store.checkpoint(FIRST, legacy / "sub" / ".." / "ckpt" / "2/", step=2)
        assert again.meta == {"k": 1} and again.created == entry.created
        store.checkpoint(OTHER, legacy / "ckpt" / "6", step=6)
        assert len(_rows(legacy)) == 3
    assert json.loads((legacy / "theseus-store.json").read_text()) == {"format": 4}
    with contextlib.closing(sqlite3.connect(legacy / "store.sqlite")) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone() == ("4",)
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            conn.execute(
                "INSERT INTO checkpoints(node, path, relative, step, meta, created) "
                "VALUES (1, 'ckpt/2', 1, 2, '{}', 0)"
            )
    with Store(legacy) as store:  # a second open finds nothing to migrate
        assert len(_rows(legacy)) == 3 and store.fsck().clean


def test_registering_twice_in_a_new_store_is_idempotent(store: Store, tmp_path: Path) -> None:
    node = Node.new("r")
    path = tmp_path / "ckpt" / "8"
    path.mkdir(parents=True)
    first = store.checkpoint(node, path, {"a": 1}, step=8)
    with store.batch():
        second = store.checkpoint(node, tmp_path / "ckpt" / "." / "8", {"a": 2}, step=8)
    assert second == first
    assert store.checkpoints(node) == [first]
    other = store.checkpoint(node, path, step=9)  # another step of the same folder is its own
    assert store.checkpoints(node) == [first, other] and store.fsck().clean


FORMAT2 = Path(__file__).parent / "data" / "format2-root"
LINEAGE = ("general", "default", "legacy", "12345678")
DIGITS = ("proj", "2024", "7", "00000001")


@pytest.fixture
def moved(tmp_path: Path) -> Path:
    """A copy of the format 2 root at a new place, with the step folders of its layout."""
    root = tmp_path / "moved root"
    shutil.copytree(FORMAT2, root)
    for step in (2, 4):
        (root / "checkpoints" / Path(*LINEAGE) / str(step)).mkdir(parents=True)
    (root / "checkpoints" / Path(*DIGITS) / "3").mkdir(parents=True)
    return root


def test_a_moved_format_2_root_finds_its_checkpoints_at_their_new_place(moved: Path) -> None:
    (old,) = {Path(row[2]).parents[5] for row in _rows(moved / "store") if row[4] != 9}
    assert not old.exists()  # the rows name the scratch root the fixture was made in
    lineage = moved / "checkpoints" / Path(*LINEAGE)
    with Store(moved / "store") as store:
        # rows below ROOT/checkpoints are now relative to ROOT; the one outside stays absolute
        assert _rows(moved / "store") == [
            (1, 1, "checkpoints/general/default/legacy/12345678/2", 2, 2),
            (2, 2, "checkpoints/general/default/legacy/12345678/4", 2, 4),
            (3, 3, "checkpoints/proj/2024/7/00000001/3", 2, 3),
            (4, 2, str(old / "elsewhere" / "9"), 0, 9),
        ]
        node = Node("general.default.legacy", "12345678", 4)
        assert [(c.path, c.step, c.meta) for c in store.checkpoints(node)] == [
            (str(lineage / "4"), 4, {"k": 2}),
            (str(old / "elsewhere" / "9"), 9, {}),
        ]
        report = store.fsck(repair=True)
        # nothing of the layout is set aside; the checkpoint outside it is missing
        assert not report.set_aside and not report.unregistered_checkpoints
        assert [(lineage / str(step)).is_dir() for step in (2, 4)] == [True, True]
        (problem,) = report.problems
        assert str(old / "elsewhere" / "9") in problem and "missing" in problem
    assert not old.exists()  # fsck made nothing at the old place (no lock file, no folder)
    assert json.loads((moved / "store" / "theseus-store.json").read_text()) == {"format": 4}


def test_a_format_2_row_whose_new_place_is_empty_stays_as_it_was(moved: Path) -> None:
    shutil.rmtree(moved / "checkpoints" / Path(*DIGITS))
    before = _rows(moved / "store")[2]
    with Store(moved / "store") as store:
        assert _rows(moved / "store")[2] == before  # nothing to point at: kept, reported
        assert any(before[2] in p for p in store.fsck().problems)


def test_a_moved_or_copied_new_root_reads_its_own_checkpoints(tmp_path: Path) -> None:
    node = Node("general.default.r", "12345678", 8)
    first = tmp_path / "a"
    step = first / "checkpoints" / "general" / "default" / "r" / "12345678" / "8"
    step.mkdir(parents=True)
    (step / "_CHECKPOINT_METADATA").write_text("{}")
    with Store(first / "store") as store:
        store.checkpoint(node, step, step=8)
    shutil.copytree(first, tmp_path / "copy", symlinks=True)
    first.rename(tmp_path / "b")
    for where in ("b", "copy"):
        with Store(tmp_path / where / "store") as store:
            (entry,) = store.checkpoints(node)
            assert entry.path == str(tmp_path / where / step.relative_to(first))
            report = store.fsck(repair=True)
            assert report.clean and not report.set_aside, report.render()
