"""Any number of processes may open (and so create) one fresh store at the same moment."""

from __future__ import annotations

import multiprocessing
import traceback
from pathlib import Path

import pytest

from theseus.store import Node, Store

PROCESSES = 8


def _open_and_write(root: str, index: int, barrier: object, errors: object) -> None:
    try:
        barrier.wait(timeout=60)  # type: ignore[attr-defined]
        with Store(root) as store:
            store.log(Node(f"p.g.host{index}", "n0", 0), {"index": index})
    except BaseException:
        errors.put(f"process {index}: {traceback.format_exc()}")  # type: ignore[attr-defined]


def _trial(root: Path) -> list[str]:
    context = multiprocessing.get_context("fork")
    barrier, errors = context.Barrier(PROCESSES), context.Queue()
    workers = [
        context.Process(target=_open_and_write, args=(str(root), i, barrier, errors))
        for i in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    found = []
    while not errors.empty():
        found.append(errors.get())
    found += [f"process {i} exited {w.exitcode}" for i, w in enumerate(workers) if w.exitcode]
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
