"""The browser's memory of what it read: curves and the runs listing stay right as the store grows.

References: a NumPy min/max per bucket computed from the values the test itself wrote
(NaN and infinities left out, a branch stitched by hand), and per-lineage counts and
last values kept by the test as it writes. The browser reads through a read-only store
while a writable one adds nodes, values, artifacts and statuses between requests.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette", reason="the ui extra is not installed (theseus-store[ui])")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")

import numpy as np
from starlette.testclient import TestClient

from theseus.store import Node, Store
from theseus.store.ui import create_app


def _reference(y: np.ndarray, cap: int) -> set[int]:
    """Indices kept: the ends, and each bucket's first argmin and argmax (NumPy)."""
    n = len(y)
    if n <= cap:
        return set(range(n))
    buckets = (cap - 2) // 2
    edges = 1 + (np.arange(buckets + 1) * (n - 2)) // buckets
    kept = {0, n - 1}
    for lo, hi in itertools.pairwise(edges):
        if hi > lo:
            kept |= {lo + int(np.argmin(y[lo:hi])), lo + int(np.argmax(y[lo:hi]))}
    return kept


def _values(rng: np.random.Generator, n: int) -> np.ndarray:
    y = np.cumsum(rng.normal(size=n))
    y[rng.integers(0, n, size=8)] += rng.choice([-40.0, 40.0], size=8)
    y[rng.integers(0, n, size=6)] = np.nan
    y[rng.integers(0, n, size=3)] = np.inf
    y[rng.integers(0, n, size=3)] = -np.inf
    y[rng.integers(0, n, size=50)] = np.round(y[rng.integers(0, n, size=50)], 0)  # ties
    return y


def _log(store: Store, node: Node, value: float) -> None:
    store.log(node, {"val/loss": float(value)} if not np.isnan(value) else {"val/loss": np.nan})


def _check(
    client: TestClient, lineage: str, xs: list[int], ys: list[float], nodes: list[str], cap: int
) -> None:
    got = client.get("/api/series?" + urlencode({"l": lineage, "key": "val/loss", "max": cap}))
    (series,) = got.json()["series"]
    y = np.array(ys)
    finite = np.isfinite(y)
    fx, fy = np.array(xs)[finite], y[finite]
    fnodes = [n for n, f in zip(nodes, finite, strict=True) if f]
    kept = sorted(_reference(fy, cap))
    assert series["total"] == len(fy)
    assert series["x"] == [int(fx[i]) for i in kept]
    assert series["y"] == [float(fy[i]) for i in kept]
    assert series["node"] == [fnodes[i] for i in kept]


@pytest.mark.parametrize("cap", [2000, 64])
def test_a_curve_matches_numpy_as_its_lineage_grows_and_branches(tmp_path: Path, cap: int) -> None:
    rng = np.random.default_rng(cap)
    root = tmp_path / "store"
    first = rng.integers(3000, 4000)
    values = _values(rng, 9000)
    base = Node.new("train", project="p", group="g")
    xs: list[int] = []
    ys: list[float] = []
    names: list[str] = []
    with Store(root) as writer:
        node = base
        with writer.batch():
            for i in range(first):
                if i:
                    node = node.next()
                if i % 7 != 3:  # some nodes without the key
                    _log(writer, node, values[i])
                    xs.append(node.seq)
                    ys.append(values[i])
                    names.append(node.serialize())
                else:
                    writer.log(node, {"other": 1.0})
        reader = Store(root, readonly=True)
        with TestClient(create_app(reader)) as client:
            lineage = f"{base.name}~{base.nonce}"
            _check(client, lineage, xs, ys, names, cap)
            # Grow: more values on the current node, then new nodes, between requests.
            writer.log(node, {"val/loss": 123.0})
            ys[-1] = 123.0
            _check(client, lineage, xs, ys, names, cap)
            _check(client, lineage, xs, ys, names, cap)  # unchanged store: from memory
            with writer.batch():
                for i in range(first, 6000):
                    node = node.next()
                    _log(writer, node, values[i])
                    xs.append(node.seq)
                    ys.append(values[i])
                    names.append(node.serialize())
            _check(client, lineage, xs, ys, names, cap)
            # A branch from seq 1000: its curve is the base's up to there, then its own.
            parent = Node(base.name, base.nonce, 1000)
            branch = Node.new("tune", project="p", group="g", parent=parent)
            cut = sum(1 for x in xs if x <= 1000)
            bx, by, bn = xs[:cut], ys[:cut], names[:cut]
            bnode = branch
            with writer.batch():
                for i in range(6000, 7500):
                    if i > 6000:
                        bnode = bnode.next()
                    _log(writer, bnode, values[i])
                    bx.append(1001 + bnode.seq)
                    by.append(values[i])
                    bn.append(bnode.serialize())
            _check(client, f"{branch.name}~{branch.nonce}", bx, by, bn, cap)
            with writer.batch():
                for i in range(7500, 9000):
                    bnode = bnode.next()
                    _log(writer, bnode, values[i])
                    bx.append(1001 + bnode.seq)
                    by.append(values[i])
                    bn.append(bnode.serialize())
            _check(client, f"{branch.name}~{branch.nonce}", bx, by, bn, cap)
            _check(client, lineage, xs, ys, names, cap)  # the base is as it was
        reader.close()


def test_the_runs_listing_follows_writes_between_requests(tmp_path: Path) -> None:
    root = tmp_path / "store"
    expected: dict[str, dict] = {}
    with Store(root) as writer:
        heads: dict[str, Node] = {}
        for i in range(30):
            node = Node.new(f"r{i:02d}", project="p", group=f"g{i % 3}")
            heads[node.run] = node
            writer.log(node, {"train/loss": float(i), "job/status": "running"})
            key = f"{node.name}~{node.nonce}"
            expected[key] = {
                "nodes": 1,
                "last_seq": 0,
                "artifacts": 0,
                "checkpoints": 0,
                "status": "running",
                "train/loss": float(i),
                "val/loss": None,
            }
        reader = Store(root, readonly=True)

        def listing() -> dict[str, dict]:
            data = client.get(
                "/api/runs?" + urlencode({"per_page": 1000, "keys": "train/loss,val/loss"})
            ).json()
            assert data["total"] == len(expected)
            return {r["lineage"]: r for r in data["rows"]}

        def compare() -> None:
            rows = listing()
            assert set(rows) == set(expected)  # (grouped by project and group)
            for key, want in expected.items():
                row = rows[key]
                for field in ("nodes", "last_seq", "artifacts", "checkpoints", "status"):
                    assert row[field] == want[field], (key, field)
                for k in ("train/loss", "val/loss"):
                    shown = "-" if want[k] is None else f"{want[k]:.6g}"
                    assert row["last"][k] == shown, (key, k)

        with TestClient(create_app(reader)) as client:
            compare()
            rng = np.random.default_rng(0)
            for step in range(40):
                run = f"r{int(rng.integers(0, 30)):02d}"
                node = heads[run]
                key = f"{node.name}~{node.nonce}"
                what = step % 5
                if what == 0:  # a new node with a value
                    node = heads[run] = node.next()
                    expected[key]["nodes"] += 1
                    expected[key]["last_seq"] = node.seq
                    writer.log(node, {"train/loss": float(step)})
                    expected[key]["train/loss"] = float(step)
                elif what == 1:  # a value on the current node
                    writer.log(node, {"val/loss": step / 10})
                    expected[key]["val/loss"] = step / 10
                elif what == 2:  # an artifact (again: a second version counts too)
                    writer.put(node, "a", "a.txt", b"x" * step)
                    expected[key]["artifacts"] += 1
                elif what == 3:
                    writer.log(node, {"job/status": "finished"})
                    expected[key]["status"] = "finished"
                else:  # a new node without the keys: the last values stay
                    node = heads[run] = node.next()
                    writer.log(node, {"other": 1})
                    expected[key]["nodes"] += 1
                    expected[key]["last_seq"] = node.seq
                compare()
            # A new lineage comes first.
            node = Node.new("new", project="p", group="g0")
            writer.log(node, {"val/loss": 0.5})
            expected[f"{node.name}~{node.nonce}"] = {
                "nodes": 1,
                "last_seq": 0,
                "artifacts": 0,
                "checkpoints": 0,
                "status": "-",
                "train/loss": None,
                "val/loss": 0.5,
            }
            compare()
            assert (
                client.get("/?" + urlencode({"q": "r0", "status": "finished"})).status_code == 200
            )
        reader.close()
