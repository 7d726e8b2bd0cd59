"""What the store browser shows, read from a read-only store: lineages, trees, series.

Every function takes an open :class:`~theseus.store.Store` and returns plain
data (dicts, lists, tuples) for the templates and the JSON endpoints, read through
the store's public read methods (no SQL here). Nothing here writes; the store
itself is opened with ``readonly=True``. The runs listing and the curves come from
the per-store memory in :mod:`theseus.store.ui._memory`; a curve is cut to a page's
points by :mod:`theseus.store.ui._downsample`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from theseus.store._node import Node
from theseus.store._records import Artifact
from theseus.store._store import Store
from theseus.store.ui._downsample import _kept, downsample
from theseus.store.ui._imports import job_starts
from theseus.store.ui._memory import Lineage, memory_of
from theseus.store.ui._render import is_picture

__all__ = [
    "Lineage",
    "artifact_frames",
    "artifact_names",
    "artifact_version",
    "downsample",
    "feature_lineages",
    "lineage_family",
    "lineage_keys",
    "lineages",
    "picture_names",
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
    memory = memory_of(store)
    with memory.lock:
        version = memory.refresh(store)
        needle = text.lower()
        found = [
            item
            for item in sorted(memory.lineages.values(), key=_newest_first)
            if (not needle or needle in item.key.lower()) and (not status or item.status == status)
        ]
        # A key no node has is None everywhere: one index probe instead of a walk each.
        held = store.held_keys(keys) if keys else []
        page = []
        for item in found[offset : offset + limit]:
            last = {k: None for k in keys}
            last.update({k: memory.last_value(store, version, item, k) for k in held})
            page.append(dataclasses.replace(item, last=last))
        return page, len(found)


def _newest_first(item: Lineage) -> int:
    return -item.first_id


def statuses(store: Store) -> list[str]:
    """Every ``job/status`` value the store holds, sorted (the status filter's choices)."""
    memory = memory_of(store)
    with memory.lock:
        memory.refresh(store)
        return list(memory.statuses)


def lineage_keys(store: Store) -> list[str]:
    """Every value key with a numeric value somewhere (the curve page's choices)."""
    memory = memory_of(store)
    with memory.lock:
        memory.refresh(store)
        if memory.numeric_keys is None:
            memory.numeric_keys = store.numeric_keys()
        return list(memory.numeric_keys)


def job(store: Store, node: Node) -> tuple[str, str] | None:
    """``(job, config)`` in effect at ``node``, as ``Store.job_config`` finds it, or None.

    The same walk (the closest record at or before the node, else the lineage it
    branched from), with the branch points remembered.
    """
    memory = memory_of(store)
    with memory.lock:
        return memory.job(store, node)


def lineage_family(store: Store, name: str, nonce: str) -> dict[str, Any]:
    """The tree of lineages that holds ``name~nonce``: its root lineage and every branch.

    Returns:
        ``{"root": tree, "focus": "name~nonce"}``; each tree is
        ``{"key", "name", "nonce", "kind" (fresh/branch), "from" (the parent node a
        branch left, serialized, or None), "seqs", "checkpoints", "artifacts" (seqs of
        the nodes that hold one), "resumes" (seqs where a job started again),
        "revisions" (the steps of the imported revisions, whose job records are no
        resumes: :mod:`theseus.store.ui._imports`), "children": [trees]}``.
    """
    top = (name, nonce)
    seen = {top}
    while (up := store.branch_point(*top)) is not None and (up[1].name, up[1].nonce) not in seen:
        top = (up[1].name, up[1].nonce)
        seen.add(top)
    return {"root": _tree(store, *top, seen=set()), "focus": f"{name}~{nonce}"}


def _tree(store: Store, name: str, nonce: str, seen: set[str]) -> dict[str, Any]:
    key = f"{name}~{nonce}"
    seen.add(key)
    outline = store.lineage_outline(name, nonce)
    children = [
        _tree(store, kid_name, kid_nonce, seen)
        for kid_name, kid_nonce in outline["children"]
        if f"{kid_name}~{kid_nonce}" not in seen
    ]
    branch = outline["branch"]
    seqs, saved, held = outline["seqs"], outline["checkpoints"], outline["artifacts"]
    points = outline["branch_points"]
    resumes, revisions = job_starts(store, name, nonce, seqs, outline["jobs"])
    return {
        "key": key,
        "name": name,
        "nonce": nonce,
        "cells": _cells(seqs, saved, points, resumes, held),
        "kind": "fresh" if branch is None else "branch",
        "from": None if branch is None else branch[1].serialize(),
        "seqs": seqs,
        "checkpoints": saved,
        "artifacts": held,
        "branch_points": points,
        "resumes": resumes,
        "revisions": revisions,
        "children": children,
    }


# A lineage longer than this shows its landmark nodes only (ends, checkpoints, branch
# points, resumes, artifacts), with gaps between them, so a page of a long run stays small.
MAX_CELLS = 300


def _cells(seqs: list[int], *landmarks: list[int], limit: int = MAX_CELLS) -> list[int | None]:
    """The seqs a lineage's strip shows, ``None`` where nodes are left out.

    ``landmarks``: groups of seqs shown first to last while room is left (the first
    groups win when there are more landmarks than room).
    """
    if len(seqs) <= limit:
        return list(seqs)
    ends = set(seqs[:5]) | set(seqs[-5:])
    chosen = set(ends)
    for group in landmarks:
        room = limit - len(chosen)
        chosen |= set(sorted(set(group) - chosen)[: max(room, 0)])
    cells: list[int | None] = []
    previous = None
    for seq in sorted(chosen):
        if previous is not None and seq != previous + 1:
            cells.append(None)
        cells.append(seq)
        previous = seq
    return cells


def series(store: Store, name: str, nonce: str, key: str, max_points: int = 2000) -> dict[str, Any]:
    """``key`` over the lineage's ancestry, cut to at most ``max_points`` (see :func:`downsample`).

    Returns:
        ``{"total": finite points in all, "x": [...], "y": [...], "node": [...]}``, x
        counting nodes from the root lineage's first (see :func:`stitched_series`).
    """
    memory = memory_of(store)
    with memory.lock:
        curve = memory.curve(store, name, nonce, key)
        kept = _kept(curve.ys, curve.mins, curve.maxs, max_points)
        return {
            "total": len(curve.ys),
            "x": [curve.xs[i] for i in kept],
            "y": [curve.ys[i] for i in kept],
            "node": [curve.node(i) for i in kept],
        }


def stitched_series(store: Store, name: str, nonce: str, key: str) -> list[tuple[int, float, str]]:
    """``key`` over the lineage's ancestry: ``(x, value, node)``, x counting nodes from the root.

    A branch continues its parent's curve from the node it left: the parent's
    nodes up to the branch point, then the branch's own. Non-numeric and
    non-finite values are left out.
    """
    memory = memory_of(store)
    with memory.lock:
        curve = memory.curve(store, name, nonce, key)
        return [(curve.xs[i], curve.ys[i], curve.node(i)) for i in range(len(curve.ys))]


def artifact_names(store: Store, name: str, nonce: str) -> list[str]:
    """The artifact names anywhere along the stitched lineage (the slider's choices)."""
    return store.artifact_names(name, nonce)


def picture_names(store: Store, name: str, nonce: str) -> list[str]:
    """The artifact names along the stitched lineage stored as a picture (a PDF, PNG, JPEG,
    GIF or SVG file: :func:`~theseus.store.ui._render.is_picture`) at some node, sorted:
    the time slider's choices (a JSON or weights file is no frame)."""
    return [
        artifact
        for artifact, files in store.artifact_files(name, nonce).items()
        if any(is_picture(f) for f in files)
    ]


def artifact_frames(
    store: Store, name: str, nonce: str, artifact: str, version: int | None = None
) -> list[dict[str, Any]]:
    """The frames of the time slider: the nodes along the stitched lineage that hold
    ``artifact``, oldest first, each showing one version.

    Args:
        version: show this version at every node that holds it (the others are left
            out); None: each node's newest.

    Returns:
        Frames: ``node`` (serialized), ``seq``, ``version`` (the one shown), ``versions``
        (every version the node holds), ``filename``, and the node's ``train/step`` and
        ``val/loss`` (None when absent).
    """
    frames = []
    for frame in store.artifact_frames(name, nonce, artifact):
        held = dict(frame.pop("versions"))
        shown = max(held) if version is None else version
        if shown in held:
            frames.append(
                {**frame, "version": shown, "versions": sorted(held), "filename": held[shown]}
            )
    return frames


def artifact_version(store: Store, node: Node, name: str, version: int) -> Artifact | None:
    """Version ``version`` of ``node``'s artifact ``name`` (its bytes read on first use), or None."""
    for artifact in store.history(node, name):
        if artifact.version == version:
            return artifact
    return None


# An SAE analysis's artifact of one SAE's features (NAME/SITE/WIDTH/features.json).
FEATURES = "/features.json"


def feature_lineages(store: Store, limit: int) -> list[tuple[Lineage, list[str]]]:
    """The lineages (of the newest ``limit``) whose nodes hold artifacts named
    ``*/features.json``, newest first, each with those names (along its stitched lineage)."""
    found, _ = lineages(store, limit=limit)
    out = []
    for item in found:
        if item.artifacts:
            names = [n for n in store.artifact_names(item.name, item.nonce) if n.endswith(FEATURES)]
            if names:
                out.append((item, names))
    return out
