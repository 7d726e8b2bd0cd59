"""Any number of processes may open (and so create) one fresh store at the same moment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from theseus.store import Node, Store

PROCESSES = 8

# A separate interpreter per opener (a fork of a process that has imported JAX is
# unsafe), the same eight for every trial. For each trial an opener says "ready" and
# blocks on that trial's pipe until the test closes its write end, which wakes every
# opener at once; then it opens the trial's fresh store, writes, and says how it went.
OPENER = textwrap.dedent(
    """
    import json, os, sys, traceback
    from theseus.store import Node, Store
    index, roots, gates = int(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
    for trial, (root, gate) in enumerate(zip(roots, gates, strict=True)):
        print("ready", trial, flush=True)
        if os.read(gate, 1):
            sys.exit("the gate gave bytes instead of closing")
        try:
            with Store(root) as store:
                store.log(Node(f"p.g.host{index}", "n0", 0), {"index": index})
            error = None
        except Exception:
            error = traceback.format_exc()[-2000:]
        print(json.dumps({"trial": trial, "error": error}), flush=True)
    """
)


def _line(opener: subprocess.Popen[str], i: int) -> str:
    """The next line `opener` prints; its stderr when it ended instead."""
    assert opener.stdout is not None
    line = opener.stdout.readline()
    if not line:
        opener.kill()
        _, err = opener.communicate(timeout=120)
        raise AssertionError(f"process {i} exited {opener.returncode}: {err[-2000:]}")
    return line


def _check(root: Path, trials: int) -> None:
    """`trials` times, PROCESSES processes at once create one fresh store (and its parent)."""
    wheres = [root / f"trial{trial}" / "store" for trial in range(trials)]
    gates = [os.pipe() for _ in range(trials)]
    closed: set[int] = set()
    openers: list[subprocess.Popen[str]] = []
    failures = []
    try:
        openers = [
            subprocess.Popen(
                [
                    *(sys.executable, "-c", OPENER, str(i)),
                    json.dumps([str(where) for where in wheres]),
                    json.dumps([read for read, _ in gates]),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                pass_fds=[read for read, _ in gates],
            )
            for i in range(PROCESSES)
        ]
        for trial, (where, (_, gate)) in enumerate(zip(wheres, gates, strict=True)):
            for i, opener in enumerate(openers):  # every opener is waiting at the gate
                assert _line(opener, i) == f"ready {trial}\n"
            os.close(gate)  # every opener goes at once
            closed.add(gate)
            said = [json.loads(_line(opener, i)) for i, opener in enumerate(openers)]
            assert [s["trial"] for s in said] == [trial] * PROCESSES, said
            errors = [f"process {i}: {s['error']}" for i, s in enumerate(said) if s["error"]]
            if errors:
                failures.append((trial, errors))
                continue
            with Store(where, create=False) as store:
                hosts = sorted(n.name for n in store.query().all())
                assert hosts == sorted(f"p.g.host{i}" for i in range(PROCESSES)), hosts
                assert store.fsck().clean
            leftovers = sorted(p.name for p in where.iterdir() if p.name.endswith(".tmp"))
            assert not leftovers, leftovers
        for i, opener in enumerate(openers):
            _, err = opener.communicate(timeout=120)
            assert opener.returncode == 0, f"process {i} exited {opener.returncode}: {err}"
    finally:
        for read, write in gates:
            os.close(read)
            if write not in closed:
                os.close(write)
        for opener in openers:
            if opener.poll() is None:
                opener.kill()
                opener.communicate()
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
