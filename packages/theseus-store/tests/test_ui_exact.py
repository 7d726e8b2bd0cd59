"""The browser's memory stays exact when values are written onto nodes it has already read.

A backfill (an evaluation over old checkpoints, ``store.log``/``put`` on an old node)
writes onto nodes in the middle of a lineage or of an ancestor lineage. Every write
marks its node (``nodes.written``), and the ``nodes_written`` index lets the read-only
browser find those nodes on its next request. References: a fresh read (a new read-only
``Store``, so no memory at all) and a NumPy curve kept by the test from what it wrote.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the ui extra is not installed (theseus-store[ui])")

import numpy as np

from theseus.store import Node, Store
from theseus.store.ui import _data, _memory

FORMAT2 = Path(__file__).parent / "data" / "format2-root" / "store"
KEYS = ("val/loss", "eval/acc", "note")


def _indexes(db: Path) -> set[str]:
    conn = sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    finally:
        conn.close()


def _drop_index(root: Path) -> None:
    conn = sqlite3.connect(root / "store.sqlite")
    conn.execute("DROP INDEX nodes_written")
    conn.commit()
    conn.close()


def test_a_writer_adds_the_written_index_to_a_store_made_before_it(tmp_path: Path) -> None:
    root = tmp_path / "store"
    shutil.copytree(FORMAT2, root)
    assert "nodes_written" not in _indexes(root / "store.sqlite")
    with Store(root, readonly=True) as store:  # a reader cannot add it, and reads all the same
        found, total = _data.lineages(store)
        assert total > 0 and all(item.nodes > 0 for item in found)
    assert "nodes_written" not in _indexes(root / "store.sqlite")
    with Store(root) as store:
        store.runs()
    assert "nodes_written" in _indexes(root / "store.sqlite")
    before = _indexes(root / "store.sqlite")
    with Store(root) as store:  # opening again changes nothing
        store.runs()
    assert _indexes(root / "store.sqlite") == before


def _fresh(root: Path, name: str, nonce: str, keys: tuple[str, ...]) -> tuple[object, object]:
    """A curve and the runs listing read with no memory (a new read-only Store)."""
    with Store(root, readonly=True) as store:
        return _read(store, name, nonce, keys)


def _read(store: Store, name: str, nonce: str, keys: tuple[str, ...]) -> tuple[object, object]:
    curves = [
        (
            _data.stitched_series(store, name, nonce, "val/loss"),
            _data.series(store, name, nonce, "val/loss", 64),
        )
    ]
    rows, total = _data.lineages(store, keys=keys, limit=100)
    listing = [(r.key, r.nodes, r.status, r.artifacts, r.last) for r in rows]
    return curves, (listing, total)


@pytest.mark.parametrize("indexed", [True, False])
def test_values_written_onto_older_nodes_show_at_the_next_request(
    tmp_path: Path, indexed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random writes onto old nodes of a branch and of its parent lineage, new nodes,
    statuses and artifacts between requests; every request equals a fresh read, and the
    curve equals the one the test keeps in NumPy. Without the index the memory is read
    again whole on each change (``REBUILD_S = 0``), the fallback's bound."""
    if not indexed:
        monkeypatch.setattr(_memory, "REBUILD_S", 0.0)
    rng = np.random.default_rng(7)
    root = tmp_path / "store"
    base = Node.new("train", project="p", group="g")
    point = 120
    a_values = {seq: float(v) for seq, v in enumerate(rng.normal(size=200))}
    b_values = {seq: float(v) for seq, v in enumerate(rng.normal(size=90))}
    with Store(root) as writer:
        a_nodes = [base]
        with writer.batch():
            for seq in range(200):
                writer.log(a_nodes[-1], {"val/loss": a_values[seq], "note": f"a{seq}"})
                a_nodes.append(a_nodes[-1].next())
        a_nodes.pop()
        b_nodes = [Node.new("tune", project="p", group="g", parent=a_nodes[point])]
        with writer.batch():
            for seq in range(90):
                writer.log(b_nodes[-1], {"val/loss": b_values[seq]})
                b_nodes.append(b_nodes[-1].next())
        b_nodes.pop()
        writer.log(b_nodes[-1], {"job/status": "running"})
        writer.log(a_nodes[-1], {"job/status": "finished"})
    if not indexed:
        _drop_index(root)
    reader = Store(root, readonly=True)
    assert ("nodes_written" in _indexes(root / "store.sqlite")) is indexed

    def reference() -> tuple[list[int], list[float]]:
        xs = [s for s in sorted(a_values) if s <= point] + [point + 1 + s for s in sorted(b_values)]
        ys = [a_values[s] for s in sorted(a_values) if s <= point] + [
            b_values[s] for s in sorted(b_values)
        ]
        keep = np.isfinite(np.array(ys, dtype=float))
        return [x for x, k in zip(xs, keep, strict=True) if k], [
            y for y, k in zip(ys, keep, strict=True) if k
        ]

    try:
        got = _read(reader, b_nodes[0].name, b_nodes[0].nonce, KEYS)
        assert got == _fresh(root, b_nodes[0].name, b_nodes[0].nonce, KEYS)
        for round_ in range(25):
            writer = Store(root, create=False)
            if not indexed:
                _drop_index(root)  # the writer added it on opening: keep the store without
            with writer:
                for _ in range(int(rng.integers(1, 6))):
                    what = rng.integers(0, 7)
                    on_a = bool(rng.integers(0, 2))
                    nodes, values = (a_nodes, a_values) if on_a else (b_nodes, b_values)
                    seq = int(rng.integers(0, len(nodes)))
                    node = Node(nodes[seq].name, nodes[seq].nonce, seq)
                    if what <= 2:  # a new or changed value on an old node
                        values[seq] = float(np.round(rng.normal() * 10, 1))
                        writer.log(node, {"val/loss": values[seq]})
                    elif what == 3:  # a value that is no point: the point goes
                        values[seq] = float("nan")
                        writer.log(node, {"val/loss": "n/a"})
                    elif what == 4:  # a key on an old node: the runs page's last value
                        writer.log(node, {"eval/acc": round_, "note": f"r{round_}"})
                    elif what == 5:
                        writer.log(node, {"job/status": str(rng.choice(["done", "failed"]))})
                    else:  # an artifact on an old node, or a new node at the end
                        if rng.integers(0, 2):
                            writer.put(node, "fig", "fig.txt", b"x")
                        else:
                            nodes.append(nodes[-1].next())
                            values[len(nodes) - 1] = float(rng.normal())
                            writer.log(nodes[-1], {"val/loss": values[len(nodes) - 1]})
            got = _read(reader, b_nodes[0].name, b_nodes[0].nonce, KEYS)
            fresh = _fresh(root, b_nodes[0].name, b_nodes[0].nonce, KEYS)
            assert got == fresh, f"round {round_}"
            xs, ys = reference()
            stitched = got[0][0][0]  # type: ignore[index]
            assert [p[0] for p in stitched] == xs
            assert [p[1] for p in stitched] == ys
    finally:
        reader.close()


def test_the_node_pages_job_is_the_stores_as_records_are_added(tmp_path: Path) -> None:
    """``_data.job`` (remembered branch points, jobs read from either side) against
    ``Store.job_of``/``job_config`` read afresh, for every node, as job records land on
    old nodes and a branch grows."""
    root = tmp_path / "store"
    a = [Node.new("a", project="p", group="g")]
    with Store(root) as writer:
        for _ in range(9):
            a.append(a[-1].next())
        for node in a:
            writer.touch(node)
        b = [Node.new("b", project="p", group="g", parent=a[3])]
        for _ in range(4):
            b.append(b[-1].next())
        for node in b:
            writer.touch(node)
    reader = Store(root, readonly=True)

    def check() -> None:
        with Store(root, readonly=True) as fresh:
            for node in [*a, *b]:
                want = fresh.job_of(node), fresh.job_config(node)
                got = _data.job(reader, node)
                assert (got if got is not None else (None, None)) == want, node

    try:
        check()
        for where, job in ((a[5], "late"), (a[0], "first"), (b[2], "own"), (a[2], "mid")):
            with Store(root, create=False) as writer:
                writer.record_job(where, job, f"config of {job}")
            check()
        with Store(root, create=False) as writer:
            b.append(b[-1].next())
            writer.touch(b[-1])
        check()
    finally:
        reader.close()
