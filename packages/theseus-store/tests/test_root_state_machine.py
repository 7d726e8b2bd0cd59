"""Two roots, every way a person moves them: nothing registered ever moves, fsck tells the truth.

A hypothesis state machine drives two root slots through what happens to roots in
practice: training (a lineage taken, steps written and registered, a crash that
leaves a step unregistered or a save interrupted), a checkpoint registered outside
the root, ``cp -a`` of a whole root, a partial copy (the store and only the latest
step of each lineage), ``mv``, ``fsck --repair`` of either, and a resume of either.
The two roots' ``checkpoints/`` are either their own folders or symlinks to one
shared folder.

The reference is a model kept here from the file operations alone: every step
folder written, with a digest of its bytes, and which root each physical lineage
folder belongs to (the root that first wrote it; a real copy's folders belong to
the copy; a shared folder stays its writer's; ``mv`` keeps ownership). After
every step the test checks that

* every folder the model knows is where the model says, with the same bytes; the
  only moves allowed are set-asides the code reports, and each must be of a folder
  no existing root registers, inside a lineage folder the repairing root owns;
* fsck of each root tells the truth: its problems are exactly its rows whose folder
  is not there, and its unregistered and interrupted checkpoints are exactly the
  leftovers in the lineage folders it owns;
* a resume of a lineage folder another root owns is refused with nothing changed.

The default suite runs 100 examples (``THESEUS_ROOT_EXAMPLES`` sets another
number); ``nox -s slow`` runs 5,000 more.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from theseus.store import (
    Node,
    Store,
    StorePermissionError,
    open_lineage_folder,
    registered_checkpoints,
)

TEMP = ".orbax-checkpoint-tmp-"
# A store makes its 256 blob folders up front; on a disk where mkdir costs half a
# millisecond that is most of an example's time, so the roots live in memory (tmpfs)
# where the machine has it.
FAST_TMP = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
SLOTS = ("a", "b")


def _digest(path: Path) -> str:
    """SHA-256 over a folder's file names and bytes (``missing`` if it is not there)."""
    if not path.is_dir():
        return "missing"
    sha = hashlib.sha256()
    for entry in sorted(path.rglob("*")):
        if entry.is_file():
            sha.update(str(entry.relative_to(path)).encode() + b"\0" + entry.read_bytes())
    return sha.hexdigest()


class Root:
    """One root as the model sees it: where it is, whether its tree is shared, its lineages."""

    ids = itertools.count()

    def __init__(self, path: Path, shared: bool) -> None:
        self.id = next(Root.ids)
        self.path = path
        self.shared = shared
        #: lineage (run, nonce) -> the last step written
        self.lineages: dict[tuple[str, str], int] = {}
        #: the lineages its store knows (a checkpoint of theirs was registered)
        self.known: set[tuple[str, str]] = set()


class TwoRoots(RuleBasedStateMachine):
    """The state machine; see the module docstring."""

    lineages = Bundle("lineages")

    def __init__(self) -> None:
        super().__init__()
        self.base = Path(tempfile.mkdtemp(prefix="roots-", dir=FAST_TMP)).resolve()
        self.shared_tree = self.base / "shared"
        self.roots: dict[str, Root] = {}
        #: every folder the model wrote (steps, interrupted saves, set-aside ones) -> digest
        self.files: dict[Path, str] = {}
        #: physical lineage folder -> id of the root that owns it (None: no root can place it)
        self.owner: dict[Path, int | None] = {}
        self.counter = itertools.count()

    def teardown(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------------------

    def _new_root(self, slot: str, shared: bool, path: Path | None = None) -> Root:
        root = Root(path or self.base / f"{slot}-{next(self.counter)}", shared)
        root.path.mkdir(parents=True)
        if shared:
            self.shared_tree.mkdir(exist_ok=True)
            (root.path / "checkpoints").symlink_to(self.shared_tree)
        self.roots[slot] = root
        return root

    def _tree(self, root: Root) -> Path:
        return self.shared_tree if root.shared else root.path / "checkpoints"

    def _rows(self, root: Root, store: Store | None = None) -> set[Path]:
        if store is None:
            with Store(root.path / "store") as opened:
                return registered_checkpoints(opened)
        return registered_checkpoints(store)

    def _registered_anywhere(self) -> set[Path]:
        return {p for root in self.roots.values() for p in self._rows(root)}

    def _write(self, folder: Path) -> None:
        folder.mkdir(parents=True)
        (folder / "data").write_bytes(os.urandom(16))
        (folder / "_CHECKPOINT_METADATA").write_text("{}")
        self.files[folder] = _digest(folder)

    def _accept_set_aside(self, root: Root, moved: list[Path]) -> None:
        """Check each reported move against the model, then record it."""
        registered = self._registered_anywhere()
        for target in moved:
            names = (target.name, target.name.rsplit("-", 1)[0])  # <name> or <name>-<n>
            sources = [target.parent.parent / n for n in names]
            known = [p for p in sources if p in self.files and not p.exists()]
            assert known, f"set aside {target}: the model knows no folder it came from"
            source = known[0]
            assert source not in registered, f"{source} is registered and was set aside"
            assert self.owner.get(source.parent) == root.id, (
                f"{source} set aside by a root that does not own {source.parent}"
            )
            self.files[target] = self.files.pop(source)

    def _remove(self, slot: str) -> None:
        """Delete a root as a person would: its folder and the lineage folders it owns."""
        old = self.roots.pop(slot)
        for folder in [f for f, owner in self.owner.items() if owner == old.id]:
            shutil.rmtree(folder, ignore_errors=True)
            del self.owner[folder]
        shutil.rmtree(old.path)
        self.files = {p: d for p, d in self.files.items() if p.exists()}

    # -- rules -----------------------------------------------------------------------------

    @initialize(shared=st.booleans())
    def start(self, shared: bool) -> None:
        for slot in SLOTS:
            self._new_root(slot, shared)

    @rule(
        target=lineages,
        slot=st.sampled_from(SLOTS),
        steps=st.integers(1, 2),
        crash=st.sampled_from(["none", "unregistered", "interrupted"]),
    )
    def train_new(self, slot: str, steps: int, crash: str) -> tuple[str, str, str]:
        run = f"r{next(self.counter)}"
        nonce = f"{next(self.counter):08d}"
        self._train(slot, run, nonce, steps, crash)
        return slot, run, nonce

    @rule(
        lineage=lineages,
        slot=st.sampled_from(SLOTS),
        steps=st.integers(1, 2),
        crash=st.sampled_from(["none", "unregistered", "interrupted"]),
    )
    def resume(self, lineage: tuple[str, str, str], slot: str, steps: int, crash: str) -> None:
        _, run, nonce = lineage
        if (run, nonce) not in self.roots[slot].lineages:
            return  # that slot's root does not have this lineage (any more)
        self._train(slot, run, nonce, steps, crash)

    def _train(self, slot: str, run: str, nonce: str, steps: int, crash: str) -> None:
        root = self.roots[slot]
        folder = root.path / "checkpoints" / "general" / "default" / run / nonce
        physical = self._tree(root) / "general" / "default" / run / nonce
        owner = self.owner.get(physical)
        before = {p: _digest(p) for p in self.files}
        with Store(root.path / "store") as store:
            if owner is not None and owner != root.id:
                with pytest.raises(StorePermissionError, match="belongs to the root"):
                    open_lineage_folder(store, folder)
                assert {p: _digest(p) for p in self.files} == before
                return
            moved = open_lineage_folder(store, folder)
            self.owner[physical] = root.id  # taken: a folder nobody could place is its now
            self._accept_set_aside(root, moved)
            last = root.lineages.get((run, nonce), 0)
            for step in range(last + 1, last + steps + 1):
                path = physical / str(step)
                if path.exists():  # a step folder the model never wrote would be a bug
                    raise AssertionError(f"{path} exists before the step was written")
                self._write(path)
                if step == last + steps and crash == "unregistered":
                    continue
                store.checkpoint(Node(f"general.default.{run}", nonce, step), path, step=step)
                root.known.add((run, nonce))
            if crash == "interrupted":
                self._write(physical / f"{last + steps + 1}{TEMP}{next(self.counter)}")
        root.lineages[(run, nonce)] = last + steps

    @rule(slot=st.sampled_from(SLOTS))
    def register_outside(self, slot: str) -> None:
        root = self.roots[slot]
        path = self.base / "elsewhere" / str(next(self.counter))
        self._write(path)
        with Store(root.path / "store") as store:
            store.checkpoint(Node("general.default.outside", "0000ffff", 0), path, step=0)

    @rule(source=st.sampled_from(SLOTS))
    def copy_whole(self, source: str) -> None:
        """``cp -a`` of one root over the other slot (the old one deleted first)."""
        target = "b" if source == "a" else "a"
        self._remove(target)
        src = self.roots[source]
        dst = Root(self.base / f"{target}-{next(self.counter)}", src.shared)
        shutil.copytree(src.path, dst.path, symlinks=True)
        dst.lineages, dst.known = dict(src.lineages), set(src.known)
        self.roots[target] = dst
        if not src.shared:
            for path in [p for p in self.files if src.path in p.parents]:
                self.files[dst.path / path.relative_to(src.path)] = self.files[path]
            for folder in [f for f in self.owner if src.path in f.parents and f.exists()]:
                # every lineage folder the copy brought (the source's own, or one nobody
                # could place): the copy's own when its store knows the lineage, else
                # nobody's (a lineage that never registered a checkpoint)
                known = (folder.parent.name, folder.name) in dst.known
                self.owner[dst.path / folder.relative_to(src.path)] = dst.id if known else None

    @rule(source=st.sampled_from(SLOTS))
    def copy_partly(self, source: str) -> None:
        """The store and only the latest registered step of each lineage, into a real tree."""
        target = "b" if source == "a" else "a"
        self._remove(target)
        src = self.roots[source]
        dst = Root(self.base / f"{target}-{next(self.counter)}", shared=False)
        dst.known = set(src.known)
        shutil.copytree(src.path / "store", dst.path / "store")
        rows = self._rows(src)
        for (run, nonce), _ in src.lineages.items():
            physical = self._tree(src) / "general" / "default" / run / nonce
            steps = sorted(int(p.name) for p in rows if p.parent == physical and p.exists())
            if not steps:
                continue
            here = dst.path / "checkpoints" / "general" / "default" / run / nonce
            shutil.copytree(physical / str(steps[-1]), here / str(steps[-1]))
            self.files[here / str(steps[-1])] = self.files[physical / str(steps[-1])]
            self.owner[here] = dst.id
            dst.lineages[(run, nonce)] = src.lineages[(run, nonce)]
        self.roots[target] = dst

    @rule(slot=st.sampled_from(SLOTS))
    def move(self, slot: str) -> None:
        root = self.roots[slot]
        new = self.base / f"{slot}-{next(self.counter)}"
        root.path.rename(new)
        old, root.path = root.path, new
        self.files = {
            (new / p.relative_to(old) if old in p.parents else p): d for p, d in self.files.items()
        }
        self.owner = {
            (new / f.relative_to(old) if old in f.parents else f): o for f, o in self.owner.items()
        }

    @rule(slot=st.sampled_from(SLOTS))
    def repair(self, slot: str) -> None:
        root = self.roots[slot]
        with Store(root.path / "store") as store:
            report = store.fsck(repair=True)
        self._accept_set_aside(root, report.set_aside)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def nothing_moved_behind_the_models_back(self) -> None:
        for path, digest in self.files.items():
            assert _digest(path) == digest, f"{path} changed or moved"

    @invariant()
    def fsck_tells_the_truth(self) -> None:
        for slot, root in self.roots.items():
            with Store(root.path / "store") as store:
                rows = self._rows(root, store)
                report = store.fsck()
            missing = sorted({p for p in rows if p not in self.files})
            assert len(report.problems) == len(missing), report.render()
            for path in missing:
                assert any(str(path) in problem for problem in report.problems), report.render()
            owned = [f for f, owner in self.owner.items() if owner == root.id]
            leftovers = {
                p
                for p in self.files
                if p.parent in owned and p not in rows and p.name.split(TEMP)[0].isdigit()
            }
            found = set(report.unregistered_checkpoints) | set(report.interrupted_checkpoints)
            assert found == leftovers, (slot, report.render())
            tree = self._tree(root).resolve()
            foreign = {
                f for f, owner in self.owner.items() if owner != root.id and tree in f.parents
            }
            foreign = {f for f in foreign if any(p.parent == f for p in self.files)}
            assert {f for f, _ in report.foreign_folders} == foreign, report.render()


SETTINGS = {
    "stateful_step_count": 8,
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much],
}
TwoRoots.TestCase.settings = settings(
    max_examples=int(os.environ.get("THESEUS_ROOT_EXAMPLES", "100")), **SETTINGS
)
test_two_roots = TwoRoots.TestCase


class TwoRootsAtLength(TwoRoots):
    """The same machine, 5,000 examples (``nox -s slow``)."""


TwoRootsAtLength.TestCase.settings = settings(max_examples=5_000, **SETTINGS)
test_two_roots_at_length = pytest.mark.slow(TwoRootsAtLength.TestCase)
