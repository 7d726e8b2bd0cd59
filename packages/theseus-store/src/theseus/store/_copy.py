"""Copy a whole store into another, on either backend: every row, blob and checkpoint folder.

``theseus-store copy SRC DST`` (and :func:`copy_store`) moves a store between SQLite and
PostgreSQL, or between two roots. Rows are matched by what they are, not by their ids
(a node by ``name~nonce~seq``, an edge by its two nodes, a value by node and key, an
artifact by node, name and version, a job record by node, job, configuration and time, a
checkpoint by node, step and path), so each stage adds only what the destination lacks:
a copy that was interrupted is resumed by running it again, and running it on a finished
copy adds nothing. The destination records the source (``meta`` key ``copy/source``: the
source's identity, so any name of the same store resumes the copy): a destination that
holds nodes is refused unless it is a copy of this very source, or ``merge`` is asked
for. While the copy is under way the destination also holds ``copy/unfinished`` (removed
once :func:`verify` passed): a copy stopped half-way is never taken for a whole one, and
``theseus-store fsck`` and ``runs`` say so.

Artifact bytes are read through the source's ``load`` (verified against their hash) and
written where the destination keeps them (inline up to its ``inline_max``, else its
blob folder). A checkpoint row relative to the source's root or store folder names a
folder the copy brings along to the same place under the destination (hard links where
both are on one filesystem, else copies); an absolute row is kept as it is. Between two
Theseus roots, what the runs read besides the store comes along too
(``_root.ROOT_FOLDERS``: the prepared datasets and tokenizers, so that sampling, resuming
and analysing the copy find them), each dataset or tokenizer folder whole or not at all;
one the destination already holds with other contents is its own and is kept.

At the end :func:`verify` compares the two: the destination holds every node, edge,
value, artifact (its bytes hashing to its digest), job record and checkpoint row of the
source (the same number of each, without ``merge``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from theseus.store._errors import StoreError
from theseus.store._records import decode_value, encode_value
from theseus.store._root import ROOT_FOLDERS
from theseus.store._schema import COPY_UNFINISHED
from theseus.store._store import Store

__all__ = ["CopyReport", "copy_store", "unfinished", "verify"]

_CHUNK = 2000


@dataclasses.dataclass
class CopyReport:
    """What a copy added, per kind of row (a resumed copy counts only what it added)."""

    added: dict[str, int] = dataclasses.field(default_factory=dict)
    checked: dict[str, int] = dataclasses.field(default_factory=dict)


def _older_source_name(src: Store) -> str:
    """How an earlier version recorded the source (the spelling of its database)."""
    return f"{src.database} (store {src.root})"


def _named(store: Store) -> str:
    """The store as a command names it: its Theseus root, else its folder."""
    return str(store.folders.theseus_root or store.root)


def unfinished(store: Store) -> str | None:
    """The source of a copy into ``store`` that has not finished (None: no such copy)."""
    rows = store.read_one("SELECT value FROM meta WHERE key = ?", (COPY_UNFINISHED,))
    return str(rows[0][0]) if rows else None


def _rows(store: Store, sql: str) -> list[tuple[Any, ...]]:
    return store.read(lambda conn: [tuple(r) for r in conn.execute(sql).fetchall()])


def _check_destination(src: Store, dst: Store, merge: bool) -> None:
    def state(conn: Any) -> tuple[bool, str | None]:
        held = conn.execute("SELECT 1 FROM nodes LIMIT 1").fetchone() is not None
        row = conn.execute("SELECT value FROM meta WHERE key = 'copy/source'").fetchone()
        return held, None if row is None else str(row[0])

    if src.identity == dst.identity:
        raise StoreError(f"copy: the source and the destination are the same store ({src.root}).")
    held, source = dst.read(state)
    if held and not merge and source not in (src.identity, _older_source_name(src)):
        raise StoreError(
            f"copy: the destination {dst.database} already holds nodes"
            + (f" (a copy of {source})" if source else "")
            + ". Copy into a new or empty store, or pass --merge to add this store's rows to it."
        )

    def begin(conn: Any) -> None:
        for key, value in (("copy/source", src.identity), (COPY_UNFINISHED, _named(src))):
            conn.execute(
                "INSERT INTO meta(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    dst.write(begin)


def _node_ids(store: Store) -> dict[tuple[str, str, int], int]:
    return {
        (str(n), str(c), int(s)): int(i)
        for i, n, c, s in _rows(store, "SELECT id, name, nonce, seq FROM nodes")
    }


def _insert(dst: Store, sql: str, rows: list[tuple[Any, ...]]) -> None:
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start : start + _CHUNK]

        def put(conn: Any, chunk: list[tuple[Any, ...]] = chunk) -> None:
            conn.executemany(sql, chunk)

        dst.write(put)


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _bring_folder(source: Path, target: Path) -> bool:
    """Bring the checkpoint folder ``source`` to ``target`` (False: already there, same sizes)."""
    if target.exists():
        if _sizes(source) == _sizes(target):
            return False
        shutil.rmtree(target)  # an interrupted copy's partial folder
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".copying")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial, copy_function=_link_or_copy, symlinks=True)
    os.replace(partial, target)
    return True


def copy_store(
    src: Store, dst: Store, *, merge: bool = False, say: Callable[[str], None] = lambda _: None
) -> CopyReport:
    """Copy every row, blob and checkpoint folder of ``src`` into ``dst``, then verify.

    Args:
        src: the store to copy (read only).
        dst: the destination (new, a partial copy of ``src``, or any store with ``merge``).
        merge: add ``src``'s rows to a destination that holds other nodes.
        say: called with one line per stage (progress).

    Returns:
        What each stage added, and what :func:`verify` checked.

    Raises:
        StoreError: a destination that holds other nodes (without ``merge``), or a
            difference :func:`verify` found.
    """
    _check_destination(src, dst, merge)
    report = CopyReport()
    have = _node_ids(dst)
    nodes = _rows(
        src,
        "SELECT id, name, nonce, seq, project, grp, run, created, written FROM nodes ORDER BY id",
    )
    new = [r[1:] for r in nodes if (r[1], r[2], int(r[3])) not in have]
    _insert(
        dst,
        "INSERT OR IGNORE INTO nodes(name, nonce, seq, project, grp, run, created, written) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        new,
    )
    report.added["nodes"] = len(new)
    say(f"nodes: {len(nodes)} ({len(new)} added)")
    have = _node_ids(dst)
    ids = {int(r[0]): have[(r[1], r[2], int(r[3]))] for r in nodes}

    edges = [(ids[c], ids[p]) for c, p in _rows(src, "SELECT child, parent FROM edges")]
    held = set(_rows(dst, "SELECT child, parent FROM edges"))
    edges = [e for e in edges if e not in held]
    _insert(dst, "INSERT OR IGNORE INTO edges(child, parent) VALUES (?, ?)", edges)
    report.added["edges"] = len(edges)

    row = dst.dialect.row
    values = [
        (ids[n], k, *row(*encode_value(k, decode_value(v, kind))))
        for n, k, v, kind in _rows(src, "SELECT node, key, value, kind FROM vals")
    ]
    _insert(
        dst,
        "INSERT INTO vals(node, key, value, kind) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(node, key) DO UPDATE SET value = excluded.value, kind = excluded.kind",
        values,
    )
    report.added["values"] = len(values)
    say(f"values: {len(values)}")

    report.added["blobs"] = _copy_bytes(src, dst)
    artifacts = _rows(
        src, "SELECT node, name, filename, hash, size, version, created FROM artifacts ORDER BY id"
    )
    held_versions = set(_rows(dst, "SELECT node, name, version FROM artifacts"))
    fresh = [(ids[a[0]], *a[1:]) for a in artifacts if (ids[a[0]], a[1], a[5]) not in held_versions]
    _insert(
        dst,
        "INSERT INTO artifacts(node, name, filename, hash, size, version, created) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        fresh,
    )
    report.added["artifacts"] = len(fresh)
    say(f"artifacts: {len(artifacts)} ({len(fresh)} added, {report.added['blobs']} blobs written)")

    jobs = _rows(src, "SELECT node, job, config, created FROM jobs ORDER BY id")
    held_jobs = set(_rows(dst, "SELECT node, job, config, created FROM jobs"))
    fresh_jobs = [(ids[j[0]], *j[1:]) for j in jobs if (ids[j[0]], *j[1:]) not in held_jobs]
    _insert(dst, "INSERT INTO jobs(node, job, config, created) VALUES (?, ?, ?, ?)", fresh_jobs)
    report.added["jobs"] = len(fresh_jobs)

    report.added["checkpoints"], report.added["checkpoint folders"] = _copy_checkpoints(
        src, dst, ids
    )
    say(
        f"checkpoints: {report.added['checkpoints']} rows added, "
        f"{report.added['checkpoint folders']} folders brought"
    )
    brought, kept = _bring_root_folders(src, dst)
    report.added["root folders"] = brought
    if brought or kept:
        say(
            f"{' and '.join(ROOT_FOLDERS)}: {brought} folder{'s' if brought != 1 else ''} brought"
            + (f"; kept the destination's own {', '.join(kept)}" if kept else "")
        )
    say("verifying the copy against the source")
    report.checked = verify(src, dst, exact=not merge)
    dst.write(lambda conn: conn.execute("DELETE FROM meta WHERE key = ?", (COPY_UNFINISHED,)))
    say("verified: " + ", ".join(f"{n} {k}" for k, n in report.checked.items()))
    return report


def _bring_root_folders(src: Store, dst: Store) -> tuple[int, list[str]]:
    """Bring each entry of the source root's ``ROOT_FOLDERS`` the destination root lacks.

    Returns:
        How many entries were brought, and the destination's own entries that differ
        from the source's (kept as they are), as ``data/NAME``.
    """
    theirs, mine = src.folders.theseus_root, dst.folders.theseus_root
    if theirs is None or mine is None or theirs.resolve() == mine.resolve():
        return 0, []
    brought, kept = 0, []
    for name in ROOT_FOLDERS:
        if not (theirs / name).is_dir():
            continue
        for entry in sorted((theirs / name).iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue  # a preparation's temporary file, or what no run reads
            target = mine / name / entry.name
            if target.exists():
                if _sizes(entry) != _sizes(target):
                    kept.append(f"{name}/{entry.name}")
                continue
            brought += _bring_folder(entry, target)
    return brought, kept


def _sizes(folder: Path) -> dict[Path, int]:
    return {p.relative_to(folder): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def _copy_bytes(src: Store, dst: Store) -> int:
    """Every artifact's bytes where ``dst`` keeps them; returns how many were written."""
    written = 0
    for digest, size in _rows(src, "SELECT DISTINCT hash, size FROM artifacts"):
        size = int(size)
        if size <= dst.inline_max:
            if _has_inline(dst, digest):
                continue
            _put_inline(dst, digest, src.load(digest, size))
            written += 1
        elif dst.blobs.check(digest, size) is not None:
            dst.blobs.write(src.load(digest, size), digest)
            written += 1
    return written


def _has_inline(store: Store, digest: str) -> bool:
    def find(conn: Any) -> bool:
        return conn.execute("SELECT 1 FROM inline WHERE hash = ?", (digest,)).fetchone() is not None

    return store.read(find)


def _put_inline(store: Store, digest: str, data: bytes) -> None:
    def put(conn: Any) -> None:
        conn.execute("INSERT OR IGNORE INTO inline(hash, content) VALUES (?, ?)", (digest, data))

    store.write(put)


def _copy_checkpoints(src: Store, dst: Store, ids: dict[int, int]) -> tuple[int, int]:
    rows = _rows(
        src, "SELECT node, path, relative, step, meta, created FROM checkpoints ORDER BY id"
    )
    brought = 0
    for _, path, relative, *_rest in rows:
        if int(relative) in (1, 2):
            source = src.checkpoint_path(str(path), int(relative))
            target = dst.checkpoint_path(str(path), int(relative))
            if source != target and source.exists():
                brought += _bring_folder(source, target)
    held = set(_rows(dst, "SELECT node, step, relative, path FROM checkpoints"))
    fresh = [(ids[n], p, r, s, m, c) for n, p, r, s, m, c in rows if (ids[n], s, r, p) not in held]
    _insert(
        dst,
        "INSERT INTO checkpoints(node, path, relative, step, meta, created) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(node, step, relative, path) DO NOTHING",
        fresh,
    )
    latest = "(SELECT MAX(c.id) FROM checkpoints c WHERE c.node = nodes.id)"
    dst.write(
        lambda conn: conn.execute(
            f"UPDATE nodes SET ckpt = {latest} WHERE id IN (SELECT node FROM checkpoints) "
            f"AND (ckpt IS NULL OR ckpt <> {latest})"
        )
    )
    return len(fresh), brought


def verify(src: Store, dst: Store, *, exact: bool = True) -> dict[str, int]:
    """Check that ``dst`` holds everything ``src`` holds (and, ``exact``, nothing else).

    Returns:
        How many of each were checked.

    Raises:
        StoreError: naming the first kind of row that differs.
    """
    tables = {
        "nodes": "SELECT n.name, n.nonce, n.seq FROM nodes n",
        "edges": "SELECT c.name, c.nonce, c.seq, p.name, p.nonce, p.seq FROM edges e "
        "JOIN nodes c ON c.id = e.child JOIN nodes p ON p.id = e.parent",
        "values": "SELECT n.name, n.nonce, n.seq, v.key, v.value, v.kind FROM vals v "
        "JOIN nodes n ON n.id = v.node",
        "artifacts": "SELECT n.name, n.nonce, n.seq, a.name, a.filename, a.hash, a.size, "
        "a.version FROM artifacts a JOIN nodes n ON n.id = a.node",
        "jobs": "SELECT n.name, n.nonce, n.seq, j.job, j.config FROM jobs j "
        "JOIN nodes n ON n.id = j.node",
        "checkpoints": "SELECT n.name, n.nonce, n.seq, c.path, c.relative, c.step, c.meta "
        "FROM checkpoints c JOIN nodes n ON n.id = c.node",
    }
    checked = {}
    for kind, sql in tables.items():
        theirs, mine = _canonical(kind, _rows(src, sql)), _canonical(kind, _rows(dst, sql))
        missing = theirs - mine
        if missing or (exact and mine != theirs):
            example = sorted(map(repr, missing or (mine - theirs)))[0]
            raise StoreError(
                f"copy: the destination's {kind} differ from the source's ({len(missing)} "
                f"missing, {len(mine - theirs)} extra; e.g. {example}). Run the copy again."
            )
        checked[kind] = len(theirs)
    for digest, size in _rows(dst, "SELECT DISTINCT hash, size FROM artifacts"):
        dst.load(digest, int(size))  # raises on bytes that do not hash to their digest
    checked["blobs"] = len(_rows(dst, "SELECT DISTINCT hash FROM artifacts"))
    return checked


def _canonical(kind: str, rows: list[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    """Rows in one form whatever the backend (a value decoded, floats by their repr)."""
    if kind != "values":
        return {tuple(r) for r in rows}
    out = set()
    for *where, value, how in rows:
        decoded = decode_value(value, how)
        out.add((*where, type(decoded).__name__, repr(decoded)))
    return out
