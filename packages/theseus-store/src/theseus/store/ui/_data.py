"""What the store browser shows, read from a read-only store: lineages, trees, series.

Every function takes an open :class:`~theseus.store.Store` and returns plain
data (dicts, lists, tuples) for the templates and the JSON endpoints. Nothing
here writes; the store itself is opened with ``readonly=True``.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from theseus.store._node import Node
from theseus.store._records import decode_value
from theseus.store._store import Store

__all__ = [
    "Lineage",
    "artifact_frames",
    "artifact_names",
    "downsample",
    "lineage_family",
    "lineage_keys",
    "lineages",
    "statuses",
    "stitched_series",
]


@dataclass
class Lineage:
    """One lineage: its nodes' range and what a row of the runs page shows."""

    name: str
    nonce: str
    nodes: int
    last_seq: int
    started: float
    last_write: float
    checkpoints: int
    artifacts: int
    status: str = "-"
    last: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """``name~nonce``, the lineage's written form."""
        return f"{self.name}~{self.nonce}"

    @property
    def last_node(self) -> str:
        """The last node, serialized."""
        return Node(self.name, self.nonce, self.last_seq).serialize()


def _last_value(conn: sqlite3.Connection, name: str, nonce: str, key: str) -> Any:
    row = conn.execute(
        "SELECT v.value, v.kind FROM vals v JOIN nodes n ON n.id = v.node "
        "WHERE n.name = ? AND n.nonce = ? AND v.key = ? ORDER BY n.seq DESC LIMIT 1",
        (name, nonce, key),
    ).fetchone()
    return None if row is None else decode_value(row[0], row[1])


def lineages(
    store: Store,
    *,
    text: str = "",
    status: str = "",
    keys: Sequence[str] = (),
    offset: int = 0,
    limit: int = 50,
) -> tuple[list[Lineage], int]:
    """One page of lineages, newest first, filtered on the server.

    Args:
        text: keep lineages whose ``name~nonce`` contains it (case-insensitive).
        status: keep lineages whose last ``job/status`` is it (``-``: none recorded).
        keys: value keys whose last value along the lineage each row carries.
        offset, limit: the page.

    Returns:
        The page's lineages and how many matched in all.
    """

    def read(conn: sqlite3.Connection) -> tuple[list[Lineage], int]:
        rows = conn.execute(
            "SELECT name, nonce, COUNT(*), MAX(seq), MIN(created), MAX(written) "
            "FROM nodes GROUP BY name, nonce ORDER BY MIN(id) DESC"
        ).fetchall()
        counts = {}
        for table in ("checkpoints", "artifacts"):
            counts[table] = {
                (name, nonce): int(count)
                for name, nonce, count in conn.execute(
                    f"SELECT n.name, n.nonce, COUNT(*) FROM {table} t "
                    "JOIN nodes n ON n.id = t.node GROUP BY n.name, n.nonce"
                )
            }
        # The last job/status of each lineage: SQLite takes the value from the MAX(seq) row.
        states = {
            (name, nonce): decode_value(value, kind)
            for name, nonce, value, kind, _ in conn.execute(
                "SELECT n.name, n.nonce, v.value, v.kind, MAX(n.seq) FROM vals v "
                "JOIN nodes n ON n.id = v.node WHERE v.key = 'job/status' GROUP BY n.name, n.nonce"
            )
        }
        found = []
        needle = text.lower()
        for name, nonce, nodes, last_seq, started, last_write in rows:
            lineage = (name, nonce)
            item = Lineage(
                name,
                nonce,
                nodes=int(nodes),
                last_seq=int(last_seq),
                started=float(started),
                last_write=float(last_write),
                checkpoints=counts["checkpoints"].get(lineage, 0),
                artifacts=counts["artifacts"].get(lineage, 0),
            )
            if needle and needle not in item.key.lower():
                continue
            state = states.get(lineage)
            item.status = "-" if state is None else str(state)
            if status and item.status != status:
                continue
            found.append(item)
        page = found[offset : offset + limit]
        # A key no node has is None everywhere: one index probe instead of a walk per lineage.
        held = [
            k
            for k in keys
            if conn.execute("SELECT 1 FROM vals WHERE key = ? LIMIT 1", (k,)).fetchone()
        ]
        for item in page:
            item.last = {k: None for k in keys}
            item.last.update({k: _last_value(conn, item.name, item.nonce, k) for k in held})
        return page, len(found)

    return store.read(read)


def statuses(store: Store) -> list[str]:
    """Every ``job/status`` value the store holds, sorted (the status filter's choices)."""
    rows = store.read_one("SELECT DISTINCT value FROM vals WHERE key = 'job/status'", ())
    return sorted(str(r[0]) for r in rows)


def lineage_keys(store: Store) -> list[str]:
    """Every value key with a numeric value somewhere (the curve page's choices)."""
    rows = store.read_one(
        "SELECT DISTINCT key FROM vals WHERE kind = 'v' AND typeof(value) IN ('integer', 'real')",
        (),
    )
    return sorted(str(r[0]) for r in rows)


def _branch(conn: sqlite3.Connection, name: str, nonce: str) -> tuple[int, Node] | None:
    """``(seq, parent)`` where the lineage left another one, or None for a fresh lineage."""
    row = conn.execute(
        "SELECT n.seq, p.name, p.nonce, p.seq FROM nodes n JOIN edges e ON e.child = n.id "
        "JOIN nodes p ON p.id = e.parent WHERE n.name = ? AND n.nonce = ? "
        "AND NOT (p.name = n.name AND p.nonce = n.nonce) ORDER BY n.seq LIMIT 1",
        (name, nonce),
    ).fetchone()
    return None if row is None else (int(row[0]), Node(row[1], row[2], int(row[3])))


def lineage_family(store: Store, name: str, nonce: str) -> dict[str, Any]:
    """The tree of lineages that holds ``name~nonce``: its root lineage and every branch.

    Returns:
        ``{"root": tree, "focus": "name~nonce"}``; each tree is
        ``{"key", "name", "nonce", "kind" (fresh/branch), "from" (the parent node a
        branch left, serialized, or None), "seqs", "checkpoints" (seqs),
        "resumes" (seqs where a job started again), "children": [trees]}``.
    """

    def read(conn: sqlite3.Connection) -> dict[str, Any]:
        top = (name, nonce)
        seen = {top}
        while (up := _branch(conn, *top)) is not None and (up[1].name, up[1].nonce) not in seen:
            top = (up[1].name, up[1].nonce)
            seen.add(top)
        return {"root": _tree(conn, *top, seen=set()), "focus": f"{name}~{nonce}"}

    return store.read(read)


def _tree(conn: sqlite3.Connection, name: str, nonce: str, seen: set[str]) -> dict[str, Any]:
    key = f"{name}~{nonce}"
    seen.add(key)
    seqs = [
        int(r[0])
        for r in conn.execute(
            "SELECT seq FROM nodes WHERE name = ? AND nonce = ? ORDER BY seq", (name, nonce)
        )
    ]
    saved = sorted(
        {
            int(r[0])
            for r in conn.execute(
                "SELECT n.seq FROM checkpoints c JOIN nodes n ON n.id = c.node "
                "WHERE n.name = ? AND n.nonce = ?",
                (name, nonce),
            )
        }
    )
    jobs = [
        int(r[0])
        for r in conn.execute(
            "SELECT DISTINCT n.seq FROM jobs j JOIN nodes n ON n.id = j.node "
            "WHERE n.name = ? AND n.nonce = ? ORDER BY n.seq",
            (name, nonce),
        )
    ]
    branch = _branch(conn, name, nonce)
    kids = conn.execute(
        "SELECT DISTINCT n.name, n.nonce, p.seq FROM nodes p JOIN edges e ON e.parent = p.id "
        "JOIN nodes n ON n.id = e.child WHERE p.name = ? AND p.nonce = ? "
        "AND NOT (n.name = p.name AND n.nonce = p.nonce) ORDER BY p.seq, n.id",
        (name, nonce),
    ).fetchall()
    children = [
        _tree(conn, kid_name, kid_nonce, seen)
        for kid_name, kid_nonce, _ in kids
        if f"{kid_name}~{kid_nonce}" not in seen
    ]
    points = sorted({int(k[2]) for k in kids})
    resumes = [s for s in jobs if s > (0 if branch is None else branch[0])]
    return {
        "key": key,
        "name": name,
        "nonce": nonce,
        "cells": _cells(seqs, saved, points, resumes),
        "kind": "fresh" if branch is None else "branch",
        "from": None if branch is None else branch[1].serialize(),
        "seqs": seqs,
        "checkpoints": saved,
        "branch_points": points,
        "resumes": resumes,
        "children": children,
    }


# A lineage longer than this shows its landmark nodes only (ends, checkpoints, branch
# points, resumes), with gaps between them, so a page of a long run stays small.
MAX_CELLS = 300


def _cells(seqs: list[int], *landmarks: list[int], limit: int = MAX_CELLS) -> list[int | None]:
    """The seqs a lineage's strip shows, ``None`` where nodes are left out."""
    if len(seqs) <= limit:
        return list(seqs)
    ends = set(seqs[:5]) | set(seqs[-5:])
    marked = sorted({s for group in landmarks for s in group})
    chosen = sorted(ends | set(marked[: limit - len(ends)]))
    cells: list[int | None] = []
    previous = None
    for seq in chosen:
        if previous is not None and seq != previous + 1:
            cells.append(None)
        cells.append(seq)
        previous = seq
    return cells


def _chain(conn: sqlite3.Connection, name: str, nonce: str) -> list[tuple[str, str, int]]:
    """The stretches a lineage stitches: ``(name, nonce, last seq taken)``, oldest first."""
    (last,) = conn.execute(
        "SELECT MAX(seq) FROM nodes WHERE name = ? AND nonce = ?", (name, nonce)
    ).fetchone()
    if last is None:
        return []
    chain = [(name, nonce, int(last))]
    seen = {(name, nonce)}
    while (up := _branch(conn, chain[-1][0], chain[-1][1])) is not None:
        parent = up[1]
        if (parent.name, parent.nonce) in seen:
            break
        seen.add((parent.name, parent.nonce))
        chain.append((parent.name, parent.nonce, parent.seq))
    return chain[::-1]


def stitched_series(store: Store, name: str, nonce: str, key: str) -> list[tuple[int, float, str]]:
    """``key`` over the lineage's ancestry: ``(x, value, node)``, x counting nodes from the root.

    A branch continues its parent's curve from the node it left: the parent's
    nodes up to the branch point, then the branch's own. Non-numeric and
    non-finite values are left out.
    """

    def read(conn: sqlite3.Connection) -> list[tuple[int, float, str]]:
        points: list[tuple[int, float, str]] = []
        offset = 0
        for part_name, part_nonce, upto in _chain(conn, name, nonce):
            rows = conn.execute(
                "SELECT n.seq, v.value FROM vals v JOIN nodes n ON n.id = v.node "
                "WHERE n.name = ? AND n.nonce = ? AND n.seq <= ? AND v.key = ? "
                "AND v.kind = 'v' AND typeof(v.value) IN ('integer', 'real') ORDER BY n.seq",
                (part_name, part_nonce, upto, key),
            ).fetchall()
            stem = f"{part_name}~{part_nonce}~"  # a recorded lineage: already a valid name
            points.extend(
                (offset + seq, float(value), f"{stem}{seq}")
                for seq, value in rows
                if math.isfinite(value)
            )
            offset += upto + 1
        return points

    return store.read(read)


def downsample(points: Sequence[tuple[Any, ...]], max_points: int = 2000) -> list[tuple[Any, ...]]:
    """At most ``max_points`` of ``points`` (sorted by x): first, last, each bucket's min and max.

    The points between the first and the last are cut into equal buckets;
    each bucket keeps its smallest and its largest value (in x order, once if
    they are one point), so every peak and dip survives the cut.
    """
    if max_points < 4:
        raise ValueError(
            f"max_points must be at least 4 (first, last, one bucket); got {max_points}."
        )
    n = len(points)
    if n <= max_points:
        return list(points)
    inner = n - 2
    buckets = (max_points - 2) // 2
    kept: list[tuple[Any, ...]] = [points[0]]
    for b in range(buckets):
        lo = 1 + (b * inner) // buckets
        hi = 1 + ((b + 1) * inner) // buckets
        if lo >= hi:
            continue
        chunk = range(lo, hi)
        low = min(chunk, key=lambda i: points[i][1])
        high = max(chunk, key=lambda i: points[i][1])
        kept.extend(points[i] for i in sorted({low, high}))
    kept.append(points[-1])
    return kept


def artifact_frames(store: Store, name: str, nonce: str, artifact: str) -> list[dict[str, Any]]:
    """Every node along the stitched lineage that holds ``artifact``, oldest first.

    Each frame: ``node`` (serialized), ``seq``, ``version`` (the current one),
    ``filename``, and the node's ``train/step`` and ``val/loss`` (None when absent).
    """

    def read(conn: sqlite3.Connection) -> list[dict[str, Any]]:
        frames = []
        for part_name, part_nonce, upto in _chain(conn, name, nonce):
            rows = conn.execute(
                "SELECT n.id, n.seq, a.filename, MAX(a.version) FROM artifacts a "
                "JOIN nodes n ON n.id = a.node WHERE n.name = ? AND n.nonce = ? "
                "AND n.seq <= ? AND a.name = ? GROUP BY n.id ORDER BY n.seq",
                (part_name, part_nonce, upto, artifact),
            ).fetchall()
            for nid, seq, filename, version in rows:
                values = {
                    k: decode_value(v, kind)
                    for k, v, kind in conn.execute(
                        "SELECT key, value, kind FROM vals WHERE node = ? "
                        "AND key IN ('train/step', 'val/loss')",
                        (nid,),
                    )
                }
                frames.append(
                    {
                        "node": Node(part_name, part_nonce, int(seq)).serialize(),
                        "seq": int(seq),
                        "version": int(version),
                        "filename": str(filename),
                        "step": values.get("train/step"),
                        "val_loss": values.get("val/loss"),
                    }
                )
        return frames

    return store.read(read)


def artifact_names(store: Store, name: str, nonce: str) -> list[str]:
    """The artifact names anywhere along the stitched lineage (the slider's choices)."""

    def read(conn: sqlite3.Connection) -> list[str]:
        found: set[str] = set()
        for part_name, part_nonce, upto in _chain(conn, name, nonce):
            found.update(
                str(r[0])
                for r in conn.execute(
                    "SELECT DISTINCT a.name FROM artifacts a JOIN nodes n ON n.id = a.node "
                    "WHERE n.name = ? AND n.nonce = ? AND n.seq <= ?",
                    (part_name, part_nonce, upto),
                )
            )
        return sorted(found)

    return store.read(read)
