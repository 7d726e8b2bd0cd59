"""Make ``legacy-store/``: a store written by the previous release (commit 5dddae6).

That release stored checkpoint paths as ``Path(path).expanduser().absolute()``
(``..`` and symlinks kept as spelled) and let one checkpoint be registered any
number of times. ``test_migration.py`` opens a copy of the result with the
current code. Re-create it (from the repository root) with::

    git worktree add /tmp/old5 5dddae6
    PYTHONPATH=/tmp/old5/packages/theseus-store/src .venv/bin/python \\
        packages/theseus-store/tests/data/make_legacy_store.py
    git worktree remove --force /tmp/old5

Only ``theseus-store.json`` and ``store.sqlite`` are kept: every checkpoint lies
inside the root (so its row is relative and the copy can live anywhere), and the
test makes the step folders again. Artifacts are small, so they live inline in
the database and the blob folder stays empty.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import theseus.store
from theseus.store import Node, Store

HERE = Path(__file__).parent / "legacy-store"
KEEP = ("theseus-store.json", "store.sqlite")


def main() -> None:
    """Write the store into a scratch folder, then copy its two files beside this script."""
    if "/old5/" not in theseus.store.__file__:
        sys.exit(f"Run with the previous release on PYTHONPATH; got {theseus.store.__file__}.")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "store"
        store = Store(root)
        first = Node("general.default.legacy", "12345678", 0)
        second = Node("general.default.legacy", "12345678", 1)
        other = Node("general.default.2024", "abcdef01", 0)
        for step in (2, 4, 6):
            (root / "ckpt" / str(step)).mkdir(parents=True)
        (root / "sub").mkdir()
        store.log(first, {"train/loss": 2.5, "note": "first"})
        store.log(second, {"train/loss": 1.25})
        store.log(other, {"flag": True})
        store.put(first, "notes", "notes.txt", b"legacy notes")
        store.put(first, "notes", "notes.txt", b"legacy notes, second version")
        store.checkpoint(first, root / "ckpt" / "2", {"k": 1}, step=2)  # id 1: kept
        store.checkpoint(first, root / "ckpt" / "2", {"k": 2}, step=2)  # a plain duplicate
        store.checkpoint(first, root / "sub" / ".." / "ckpt" / "2", step=2)  # one via `..`
        store.checkpoint(second, root / "sub" / ".." / "ckpt" / "4", step=4)  # only via `..`
        store.checkpoint(second, root / "ckpt" / "4", step=4)  # its canonical twin
        store.checkpoint(other, root / "ckpt" / "6", step=6)
        store.checkpoint(other, root / "ckpt" / "6", step=6)
        store.close()
        shutil.rmtree(HERE, ignore_errors=True)
        HERE.mkdir()
        for name in KEEP:
            shutil.copy(root / name, HERE / name)
    print(f"wrote {', '.join(KEEP)} to {HERE}")


if __name__ == "__main__":
    main()
