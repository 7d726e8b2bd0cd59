"""Any number of processes may open (and so create) one fresh store at the same moment."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from theseus.store import Node, Store

PROCESSES = 8

# A separate interpreter per opener (a fork of a process that has imported JAX is
# unsafe): each says "ready", waits for the go file, then opens the store and writes.
OPENER = textwrap.dedent(
    """
    import os, sys, time
    from theseus.store import Node, Store
    root, go, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print("ready", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("the go file never appeared")
        time.sleep(0.0005)
    with Store(root) as store:
        store.log(Node(f"p.g.host{index}", "n0", 0), {"index": index})
    """
)


def _trial(root: Path) -> list[str]:
    go = root.parent / "go"
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(root), str(go), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    found = []
    try:
        for opener in openers:  # every opener has imported the store and is waiting
            assert opener.stdout is not None and opener.stdout.readline() == "ready\n"
        go.parent.mkdir(parents=True, exist_ok=True)
        go.touch()
        for i, opener in enumerate(openers):
            _, err = opener.communicate(timeout=120)
            if opener.returncode:
                found.append(f"process {i} exited {opener.returncode}: {err[-2000:]}")
    finally:
        for opener in openers:
            if opener.poll() is None:
                opener.kill()
                opener.communicate()
    return found


def _check(root: Path, trials: int) -> None:
    failures = []
    for trial in range(trials):
        where = root / f"trial{trial}" / "store"  # a missing parent, as on a fresh cluster
        errors = _trial(where)
        if errors:
            failures.append((trial, errors))
            continue
        with Store(where, create=False) as store:
            hosts = sorted(n.name for n in store.query().all())
            assert hosts == sorted(f"p.g.host{i}" for i in range(PROCESSES)), hosts
            assert store.fsck().clean
        leftovers = sorted(p.name for p in where.iterdir() if p.name.endswith(".tmp"))
        assert not leftovers, leftovers
    assert not failures, f"{len(failures)} of {trials} trials failed; first: {failures[0]}"


def test_eight_processes_create_one_store_at_once(tmp_path: Path) -> None:
    _check(tmp_path, trials=10)


@pytest.mark.slow
def test_eight_processes_create_one_store_at_once_fifty_trials(tmp_path: Path) -> None:
    _check(tmp_path, trials=50)


def test_discard_if_empty_removes_only_a_store_this_object_created(tmp_path: Path) -> None:
    new = Store(tmp_path / "new")
    assert new.created and new.discard_if_empty()
    assert not (tmp_path / "new").exists()

    used = Store(tmp_path / "used")
    used.log(Node("p.g.r", "n0", 0), {"loss": 1.0})
    assert not used.discard_if_empty()  # it holds a node
    reopened = Store(tmp_path / "used")
    assert not reopened.created and not reopened.discard_if_empty()  # not created here
    with Store(tmp_path / "used", create=False) as store:
        assert store.values(Node("p.g.r", "n0", 0)) == {"loss": 1.0}
