"""Property: no spelling of a root makes fsck move or lose a registered checkpoint.

Checkpoints are registered through one spelling of a Theseus root (plain, a
trailing slash, ``./`` or ``sub/..`` segments, a symlink, a path relative to a
subfolder) and the store is opened, checked and repaired through another, with
random run names and nonces (digit-only ones included). The symlink the run
wrote through may be gone by then. Whatever the spellings: fsck is clean, every
registered step folder stays where it is with its bytes, and every stray step
folder is set aside under ``unregistered/``, never deleted.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theseus.store import Node, Store, canonical_path, registered_checkpoints
from theseus.store.cli import main

SPELLINGS = ("plain", "trailing", "dot", "dotdot", "symlink", "relative", "relative-symlink")
RUNS = st.one_of(
    st.from_regex(r"[0-9][0-9_\-]{0,10}", fullmatch=True),
    st.from_regex(r"[A-Za-z][A-Za-z0-9_\-]{0,10}", fullmatch=True),
)
NONCES = st.one_of(
    st.from_regex(r"[0-9]{1,12}", fullmatch=True),
    st.from_regex(r"[a-z0-9]{1,12}", fullmatch=True),
)
STEPS = st.integers(min_value=0, max_value=10**7)


@dataclass(frozen=True)
class Case:
    """One trial: names, registered and stray steps, and the two spellings of the root."""

    run: str
    nonce: str
    registered: frozenset[int]
    strays: frozenset[int]
    written: str
    read: str
    cli: bool


CASES = st.builds(
    Case,
    run=RUNS,
    nonce=NONCES,
    registered=st.frozensets(STEPS, min_size=1, max_size=4),
    strays=st.frozensets(STEPS, max_size=3),
    written=st.sampled_from(SPELLINGS),
    read=st.sampled_from(SPELLINGS),
    cli=st.booleans(),
).filter(lambda case: not case.registered & case.strays)


def _spell(kind: str, path: Path, base: Path) -> str:
    """``path`` (below ``base/real``) as a user might type it; relative ones from ``base/work/sub``."""
    inside = path.relative_to(base / "real")
    if kind == "plain":
        return str(path)
    if kind == "trailing":
        return f"{path}/"
    if kind == "dot":
        return f"{base}/./real/./{inside}"
    if kind == "dotdot":
        return f"{base}/work/sub/../../real/{inside}"
    if kind == "symlink":
        return f"{base}/link/{inside}"
    if kind == "relative":
        return f"../../real/{inside}"
    assert kind == "relative-symlink"
    return f"../../link/{inside}"


def _check(case: Case) -> None:
    base = Path(tempfile.mkdtemp(prefix="theseus-paths-"))
    here = os.getcwd()
    try:
        root = base / "real"
        (base / "work" / "sub").mkdir(parents=True)
        (base / "link").symlink_to(root, target_is_directory=True)
        folder = root / "checkpoints" / "general" / "default" / case.run / case.nonce
        node = Node(f"general.default.{case.run}", case.nonce, 0)
        os.chdir(base / "work" / "sub")
        paths = {}
        with Store(_spell(case.written, root / "store", base)) as store:
            for step in sorted(case.registered):
                path = folder / str(step)
                (path / "state").mkdir(parents=True)
                (path / "state" / "data").write_bytes(f"registered {step}".encode())
                store.checkpoint(node, _spell(case.written, path, base), step=step)
                paths[step] = path
        for step in case.strays:
            (folder / str(step)).mkdir(parents=True)
            (folder / str(step) / "data").write_bytes(f"stray {step}".encode())
        if "symlink" not in case.read:  # the spelling the run wrote through may be gone
            (base / "link").unlink()
        canonical = {canonical_path(p) for p in paths.values()}
        with Store(_spell(case.read, root / "store", base)) as store:
            assert registered_checkpoints(store) == canonical
            report = store.fsck()
            assert report.clean, report.render()
            found = {canonical_path(p) for p in report.unregistered_checkpoints}
            assert found == {canonical_path(folder / str(s)) for s in case.strays}
            if case.cli:
                with contextlib.redirect_stdout(io.StringIO()) as out:
                    status = main(["fsck", _spell(case.read, root / "store", base), "--repair"])
                assert status == 0, out.getvalue()
            else:
                repaired = store.fsck(repair=True)
                assert repaired.clean and len(repaired.set_aside) == len(case.strays)
            for step, path in paths.items():
                assert (path / "state" / "data").read_bytes() == f"registered {step}".encode()
            for step in case.strays:
                assert not (folder / str(step)).exists()
                aside = folder / "unregistered" / str(step) / "data"
                assert aside.read_bytes() == f"stray {step}".encode()
            again = store.fsck()
            assert again.clean and not again.unregistered_checkpoints, again.render()
            for (
                step,
                path,
            ) in paths.items():  # registering again, through this spelling, adds nothing
                store.checkpoint(node, _spell(case.read, path, base), step=step)
            listed = [c.path for c in store.checkpoints(node)]
            assert listed == [str(canonical_path(paths[s])) for s in sorted(case.registered)]
    finally:
        os.chdir(here)
        shutil.rmtree(base, ignore_errors=True)


@settings(max_examples=25, deadline=None, database=None)
@given(case=CASES)
def test_no_spelling_of_the_root_moves_a_registered_checkpoint(case: Case) -> None:
    _check(case)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, database=None)
@given(case=CASES)
def test_no_spelling_of_the_root_moves_a_registered_checkpoint_many(case: Case) -> None:
    _check(case)
