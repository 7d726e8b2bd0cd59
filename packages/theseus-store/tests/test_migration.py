"""A store the previous release wrote opens, migrated: one row per checkpoint, canonical paths.

The fixture ``data/legacy-store`` was made by ``data/make_legacy_store.py`` with
the code of commit 5dddae6: seven checkpoint rows for three checkpoints (plain
duplicates, and spellings through ``sub/..``), values and two artifact versions.
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
        return list(conn.execute("SELECT id, node, path, relative, step FROM checkpoints"))


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
    assert json.loads((legacy / "theseus-store.json").read_text()) == {"format": 2}
    with contextlib.closing(sqlite3.connect(legacy / "store.sqlite")) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'format'").fetchone() == ("2",)
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
