"""The model: values fold, artifacts version, checkpoints index, lineage edges, jobs."""

from __future__ import annotations

import gc
import hashlib
import math
import sqlite3
import sys
import warnings
from pathlib import Path

import pytest

from theseus.store import (
    CheckpointNotFoundError,
    InvalidNodeError,
    Node,
    Store,
    UnknownNodeError,
    ValueTypeError,
)


def test_values_fold_later_write_wins_and_types_survive(store: Store) -> None:
    node = Node.new("run")
    store.log(node, {"train/loss": 2.5, "flag": True, "note": "a", "none": None, "n": 3})
    store.log(node, {"train/loss": 2.0, "nan": math.nan, "big": 2**62})
    values = store.values(node)
    assert values["train/loss"] == 2.0  # later write wins
    assert values["note"] == "a" and values["n"] == 3 and values["big"] == 2**62
    assert values["flag"] is True and values["none"] is None
    assert math.isnan(values["nan"])  # type: ignore[arg-type]
    assert type(values["n"]) is int and type(values["flag"]) is bool
    assert sorted(values) == ["big", "flag", "n", "nan", "none", "note", "train/loss"]


@pytest.mark.parametrize("bad", [[1, 2], {"a": 1}, b"x", object(), 2**70])
def test_log_rejects_non_scalars_naming_key_and_type(store: Store, bad: object) -> None:
    node = Node.new("run")
    with pytest.raises(ValueTypeError, match="'train/x'") as info:
        store.log(node, {"ok": 1.0, "train/x": bad})  # type: ignore[dict-item]
    assert type(bad).__name__ in str(info.value) or "64 bits" in str(info.value)
    assert isinstance(info.value, TypeError)
    # Nothing of a rejected record is written, not even its valid keys.
    assert store.query().count() == 0


def test_artifacts_version_and_dedupe(store: Store) -> None:
    node = Node.new("run")
    first = store.put(node, "plot", "plot.pdf", b"v1")
    second = store.put(node, "plot", "plot.pdf", b"v2 longer")
    store.put(Node.new("other"), "same", "s.bin", b"v1")  # identical bytes: one blob
    current = store.get(node)
    assert list(current) == ["plot"]
    assert current["plot"].content == b"v2 longer" and current["plot"].version == 2
    assert current["plot"].hash == hashlib.sha256(b"v2 longer").hexdigest()
    assert current["plot"].node == node and current["plot"].filename == "plot.pdf"
    assert [a.content for a in store.history(node, "plot")] == [b"v1", b"v2 longer"]
    assert first.version == 1 and second.version == 2
    assert second.created >= first.created
    # Small artifacts live in the database's inline table, once per distinct content.
    inline = store.read(lambda conn: conn.execute("SELECT COUNT(*) FROM inline").fetchone()[0])
    assert inline == 2 and list(store.blobs.stored()) == []


def test_empty_and_large_artifacts_are_exact(store: Store) -> None:
    node = Node.new("run")
    payload = bytes(range(256)) * 8192 + b"tail"  # 2 MiB + 4 bytes
    store.put(node, "big", "big.bin", payload)
    store.put(node, "empty", "empty.bin", b"")
    got = store.get(node)
    assert got["big"].content == payload and got["big"].size == len(payload)
    assert got["empty"].content == b""
    # Above the inline limit the bytes go to the blob folder, named by their hash.
    assert store.blobs.path(got["big"].hash).read_bytes() == payload
    assert [d for d, _ in store.blobs.stored()] == [hashlib.sha256(payload).hexdigest()]
    edge = b"e" * store.inline_max
    store.put(node, "edge", "edge.bin", edge)
    store.put(node, "over", "over.bin", edge + b"!")
    assert (
        store.get(node)["edge"].content == edge and store.get(node)["over"].content == edge + b"!"
    )
    assert len(list(store.blobs.stored())) == 2


@pytest.mark.parametrize(
    ("name", "filename", "content", "fragment"),
    [
        ("", "f.txt", b"x", "name"),
        ("a", "dir/f.txt", b"x", "bare file name"),
        ("a", "f.txt", "text", "content must be bytes"),
    ],
)
def test_put_rejects_bad_input(
    store: Store, name: str, filename: str, content: object, fragment: str
) -> None:
    with pytest.raises(ValueTypeError, match=fragment):
        store.put(Node.new("run"), name, filename, content)  # type: ignore[arg-type]


def test_checkpoint_index(store: Store, tmp_path: Path) -> None:
    node = Node.new("run").next()
    inside = store.root / "ckpt" / "1"
    inside.mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    a = store.checkpoint(node, inside, {"loss": 1.5, "rng": [1, 2]})
    b = store.checkpoint(node, outside, step=7)
    entries = store.checkpoints(node)
    assert [e.path for e in entries] == [str(inside), str(outside)]
    assert entries[0].step == 1 and entries[1].step == 7  # default step is node.seq
    assert entries[0].meta == {"loss": 1.5, "rng": [1, 2]} and a.meta == entries[0].meta
    assert b.created >= a.created
    with pytest.raises(CheckpointNotFoundError, match="missing-dir"):
        store.checkpoint(node, tmp_path / "missing-dir")
    with pytest.raises(ValueTypeError, match="JSON"):
        store.checkpoint(node, inside, {"x": object()})


def test_lineage_edges(store: Store) -> None:
    a0 = Node.new("train")
    a1 = a0.next()
    a2 = a1.next()
    store.touch(a2)  # records a2, its parent a1 and the edge; a0 only through a1's parent
    store.touch(a1.next().next())
    branch = Node.new("finetune", parent=a1)
    store.log(branch, {"x": 1})
    assert store.parents(a2) == [a1]
    assert store.parents(branch) == [a1]
    assert store.children(a1) == [a2, branch]
    assert store.ancestors(branch) == [a1, a0]
    assert store.ancestors(a2.next()) == [a2, a1, a0]
    assert store.parents(a0) == []


def _seqs(nodes: list[Node]) -> list[int]:
    return [n.seq for n in nodes]


def test_a_node_recorded_between_two_takes_its_place_by_reparent(store: Store) -> None:
    base = Node.new("base")
    head = Node.new("suite", parent=base)  # the lineage's first node is a branch of base
    name, nonce = head.name, head.nonce
    n1000, n2000 = Node(name, nonce, 1000, parent=head), Node(name, nonce, 2000)
    store.touch(n1000)
    store.touch(Node(name, nonce, 2000, parent=n1000))
    store.log(n2000, {"x": 1.5})
    n1500 = Node(name, nonce, 1500, parent=n1000)
    store.touch(n1500)  # the fork a later import made: 1000 -> 1500 and 1000 -> 2000
    assert _seqs(store.parents(n2000)) == [1000]
    assert sorted(_seqs(store.children(n1000))) == [1500, 2000]
    assert store.reparent(n2000, n1500) is True
    assert _seqs(store.parents(n2000)) == [1500] and _seqs(store.children(n1000)) == [1500]
    assert _seqs(store.ancestors(n2000)) == [1500, 1000, 0, 0]  # ..., head, base
    assert store.ancestors(n2000)[-1].name == base.name
    assert store.values(n2000) == {"x": 1.5}
    assert store.reparent(n2000, n1500) is False  # idempotent
    # a node written later without a parent (seq 1) joins between the head and seq 1000
    n1 = Node(name, nonce, 1)
    store.touch(n1)
    assert store.reparent(n1000, n1) is True and store.reparent(n1, head) is True
    assert _seqs(store.ancestors(n2000)) == [1500, 1000, 1, 0, 0]
    assert store.reparent(head, None) is False  # no edge within the lineage to remove
    assert [p.name for p in store.parents(head)] == [base.name]  # the branch's edge stays
    assert store.reparent(n1, None) is True  # n1 heads a line of its own now
    assert store.parents(n1) == [] and _seqs(store.ancestors(n2000)) == [1500, 1000, 1]


def test_reparent_refuses_other_lineages_later_parents_and_unknown_nodes(store: Store) -> None:
    a = Node.new("run")
    a2 = Node(a.name, a.nonce, 2, parent=Node(a.name, a.nonce, 1))
    store.touch(a2)
    other = Node.new("other")
    store.touch(other)
    with pytest.raises(InvalidNodeError, match="own lineage"):
        store.reparent(a2, other)
    with pytest.raises(InvalidNodeError, match="own lineage"):
        store.reparent(Node(a.name, a.nonce, 1), a2)  # a later node: a cycle
    with pytest.raises(InvalidNodeError, match="own lineage"):
        store.reparent(a2, a2)
    with pytest.raises(UnknownNodeError):
        store.reparent(a2, Node(a.name, a.nonce, 0))  # never recorded
    with pytest.raises(UnknownNodeError):
        store.reparent(Node(a.name, a.nonce, 7), Node(a.name, a.nonce, 1))
    assert _seqs(store.parents(a2)) == [1]  # nothing changed


def test_unknown_node_is_an_error_listing_lineages(store: Store) -> None:
    node = Node.new("run")
    store.touch(node.next())
    with pytest.raises(UnknownNodeError, match=r"seq 0\.\.1") as info:
        store.get(Node(node.name, node.nonce, 5))
    assert isinstance(info.value, KeyError)
    assert node.serialize().split("~")[0] in str(info.value)


def test_job_bookkeeping_follows_lineage_and_branch(store: Store) -> None:
    a0 = Node.new("train")
    a3 = a0.next().next().next()
    store.touch(a0)
    assert store.job_of(a0) is None and store.job_config(a0) is None
    store.record_job(a0, "gpt/train/pretrain", "lr: 1\n")
    store.record_job(Node(a0.name, a0.nonce, 2), "gpt/train/pretrain", "lr: 2\n")
    assert store.job_config(Node(a0.name, a0.nonce, 1)) == "lr: 1\n"
    assert store.job_config(a3) == "lr: 2\n"  # closest record at or before seq 3
    branch = Node.new("inspect", parent=Node(a0.name, a0.nonce, 1)).next()
    store.touch(branch)
    assert store.job_of(branch) == "gpt/train/pretrain"  # through the branch edge
    assert store.job_config(branch) == "lr: 1\n"
    store.record_job(branch, "analysis/act", "target: x\n")
    assert store.job_of(branch.next()) == "analysis/act"
    assert store.job_of(Node(branch.name, branch.nonce, 0)) == "gpt/train/pretrain"
    assert store.job_of(Node.new("never")) is None
    with pytest.raises(ValueTypeError):
        store.record_job(a0, "", "x")


def test_batch_commits_together_or_not_at_all(store: Store) -> None:
    node = Node.new("run")
    with store.batch():
        store.log(node, {"a": 1})
        store.put(node, "x", "x.txt", b"x")
        with store.batch():  # nested: joins the outer transaction
            store.log(node.next(), {"a": 2})
        assert store.values(node) == {"a": 1}  # the batch reads its own writes
    assert store.query().count() == 2
    with pytest.raises(ZeroDivisionError), store.batch():
        store.log(node, {"a": 99})
        store.log(Node.new("lost"), {"b": 1})
        _ = 1 / 0
    assert store.values(node) == {"a": 1}  # rolled back as a whole
    assert store.query().spec(run="lost").count() == 0


def test_lineage_cycles_are_refused(store: Store) -> None:
    a0 = Node.new("run")
    store.touch(a0.next())
    a2 = a0.next().next()
    store.touch(a2)
    with pytest.raises(InvalidNodeError, match="cycle"):
        store.touch(Node(a0.name, a0.nonce, 0, parent=a2))  # a0's parent would be its grandchild
    with pytest.raises(InvalidNodeError, match="cycle"):
        store.touch(Node(a2.name, a2.nonce, 2, parent=a2))
    assert store.parents(a0) == [] and store.ancestors(a2) == [a2.parent, a0]


def test_store_is_thread_safe(store: Store) -> None:
    import threading

    def work(k: int) -> None:
        node = Node.new(f"t{k}")
        for i in range(20):
            store.log(node, {"i": i})
            store.put(node, "x", "x.bin", f"{k}-{i}".encode())
            node = node.next()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.query().has("i").count() == 80
    rows = store.query().artifact("x").select(keys=["node", "content"])
    assert sorted(r["content"] for r in rows) == sorted(
        f"{k}-{i}".encode() for k in range(4) for i in range(20)
    )


# When the whole suite runs, JAX is already imported and warns at every fork; the store
# itself holds no threads across a fork, which is what this test checks.
@pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")
def test_forked_child_opens_its_own_connection(store: Store) -> None:
    import multiprocessing

    parent_node = Node.new("parent")
    store.log(parent_node, {"who": "parent"})

    def child() -> None:
        store.log(Node.new("child"), {"who": "child"})  # the inherited Store reconnects
        store.close()

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(timeout=60)
    assert process.exitcode == 0
    assert sorted(v["who"] for v in store.query().has("who").select()) == ["child", "parent"]
    assert store.fsck().clean


def test_a_store_used_after_close_closes_its_new_connection_when_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A job or trainer keeps its Store after a `with` block closed it, and its next read
    # opens the database again: that connection must close when the Store goes away
    # (Python 3.13 warns "unclosed database" when a connection is collected open).
    store = Store(tmp_path / "store")
    store.log(Node.new("run"), {"x": 1})
    store.close()
    assert store.query().has("x").count() == 1  # reopened on use
    reopened = store.read(lambda conn: conn)
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        del store
        gc.collect()
    assert unraisable == []
    with pytest.raises(sqlite3.ProgrammingError, match="closed database"):
        reopened.execute("SELECT 1")
    again = Store(tmp_path / "store")
    again.close()
    second = again.read(lambda conn: conn)  # reopened on use, closed by the next close()
    again.close()
    again.close()  # idempotent
    with pytest.raises(sqlite3.ProgrammingError, match="closed database"):
        second.execute("SELECT 1")


def test_zero_dimensional_array_scalars_are_accepted(store: Store) -> None:
    np = pytest.importorskip("numpy")
    node = Node.new("run")
    store.log(
        node,
        {"f32": np.float32(0.5), "i64": np.int64(7), "b": np.bool_(True), "zero_d": np.array(2.25)},
    )
    values = store.values(node)
    assert values == {"f32": 0.5, "i64": 7, "b": True, "zero_d": 2.25}
    assert type(values["i64"]) is int and type(values["b"]) is bool
    with pytest.raises(ValueTypeError, match=r"'vec'.*numpy\.ndarray"):
        store.log(node, {"vec": np.zeros(3)})
