"""What the store browser shows, read from a read-only store: lineages, trees, series.

Every function takes an open :class:`~theseus.store.Store` and returns plain
data (dicts, lists, tuples) for the templates and the JSON endpoints. Nothing
here writes; the store itself is opened with ``readonly=True``. The runs listing
and the curves come from the per-store memory in :mod:`theseus.store.ui._memory`;
a curve is cut to a page's points by :mod:`theseus.store.ui._downsample`.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Sequence
from typing import Any

from theseus.store._node import Node
from theseus.store._records import decode_value
from theseus.store._store import Store
from theseus.store.ui._downsample import _kept, downsample
from theseus.store.ui._memory import (
    _NUMERIC,
    Lineage,
    _branch,
    _chain_starts,
    _curve,
    _last_value,
    _left,
    _memory,
    _refresh,
    _sync,
)

__all__ = [
    "Lineage",
    "artifact_frames",
    "artifact_names",
    "downsample",
    "lineage_family",
    "lineage_keys",
    "lineages",
    "series",
    "statuses",
    "stitched_series",
]


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
        The page's lineages (copies: the caller may keep them) and how many matched in all.
    """
    memory = _memory(store)

    def read(conn: sqlite3.Connection) -> tuple[list[Lineage], int]:
        with memory.lock:
            version = _refresh(conn, memory)
            needle = text.lower()
            found = [
                item
                for item in sorted(memory.lineages.values(), key=_newest_first)
                if (not needle or needle in item.key.lower())
                and (not status or item.status == status)
            ]
            # A key no node has is None everywhere: one index probe instead of a walk each.
            held = [
                k
                for k in keys
                if conn.execute("SELECT 1 FROM vals WHERE key = ? LIMIT 1", (k,)).fetchone()
            ]
            page = []
            for item in found[offset : offset + limit]:
                last = {k: None for k in keys}
                last.update({k: _last_value(conn, memory, version, item, k) for k in held})
                page.append(dataclasses.replace(item, last=last))
            return page, len(found)

    return store.read(read)


def _newest_first(item: Lineage) -> int:
    return -item.first_id


def statuses(store: Store) -> list[str]:
    """Every ``job/status`` value the store holds, sorted (the status filter's choices)."""
    memory = _memory(store)

    def read(conn: sqlite3.Connection) -> list[str]:
        with memory.lock:
            _refresh(conn, memory)
            return list(memory.statuses)

    return store.read(read)


def lineage_keys(store: Store) -> list[str]:
    """Every value key with a numeric value somewhere (the curve page's choices)."""
    memory = _memory(store)

    def read(conn: sqlite3.Connection) -> list[str]:
        with memory.lock:
            _refresh(conn, memory)
            if memory.numeric_keys is None:
                memory.numeric_keys = sorted(
                    str(r[0])
                    for r in conn.execute(
                        f"SELECT DISTINCT v.key FROM vals v WHERE {_NUMERIC}",
                    )
                )
            return list(memory.numeric_keys)

    return store.read(read)


def job(store: Store, node: Node) -> tuple[str, str] | None:
    """``(job, config)`` in effect at ``node``, as ``Store.job_config`` finds it, or None.

    The same walk (the closest record at or before the node, else the lineage it
    branched from), with the branch points remembered and the records of a long lineage
    found from the jobs table when it holds fewer rows than the walk has nodes.
    """
    memory = _memory(store)

    def read(conn: sqlite3.Connection) -> tuple[str, str] | None:
        with memory.lock:
            _sync(conn, memory)
            (jobs,) = conn.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()
            seen: set[tuple[str, str]] = set()
            current: Node | None = node
            while current is not None and (current.name, current.nonce) not in seen:
                seen.add((current.name, current.nonce))
                # CROSS JOIN keeps the jobs table outermost (SQLite never reorders it).
                join = "CROSS JOIN" if int(jobs) <= current.seq else "JOIN"
                row = conn.execute(
                    f"SELECT j.job, j.config FROM jobs j {join} nodes n ON n.id = j.node "
                    "WHERE n.name = ? AND n.nonce = ? AND n.seq <= ? "
                    "ORDER BY n.seq DESC, j.id DESC LIMIT 1",
                    (current.name, current.nonce, current.seq),
                ).fetchone()
                if row is not None:
                    return str(row[0]), str(row[1])
                up = _left(conn, memory, current.name, current.nonce)
                current = None if up is None or up[0] > current.seq else up[1]
            return None

    return store.read(read)


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
    return _chain_starts(conn, name, nonce)[0]


def series(store: Store, name: str, nonce: str, key: str, max_points: int = 2000) -> dict[str, Any]:
    """``key`` over the lineage's ancestry, cut to at most ``max_points`` (see :func:`downsample`).

    Returns:
        ``{"total": finite points in all, "x": [...], "y": [...], "node": [...]}``, x
        counting nodes from the root lineage's first (see :func:`stitched_series`).
    """
    memory = _memory(store)

    def read(conn: sqlite3.Connection) -> dict[str, Any]:
        with memory.lock:
            curve = _curve(conn, memory, name, nonce, key)
            kept = _kept(curve.ys, curve.mins, curve.maxs, max_points)
            return {
                "total": len(curve.ys),
                "x": [curve.xs[i] for i in kept],
                "y": [curve.ys[i] for i in kept],
                "node": [curve.node(i) for i in kept],
            }

    return store.read(read)


def stitched_series(store: Store, name: str, nonce: str, key: str) -> list[tuple[int, float, str]]:
    """``key`` over the lineage's ancestry: ``(x, value, node)``, x counting nodes from the root.

    A branch continues its parent's curve from the node it left: the parent's
    nodes up to the branch point, then the branch's own. Non-numeric and
    non-finite values are left out.
    """
    memory = _memory(store)

    def read(conn: sqlite3.Connection) -> list[tuple[int, float, str]]:
        with memory.lock:
            curve = _curve(conn, memory, name, nonce, key)
            return [(curve.xs[i], curve.ys[i], curve.node(i)) for i in range(len(curve.ys))]

    return store.read(read)


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
