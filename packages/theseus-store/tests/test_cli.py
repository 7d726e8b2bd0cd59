"""The command line, in-process through main() and once as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from theseus.store import Node, Store, UnknownNodeError
from theseus.store.cli import main


@pytest.fixture
def filled(store: Store) -> tuple[Store, Node, Node]:
    """A store with one lineage of three nodes and a branch."""
    node = Node.new("train-gpt", project="lm", group="base")
    store.record_job(node, "gpt/train/pretrain", "lr: 0.1\n")
    store.log(node, {"train/loss": 2.5, "done": False})
    mid = node.next()
    store.put(mid, "activations", "activations.pdf", b"%PDF v1")
    store.put(mid, "activations", "activations.pdf", b"%PDF v2 \x00\xff")
    ckpt = store.root / "ckpt" / "1"
    ckpt.mkdir(parents=True)
    store.checkpoint(mid, ckpt)
    store.touch(mid.next())
    branch = Node.new("inspect", project="lm", group="base", parent=mid)
    store.touch(branch)
    return store, mid, branch


def test_runs_table(filled: tuple[Store, Node, Node], capsys: pytest.CaptureFixture[str]) -> None:
    store, mid, branch = filled
    assert main(["runs", str(store.root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "lineage",
        "nodes",
        "last",
        "seq",
        "checkpoints",
        "artifacts",
        "last",
        "write",
    ]
    first = lines[1].split()
    assert first[:5] == [f"{mid.name}~{mid.nonce}", "3", "2", "1", "2"]
    assert lines[2].split()[:5] == [f"{branch.name}~{branch.nonce}", "1", "0", "0", "0"]


def test_show(filled: tuple[Store, Node, Node], capsys: pytest.CaptureFixture[str]) -> None:
    store, mid, _ = filled
    assert main(["show", str(store.root), mid.parent.serialize()]) == 0  # type: ignore[union-attr]
    out = capsys.readouterr().out
    assert "train/loss = 2.5" in out and "done = False" in out
    assert "job  gpt/train/pretrain" in out
    assert main(["show", str(store.root), mid.serialize()]) == 0
    out = capsys.readouterr().out
    assert "checkpoints (1)" in out and str(store.root / "ckpt" / "1") in out
    row = next(line for line in out.splitlines() if line.strip().startswith("activations "))
    assert row.split()[:4] == ["activations", "activations.pdf", "10", "2"]


def test_get_stdout_and_file(
    filled: tuple[Store, Node, Node], capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path
) -> None:
    store, mid, _ = filled
    assert main(["get", str(store.root), mid.serialize(), "activations"]) == 0
    assert capsysbinary.readouterr().out == b"%PDF v2 \x00\xff"
    assert main(["get", str(store.root), mid.serialize(), "activations", "-o", "-"]) == 0
    assert capsysbinary.readouterr().out == b"%PDF v2 \x00\xff"  # `-o -`: standard output
    target = tmp_path / "out.pdf"
    assert main(["get", str(store.root), mid.serialize(), "activations", "-o", str(target)]) == 0
    assert target.read_bytes() == b"%PDF v2 \x00\xff"


def test_get_refuses_binary_to_a_terminal(
    filled: tuple[Store, Node, Node],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, mid, _ = filled
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["get", str(store.root), mid.serialize(), "activations"]) == 2
    err = capsys.readouterr().err
    assert "(activations.pdf, 10 bytes) is binary and would garble the terminal" in err
    assert "Save it with -o activations.pdf (or redirect: > activations.pdf)" in err
    store.put(mid, "notes", "notes.txt", b"plain text\n")
    assert main(["get", str(store.root), mid.serialize(), "notes"]) == 0  # text is shown
    assert capsys.readouterr().out == "plain text\n"


def test_lineage_and_short_node(
    filled: tuple[Store, Node, Node], capsys: pytest.CaptureFixture[str]
) -> None:
    store, mid, branch = filled
    assert main(["lineage", str(store.root), f"{branch.name}~{branch.nonce}"]) == 0
    out = capsys.readouterr().out
    assert f"node      {branch.serialize()}" in out
    # the branch's own lineage starts at seq 0: its ancestors are one stretch of the parent
    assert f"  branched from {mid.serialize()}..0  (2 nodes; checkpoints at seq 1)" in out
    assert "job       gpt/train/pretrain" in out  # inherited through the branch edge
    assert main(["lineage", str(store.root), mid.serialize()]) == 0
    out = capsys.readouterr().out
    assert "children  (2)" in out and branch.serialize() in out


def test_a_run_name_alone_is_its_one_lineages_last_node(
    filled: tuple[Store, Node, Node], capsys: pytest.CaptureFixture[str]
) -> None:
    store, mid, branch = filled
    last = mid.next()
    for spelled in ("train-gpt", "lm.base.train-gpt"):
        assert store.resolve(spelled) == last
        assert main(["show", str(store.root), spelled]) == 0
        assert f"node {last.serialize()}\n" in capsys.readouterr().out
    assert store.resolve("inspect") == branch
    other = Node.new("train-gpt", project="lm", group="base")
    store.touch(other)
    assert main(["lineage", str(store.root), "train-gpt"]) == 2
    err = capsys.readouterr().err
    assert "Run 'train-gpt' has 2 lineages: " in err and "\n" not in err.strip()
    assert f"lm.base.train-gpt~{mid.nonce} (3 nodes, 1 checkpoint)" in err
    assert f"lm.base.train-gpt~{other.nonce} (1 node, 0 checkpoints)" in err
    # the run's name alone stands for its full name beside a nonce
    assert store.resolve(f"train-gpt~{other.nonce}") == other
    assert store.resolve(f"train-gpt~{mid.nonce}~1") == mid
    with pytest.raises(UnknownNodeError, match="no lineage inspect~"):
        store.resolve(f"inspect~{mid.nonce}")  # the nonce is another run's
    # a lineage that failed while setting up does not make the run ambiguous
    store.log(other, {"job/status": "failed", "job/failed_in": "setup", "job/error": "E: x"})
    assert store.resolve("train-gpt") == last
    assert main(["show", str(store.root), "train-gtp"]) == 2
    err = capsys.readouterr().err
    assert "no run named 'train-gtp' (its runs: lm.base.inspect, lm.base.train-gpt)" in err


def test_errors_exit_2_with_message(
    filled: tuple[Store, Node, Node], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    store, mid, _ = filled
    assert main(["get", str(store.root), mid.serialize(), "nope"]) == 2
    assert "has no artifact 'nope' (it has: activations)" in capsys.readouterr().err
    assert main(["show", str(store.root), "not-a-node"]) == 2
    assert "project.group.run~nonce~seq" in capsys.readouterr().err
    empty = tmp_path / "empty"
    assert main(["runs", str(empty)]) == 2
    err = capsys.readouterr().err
    assert f"{empty} does not exist. Pass a Theseus root folder, its store folder" in err
    assert "create=True" not in err  # a command-line error speaks of the command line
    assert not empty.exists()  # the command line never creates a store
    afile = tmp_path / "config.yaml"
    afile.write_text("job: x\n")
    assert main(["show", str(afile), mid.serialize()]) == 2
    assert f"{afile} is a file, not a store folder or a Theseus root" in capsys.readouterr().err
    empty.mkdir()
    assert main(["runs", str(empty)]) == 2
    err = capsys.readouterr().err
    assert f"{empty} holds no store (no theseus-store.json in it or in {empty / 'store'})" in err
    assert "this command does not create a store" in err and "create=True" not in err
    assert sorted(empty.iterdir()) == []  # nothing was made in it


def test_fsck_reports_and_repairs(
    filled: tuple[Store, Node, Node], capsys: pytest.CaptureFixture[str]
) -> None:
    store, _, _ = filled
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = store.blobs.temp_path(gone.pid)  # a temporary file whose writer has exited
    orphan.write_bytes(b"partial")
    live = store.blobs.temp_path(os.getpid())  # one whose writer is alive: left alone
    live.write_bytes(b"being written")
    assert main(["fsck", str(store.root)]) == 0
    out = capsys.readouterr().out
    assert f"orphan temporary file (interrupted write, safe to remove): {orphan}" in out
    assert f"in progress (a live writer's temporary file): {live}" in out
    assert out.splitlines()[-1] == "clean" and orphan.exists()
    assert main(["fsck", str(store.root), "--repair"]) == 0
    assert f"removed: {orphan}" in capsys.readouterr().out
    assert not orphan.exists() and live.exists()
    big = store.put(Node.new("large"), "weights", "w.bin", bytes(100_000))
    blob = store.blobs.path(big.hash)
    os.chmod(blob, 0o644)
    blob.write_bytes(b"tampered")
    assert main(["fsck", str(store.root)]) == 1
    out = capsys.readouterr().out
    assert f"PROBLEM The blob file {blob} is corrupt" in out and "NOT CLEAN: 1 problem(s)" in out


def test_console_script_in_a_subprocess(filled: tuple[Store, Node, Node]) -> None:
    store, mid, _ = filled
    script = Path(sys.executable).with_name("theseus-store")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "theseus.store.cli"]
    done = subprocess.run(
        [*command, "get", str(store.root), mid.serialize(), "activations"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"%PDF v2 \x00\xff"


def test_long_lineages_are_cut_unless_asked(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    node = Node.new("long")
    store.touch(node)
    for _ in range(30):
        node = node.next()
        store.touch(node)
    (store.root / "c").mkdir()
    store.checkpoint(Node(node.name, node.nonce, 9), store.root / "c", step=10)
    side = Node.new("side", parent=Node(node.name, node.nonce, 4))
    store.touch(side)
    for _ in range(3):
        side = side.next()
        store.touch(side)
    # a straight chain is one line; a branch point starts the next
    assert main(["lineage", str(store.root), side.serialize()]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:5] == [
        "ancestors (8, nearest first)",
        f"  general.default.side~{side.nonce}~2..0  (3 nodes; no checkpoint)",
        f"  branched from general.default.long~{node.nonce}~4..0  (5 nodes; no checkpoint)",
    ]
    assert main(["lineage", str(store.root), node.serialize(), "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert "ancestors (30, nearest first)" in out
    assert f"  general.default.long~{node.nonce}~29..0  (30 nodes; checkpoints at seq 9)" in out
    assert main(["lineage", str(store.root), side.serialize(), "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "  ... 1 more stretch(es), 5 nodes (--all lists every ancestor)" in out
    assert main(["lineage", str(store.root), node.serialize(), "--all"]) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("  general.default.long~") for line in out.splitlines()) == 30


def test_a_theseus_root_reads_as_its_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(tmp_path / "store") as store:
        store.touch(Node.new("r"))
    (tmp_path / "data").mkdir()
    assert main(["runs", str(tmp_path)]) == 0
    by_root = capsys.readouterr().out
    assert main(["runs", str(tmp_path / "store")]) == 0
    assert capsys.readouterr().out == by_root and "general.default.r~" in by_root


def test_a_run_asked_of_a_store_without_runs_says_so_and_asks_for_the_root(
    tmp_path: Path,
) -> None:
    """A store just made under a ROOT that another spelling of the runs' root names (a
    typo, a relative path from elsewhere) holds no runs: the error says that, not that
    the run is missing among none."""
    with Store(tmp_path / "store") as store, pytest.raises(UnknownNodeError) as empty:
        store.resolve("demo")
    message = str(empty.value)
    assert message == (
        f"The store at {tmp_path / 'store'} holds no runs yet, so none named 'demo'. Pass "
        "the ROOT your runs wrote into (the folder that holds store/), or train one there "
        "first."
    )
