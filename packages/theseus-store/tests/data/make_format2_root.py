"""Make ``format2-root/``: a Theseus root whose store format 2 wrote (commit cda5cc4).

Format 2 stored a checkpoint below ``ROOT/checkpoints`` as an absolute path. The
root was made in a scratch folder that is gone now, so a copy of it is a root
that has been moved: ``test_migration.py`` opens one with the current code and
expects every checkpoint found at its new place. Re-create it (from the
repository root) with::

    git worktree add /tmp/format2 cda5cc4
    PYTHONPATH=/tmp/format2/packages/theseus-store/src .venv/bin/python \\
        packages/theseus-store/tests/data/make_format2_root.py
    git worktree remove --force /tmp/format2

Only the store's two files are kept (``store/theseus-store.json``,
``store/store.sqlite``); the test makes the step folders again.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import theseus.store
from theseus.store import Node, Store

HERE = Path(__file__).parent / "format2-root"
KEEP = ("theseus-store.json", "store.sqlite")


def main() -> None:
    """Write the root into a scratch folder, then copy its store's files beside this script."""
    if "/format2/" not in theseus.store.__file__:
        sys.exit(f"Run with format 2's theseus-store on PYTHONPATH; got {theseus.store.__file__}.")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "root"
        store = Store(root / "store")
        first = Node("general.default.legacy", "12345678", 2)
        second = Node("general.default.legacy", "12345678", 4)
        digits = Node("proj.2024.7", "00000001", 3)
        lineage = root / "checkpoints" / "general" / "default" / "legacy" / "12345678"
        for step in (2, 4):
            (lineage / str(step)).mkdir(parents=True)
        (root / "checkpoints" / "proj" / "2024" / "7" / "00000001" / "3").mkdir(parents=True)
        (root / "elsewhere" / "9").mkdir(parents=True)
        store.log(first, {"train/loss": 2.5})
        store.log(second, {"train/loss": 1.25})
        store.checkpoint(first, lineage / "2", {"k": 1}, step=2)
        store.checkpoint(second, lineage / "4", {"k": 2}, step=4)
        store.checkpoint(digits, root / "checkpoints/proj/2024/7/00000001/3", step=3)
        store.checkpoint(second, root / "elsewhere" / "9", step=9)  # outside the layout
        store.close()
        shutil.rmtree(HERE, ignore_errors=True)
        (HERE / "store").mkdir(parents=True)
        for name in KEEP:
            shutil.copy(root / "store" / name, HERE / "store" / name)
    print(f"wrote {', '.join(KEEP)} to {HERE / 'store'}")


if __name__ == "__main__":
    main()
