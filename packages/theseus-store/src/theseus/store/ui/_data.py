"""What the store browser shows, read from a read-only store: lineages, trees, series.

Every function takes an open :class:`~theseus.store.Store` and returns plain
data (dicts, lists, tuples) for the templates and the JSON endpoints. Nothing
here writes; the store itself is opened with ``readonly=True``.

The runs listing and the curves are served from a per-store memory of what was
read before (:class:`_Memory`), brought up to date on each request:

- ``PRAGMA data_version`` says whether any other connection committed since the
  last request; when none did, the memory is the answer as it stands.
- Otherwise only what changed is read. Every write marks its node (``nodes.written``,
  the writer's clock), so the nodes written since the newest mark seen (less
  :data:`OVERLAP_S`, for writers whose clocks disagree a little; the rows already
  handled are skipped) are exactly the nodes whose values may differ from what was
  read, new nodes included. Through the ``nodes_written`` index that is a short read:
  a curve patches the points of those nodes it holds (its own lineage's and its
  ancestors' up to the branch points), a lineage's last values and its last
  ``job/status`` are looked for again among them only.
- Nodes are never deleted and their name, nonce, seq and creation time never change,
  so the per-lineage node counts grow from the rows past the highest node id seen.
  Checkpoint and artifact counts grow the same way from their own row ids, and are
  counted again from scratch when the table's total says a row was deleted.
- A series reads again the last node it read (the current node of a running job gets
  more values) and every node after it.

A store made before the ``nodes_written`` index (which a writer adds when it opens the
store; the read-only browser cannot) is read as before it: the last ``job/status`` of
every lineage again on each change, a last value from the node that held it (or the last
node seen) onwards, and a curve whole again once older than :data:`REBUILD_S`, which
bounds how long a value written onto an older node stays unseen there.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
import sqlite3
import threading
import time
import weakref
from array import array
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
    "series",
    "statuses",
    "stitched_series",
]

# Without the ``nodes_written`` index, a curve's or a last value's memory is read again
# whole when older than this (seconds): the bound on how long a value written onto an
# already-read older node can stay unseen.
REBUILD_S = 120.0
# The nodes written since the newest mark seen less this (seconds) are read on a change:
# two writes can share a timestamp, and two writers' clocks may differ a little.
OVERLAP_S = 1.0
# The most points all remembered curves hold together (16 bytes a point); the least
# recently used curve is forgotten first.
MAX_REMEMBERED_POINTS = 20_000_000
# Values a curve's min/max summary covers per block (see ``_Curve``).
BLOCK = 64
_NUMERIC = "v.kind = 'v' AND typeof(v.value) IN ('integer', 'real')"


@dataclass
class Lineage:
    """One lineage: its nodes' range and what a row of the runs page shows."""

    name: str
    nonce: str
    nodes: int
    last_seq: int
    started: float
    checkpoints: int
    artifacts: int
    status: str = "-"
    last: dict[str, Any] = field(default_factory=dict)
    first_id: int = 0

    @property
    def key(self) -> str:
        """``name~nonce``, the lineage's written form."""
        return f"{self.name}~{self.nonce}"

    @property
    def last_node(self) -> str:
        """The last node, serialized."""
        return Node(self.name, self.nonce, self.last_seq).serialize()


@dataclass
class _Last:
    """A lineage's last value of a key, and from which seq on it may have changed since."""

    version: int  # the data version it was read at
    upto: int  # the lineage's last seq when it was looked for
    holder: int  # the seq of the node that holds it (-1: none up to ``upto``)
    value: Any
    built: float = field(default_factory=time.monotonic)  # when first read whole
    dirty: int | None = None  # nodes from this seq on were written since (None: none)


class _Curve:
    """A key's finite numeric points along a stitched lineage, with a min/max summary.

    ``xs``/``ys`` hold the points in x order; ``mins[b]``/``maxs[b]`` the smallest and
    largest y of ``ys[b * BLOCK : (b + 1) * BLOCK]``, kept as points are appended.
    """

    def __init__(
        self, chain: list[tuple[str, str, int]], version: int, starts: list[int] | None = None
    ) -> None:
        self.chain = chain  # (name, nonce, last seq taken), oldest first; the last one grows
        # The seq at which each part left the part before it (the first part's: -1).
        self.starts = starts if starts is not None else [-1] * len(chain)
        self.offsets: list[int] = []
        offset = 0
        for _, _, upto in chain:
            self.offsets.append(offset)
            offset += upto + 1
        self.version = version
        self.built = time.monotonic()
        self.xs = array("q")
        self.ys = array("d")
        self.mins = array("d")
        self.maxs = array("d")

    @property
    def seen(self) -> int:
        """The last seq read of the lineage itself (the chain's last part)."""
        return self.chain[-1][2]

    def append(self, points: Sequence[tuple[int, float]]) -> None:
        """Add points past every one held (x increasing), keeping the summary."""
        start = len(self.ys)
        for x, y in points:
            self.xs.append(x)
            self.ys.append(y)
        self._summarize(start)

    def patch(self, changes: Sequence[tuple[int, float | None]]) -> None:
        """Set the point at each ``x`` (x increasing) to ``y``, or remove it (``None``)."""
        xs, ys = self.xs, self.ys
        n = len(xs)
        found, there, kept = [], [], []
        for x, y in changes:
            i = bisect.bisect_left(xs, x)
            present = i < n and xs[i] == x
            if present or y is not None:  # else: no point before, none now
                found.append(i)
                there.append(present)
                kept.append((x, y))
        changes = kept
        if not changes:
            return
        if all(there) and all(y is not None for _, y in changes):
            blocks = set()
            for i, (_, y) in zip(found, changes, strict=True):
                ys[i] = y  # type: ignore[assignment]
                blocks.add(i // BLOCK)
            for b in blocks:
                chunk = ys[b * BLOCK : (b + 1) * BLOCK]
                self.mins[b], self.maxs[b] = min(chunk), max(chunk)
            return
        new_xs, new_ys = array("q"), array("d")
        pos = 0
        for i, present, (x, y) in zip(found, there, changes, strict=True):
            new_xs.extend(xs[pos:i])
            new_ys.extend(ys[pos:i])
            if y is not None:
                new_xs.append(x)
                new_ys.append(y)
            pos = i + 1 if present else i
        new_xs.extend(xs[pos:])
        new_ys.extend(ys[pos:])
        self.xs, self.ys = new_xs, new_ys
        self._summarize(found[0])

    def cut(self, x: int) -> None:
        """Forget every point at ``x`` or after."""
        keep = bisect.bisect_left(self.xs, x)
        del self.xs[keep:]
        del self.ys[keep:]
        self._summarize(keep)

    def _summarize(self, start: int) -> None:
        first = start // BLOCK
        del self.mins[first:]
        del self.maxs[first:]
        ys = self.ys
        for lo in range(first * BLOCK, len(ys), BLOCK):
            chunk = ys[lo : lo + BLOCK]
            self.mins.append(min(chunk))
            self.maxs.append(max(chunk))

    def node(self, index: int) -> str:
        """The node, serialized, that holds point ``index``."""
        x = self.xs[index]
        part = bisect.bisect_right(self.offsets, x) - 1
        name, nonce, _ = self.chain[part]
        return f"{name}~{nonce}~{x - self.offsets[part]}"


class _Memory:
    """What was read of one store before; see the module's docstring."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget everything read (the lock stays)."""
        self.version: int | None = None  # the data version of the lineage summaries
        self.synced: int | None = None  # the data version the written marks were read at
        self.indexed: bool | None = None  # whether the store has the nodes_written index
        self.mark: float | None = None  # the newest ``written`` seen
        self.recent: dict[int, float] = {}  # node id -> ``written`` handled, near the mark
        self.status_seq: dict[tuple[str, str], int] = {}  # the seq holding the last status
        # Where each lineage left another (``_branch``), kept while the written marks say
        # no node of it gained a parent in another lineage.
        self.branches: dict[tuple[str, str], tuple[int, Node] | None] = {}
        self.statuses_stale = True
        self.node_id = 0  # the highest node id read
        self.lineages: dict[tuple[str, str], Lineage] = {}
        self.tables = {"checkpoints": (0, 0), "artifacts": (0, 0)}  # (rows, highest id)
        self.counts: dict[str, dict[tuple[str, str], int]] = {"checkpoints": {}, "artifacts": {}}
        self.status: dict[tuple[str, str], Any] = {}
        self.statuses: list[str] = []
        self.numeric_keys: list[str] | None = None
        self.last: dict[tuple[str, str], dict[str, _Last]] = {}
        self.curves: collections.OrderedDict[tuple[str, str, str], _Curve] = (
            collections.OrderedDict()
        )


_MEMORIES: weakref.WeakKeyDictionary[Store, _Memory] = weakref.WeakKeyDictionary()
_MEMORIES_LOCK = threading.Lock()


def _memory(store: Store) -> _Memory:
    with _MEMORIES_LOCK:
        memory = _MEMORIES.get(store)
        if memory is None:
            memory = _MEMORIES[store] = _Memory()
        return memory


def _version(conn: sqlite3.Connection) -> int:
    """A number that changes whenever another connection commits (read before anything)."""
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def _sync(conn: sqlite3.Connection, memory: _Memory) -> int:
    """Apply what was written since the last request; return the snapshot's data version.

    Reads the nodes written since the newest mark seen (``nodes_written``), and patches
    the curves, marks the last values and sets the last statuses they touch. Without the
    index, or on the first request, only notes where things stand.
    """
    version = _version(conn)
    if version == memory.synced:
        return version
    indexed = (
        conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'nodes_written'"
        ).fetchone()
        is not None
    )
    if memory.indexed is not None and indexed != memory.indexed:
        memory.reset()  # a writer added the index: start again from it
    memory.indexed = indexed
    if indexed:
        if memory.mark is None:
            (top,) = conn.execute("SELECT MAX(written) FROM nodes").fetchone()
            memory.mark = float(top) if top is not None else -math.inf
            _written(conn, memory)  # noted as handled: everything is read from here on
        else:
            _apply(conn, memory, _written(conn, memory))
    memory.synced = version
    return version


# A node written since the mark: id, name, nonce, seq, its job/status (value, kind; None,
# None without one), and whether it has a parent in another lineage (a branch point).
_Touched = tuple[int, str, str, int, Any, Any, int]


def _written(conn: sqlite3.Connection, memory: _Memory) -> list[_Touched]:
    """The nodes written since the mark (less the overlap) not handled before; moves the mark."""
    assert memory.mark is not None
    since = memory.mark - OVERLAP_S
    rows = conn.execute(
        "SELECT n.id, n.name, n.nonce, n.seq, n.written, v.value, v.kind, "
        "EXISTS (SELECT 1 FROM edges e JOIN nodes p ON p.id = e.parent WHERE e.child = n.id "
        "AND NOT (p.name = n.name AND p.nonce = n.nonce)) "
        "FROM nodes n INDEXED BY nodes_written LEFT JOIN vals v ON v.node = n.id "
        "AND v.key = 'job/status' WHERE n.written >= ?",
        (since,),
    ).fetchall()
    recent = memory.recent
    touched = []
    for nid, name, nonce, seq, written, value, kind, cross in rows:
        written = float(written)
        if recent.get(nid) == written:
            continue
        recent[nid] = written
        memory.mark = max(memory.mark, written)
        touched.append((int(nid), name, nonce, int(seq), value, kind, int(cross)))
    floor = memory.mark - OVERLAP_S
    if len(recent) > len(rows):
        memory.recent = {k: w for k, w in recent.items() if w >= floor}
    return touched


def _apply(conn: sqlite3.Connection, memory: _Memory, touched: list[_Touched]) -> None:
    """Bring the statuses, last values and curves up to date with the written nodes."""
    if not touched:
        return
    by_lineage: dict[tuple[str, str], list[_Touched]] = collections.defaultdict(list)
    for row in touched:
        by_lineage[(row[1], row[2])].append(row)
    for lineage, rows in by_lineage.items():
        if any(r[6] for r in rows):
            memory.branches.pop(lineage, None)
        first = min(r[3] for r in rows)
        for item in memory.last.get(lineage, {}).values():
            item.dirty = first if item.dirty is None else min(item.dirty, first)
        if memory.version is not None:  # statuses were read: the last one per lineage
            held = [r for r in rows if r[5] is not None]
            if held:
                memory.statuses_stale = True
                top = max(held, key=lambda r: r[3])
                if top[3] >= memory.status_seq.get(lineage, -1):
                    memory.status_seq[lineage] = top[3]
                    memory.status[lineage] = decode_value(top[4], top[5])
    for wanted, curve in list(memory.curves.items()):
        _patch(conn, memory, wanted, curve, by_lineage)


def _patch(
    conn: sqlite3.Connection,
    memory: _Memory,
    wanted: tuple[str, str, str],
    curve: _Curve,
    by_lineage: dict[tuple[str, str], list[_Touched]],
) -> None:
    """Patch ``curve``'s points at the written nodes it holds (or forget it: a new branch)."""
    last = len(curve.chain) - 1
    ids: dict[int, int] = {}  # node id -> x
    for part, ((name, nonce, upto), offset) in enumerate(
        zip(curve.chain, curve.offsets, strict=True)
    ):
        for nid, _, _, seq, _, _, cross in by_lineage.get((name, nonce), ()):
            # A parent in another lineage at or before where the stretch left the one
            # before (anywhere in the first) may change the chain: read it again then,
            # unless it is the very branch point the chain already has.
            if cross and (part == 0 or seq <= curve.starts[part]):
                same = (
                    part > 0
                    and seq == curve.starts[part]
                    and _parents_elsewhere(conn, nid) == [curve.chain[part - 1]]
                )
                if not same:
                    memory.curves.pop(wanted)
                    return
            if seq < curve.seen if part == last else seq <= upto:
                ids[nid] = offset + seq
    if not ids:
        return
    key = wanted[2]
    values: dict[int, float] = {}
    listed = list(ids)
    for lo in range(0, len(listed), 500):
        chunk = listed[lo : lo + 500]
        for nid, value in conn.execute(
            f"SELECT v.node, v.value FROM vals v WHERE v.key = ? AND {_NUMERIC} "
            f"AND v.node IN ({', '.join('?' * len(chunk))})",
            (key, *chunk),
        ):
            if math.isfinite(value):
                values[int(nid)] = float(value)
    curve.patch(sorted((x, values.get(nid)) for nid, x in ids.items()))


def _parents_elsewhere(conn: sqlite3.Connection, nid: int) -> list[tuple[str, str, int]]:
    """The parents of node ``nid`` in other lineages."""
    return [
        (str(r[0]), str(r[1]), int(r[2]))
        for r in conn.execute(
            "SELECT p.name, p.nonce, p.seq FROM edges e JOIN nodes p ON p.id = e.parent "
            "JOIN nodes n ON n.id = e.child WHERE e.child = ? "
            "AND NOT (p.name = n.name AND p.nonce = n.nonce)",
            (nid,),
        )
    ]


def _refresh(conn: sqlite3.Connection, memory: _Memory) -> int:
    """Bring the lineage summaries up to date; return the snapshot's data version."""
    version = _sync(conn, memory)
    if version == memory.version:
        return version
    for name, nonce, count, last_seq, started, first_id, top in conn.execute(
        "SELECT name, nonce, COUNT(*), MAX(seq), MIN(created), MIN(id), MAX(id) FROM nodes "
        "WHERE id > ? GROUP BY name, nonce",
        (memory.node_id,),
    ):
        item = memory.lineages.get((name, nonce))
        if item is None:
            memory.lineages[(name, nonce)] = Lineage(
                name,
                nonce,
                nodes=int(count),
                last_seq=int(last_seq),
                started=float(started),
                checkpoints=0,
                artifacts=0,
                first_id=int(first_id),
            )
        else:
            item.nodes += int(count)
            item.last_seq = max(item.last_seq, int(last_seq))
            item.started = min(item.started, float(started))
            item.first_id = min(item.first_id, int(first_id))
        memory.node_id = max(memory.node_id, int(top))
    for table in ("checkpoints", "artifacts"):
        rows, top = conn.execute(f"SELECT COUNT(*), COALESCE(MAX(id), 0) FROM {table}").fetchone()
        had, seen = memory.tables[table]
        if (rows, top) == (had, seen):
            continue
        counts = memory.counts[table]
        if rows < had or top < seen:  # a row was deleted: count again from scratch
            counts.clear()
            had, seen = 0, 0
        added = conn.execute(
            f"SELECT n.name, n.nonce, COUNT(*) FROM {table} t JOIN nodes n ON n.id = t.node "
            "WHERE t.id > ? GROUP BY n.name, n.nonce",
            (seen,),
        ).fetchall()
        if had + sum(int(c) for _, _, c in added) != rows:  # deleted and added: start over
            counts.clear()
            added = conn.execute(
                f"SELECT n.name, n.nonce, COUNT(*) FROM {table} t JOIN nodes n ON n.id = t.node "
                "GROUP BY n.name, n.nonce"
            ).fetchall()
        for name, nonce, count in added:
            counts[(name, nonce)] = counts.get((name, nonce), 0) + int(count)
        memory.tables[table] = (int(rows), int(top))
    for (name, nonce), item in memory.lineages.items():
        item.checkpoints = memory.counts["checkpoints"].get((name, nonce), 0)
        item.artifacts = memory.counts["artifacts"].get((name, nonce), 0)
    if not memory.indexed or memory.version is None:
        # The last job/status of each lineage: SQLite takes the other columns from the
        # MAX(seq) row. (With the index, _sync keeps them from the written nodes.)
        memory.status, memory.status_seq = {}, {}
        for name, nonce, value, kind, seq in conn.execute(
            "SELECT n.name, n.nonce, v.value, v.kind, MAX(n.seq) FROM vals v "
            "JOIN nodes n ON n.id = v.node WHERE v.key = 'job/status' GROUP BY n.name, n.nonce"
        ):
            memory.status[(name, nonce)] = decode_value(value, kind)
            memory.status_seq[(name, nonce)] = int(seq)
        memory.statuses_stale = True
    for key, item in memory.lineages.items():
        state = memory.status.get(key)
        item.status = "-" if state is None else str(state)
    if memory.statuses_stale:
        memory.statuses = sorted(
            str(r[0])
            for r in conn.execute("SELECT DISTINCT value FROM vals WHERE key = 'job/status'")
        )
        memory.statuses_stale = False
    memory.numeric_keys = None
    memory.version = version
    return version


def _last_value(
    conn: sqlite3.Connection, memory: _Memory, version: int, item: Lineage, key: str
) -> Any:
    """The value of ``key`` at the lineage's last node that has it (None: no node has it)."""
    kept = memory.last.setdefault((item.name, item.nonce), {})
    found = kept.get(key)
    if found is not None and not memory.indexed and found.version != version:
        # No written marks: the last node seen and the holder may have more values now,
        # an older node only once the memory is old.
        found.dirty = 0 if time.monotonic() - found.built > REBUILD_S else found.upto
    if found is not None and found.dirty is None:
        return found.value
    start = 0 if found is None else found.dirty
    assert start is not None
    if found is not None and found.holder >= 0:
        start = min(start, found.holder) if not memory.indexed else start
    row = conn.execute(
        "SELECT n.seq, v.value, v.kind FROM nodes n JOIN vals v ON v.node = n.id AND v.key = ? "
        "WHERE n.name = ? AND n.nonce = ? AND n.seq >= ? ORDER BY n.seq DESC LIMIT 1",
        (key, item.name, item.nonce, start),
    ).fetchone()
    if row is not None:
        now = _Last(version, item.last_seq, int(row[0]), decode_value(row[1], row[2]))
    elif found is not None and start > 0:
        # None written from ``start`` on: the holder before it still holds it (values
        # are never removed).
        now = _Last(version, item.last_seq, found.holder, found.value)
    else:
        now = _Last(version, item.last_seq, -1, None)
    if found is not None and start > 0:
        now.built = found.built
    kept[key] = now
    return now.value


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


def _branch(
    conn: sqlite3.Connection, name: str, nonce: str, since: int = 0
) -> tuple[int, Node] | None:
    """``(seq, parent)`` where the lineage left another one, or None for a fresh lineage.

    ``since``: look at the lineage's nodes from that seq on only.
    """
    row = conn.execute(
        "SELECT n.seq, p.name, p.nonce, p.seq FROM nodes n JOIN edges e ON e.child = n.id "
        "JOIN nodes p ON p.id = e.parent WHERE n.name = ? AND n.nonce = ? AND n.seq >= ? "
        "AND NOT (p.name = n.name AND p.nonce = n.nonce) ORDER BY n.seq LIMIT 1",
        (name, nonce, since),
    ).fetchone()
    return None if row is None else (int(row[0]), Node(row[1], row[2], int(row[3])))


def _left(
    conn: sqlite3.Connection, memory: _Memory, name: str, nonce: str
) -> tuple[int, Node] | None:
    """:func:`_branch` from the lineage's first node, remembered while the written marks
    can say it stays so (``_sync`` ran in this snapshot; memory locked)."""
    if not memory.indexed:
        return _branch(conn, name, nonce)
    if (name, nonce) not in memory.branches:
        memory.branches[(name, nonce)] = _branch(conn, name, nonce)
    return memory.branches[(name, nonce)]


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


def _chain_starts(
    conn: sqlite3.Connection, name: str, nonce: str, memory: _Memory | None = None
) -> tuple[list[tuple[str, str, int]], list[int]]:
    """:func:`_chain`, and the seq at which each stretch left the one before (first: -1)."""
    (last,) = conn.execute(
        "SELECT MAX(seq) FROM nodes WHERE name = ? AND nonce = ?", (name, nonce)
    ).fetchone()
    if last is None:
        return [], []
    chain = [(name, nonce, int(last))]
    starts = []
    seen = {(name, nonce)}
    while (
        up := _branch(conn, *chain[-1][:2])
        if memory is None
        else _left(conn, memory, *chain[-1][:2])
    ) is not None:
        parent = up[1]
        if (parent.name, parent.nonce) in seen:
            break
        seen.add((parent.name, parent.nonce))
        starts.append(up[0])
        chain.append((parent.name, parent.nonce, parent.seq))
    return chain[::-1], [-1, *starts[::-1]][: len(chain)]


def _numeric_rows(
    conn: sqlite3.Connection, name: str, nonce: str, key: str, first: int, last: int, offset: int
) -> list[tuple[int, float]]:
    """``(offset + seq, value)`` of the lineage's finite numeric values of ``key``."""
    rows = conn.execute(
        "SELECT n.seq, v.value FROM vals v JOIN nodes n ON n.id = v.node "
        f"WHERE n.name = ? AND n.nonce = ? AND n.seq >= ? AND n.seq <= ? AND v.key = ? "
        f"AND {_NUMERIC} ORDER BY n.seq",
        (name, nonce, first, last, key),
    ).fetchall()
    isfinite = math.isfinite
    return [(offset + seq, float(value)) for seq, value in rows if isfinite(value)]


def _curve(conn: sqlite3.Connection, memory: _Memory, name: str, nonce: str, key: str) -> _Curve:
    """The curve of ``key`` along the lineage, read or brought up to date (memory locked)."""
    version = _sync(conn, memory)
    wanted = (name, nonce, key)
    curve = memory.curves.get(wanted)
    # With the written marks, _sync patched what changed before the last node read; without
    # them, the memory is trusted for REBUILD_S.
    fresh = curve is not None and (
        bool(memory.indexed) or time.monotonic() - curve.built < REBUILD_S
    )
    if curve is not None and fresh and curve.version == version:
        memory.curves.move_to_end(wanted)
        return curve
    chain: list[tuple[str, str, int]] | None = None
    starts: list[int] = []
    if curve is not None and fresh:
        # The stretches before the lineage's own stay as they were, unless a fresh
        # lineage's new nodes left another one (looking at the new nodes only: a
        # lineage's whole length is a long walk).
        (last,) = conn.execute(
            "SELECT MAX(seq) FROM nodes WHERE name = ? AND nonce = ?", (name, nonce)
        ).fetchone()
        left = len(curve.chain) == 1 and _branch(conn, name, nonce, curve.seen) is not None
        if last is not None and not left:
            chain, starts = [*curve.chain[:-1], (name, nonce, int(last))], curve.starts
    if chain is None:
        chain, starts = _chain_starts(conn, name, nonce, memory)
    if not chain:
        memory.curves.pop(wanted, None)
        return _Curve([(name, nonce, -1)], version)
    if (
        curve is None
        or not fresh
        or chain[:-1] != curve.chain[:-1]
        or chain[-1][:2] != curve.chain[-1][:2]
        or chain[-1][2] < curve.seen
    ):
        curve = _Curve(chain, version, starts)
        points: list[tuple[int, float]] = []
        for (part_name, part_nonce, upto), offset in zip(chain, curve.offsets, strict=True):
            points += _numeric_rows(conn, part_name, part_nonce, key, 0, upto, offset)
        curve.append(points)
    else:
        # Read again from the last node read (it may have more values now).
        offset = curve.offsets[-1]
        curve.cut(offset + curve.seen)
        curve.append(_numeric_rows(conn, name, nonce, key, curve.seen, chain[-1][2], offset))
        curve.chain = chain
        curve.version = version
    memory.curves[wanted] = curve
    memory.curves.move_to_end(wanted)
    held = sum(len(c.ys) for c in memory.curves.values())
    while held > MAX_REMEMBERED_POINTS and len(memory.curves) > 1:
        _, dropped = memory.curves.popitem(last=False)
        held -= len(dropped.ys)
    return curve


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


def _summary(ys: array[float]) -> tuple[array[float], array[float]]:
    """Each block's smallest and largest value (see ``_Curve``)."""
    mins, maxs = array("d"), array("d")
    for lo in range(0, len(ys), BLOCK):
        chunk = ys[lo : lo + BLOCK]
        mins.append(min(chunk))
        maxs.append(max(chunk))
    return mins, maxs


def _first_extreme(ys: array[float], blocks: array[float], lo: int, hi: int, pick: Any) -> int:
    """The index of the first smallest (``pick=min``) or largest value in ``ys[lo:hi]``."""
    b0, b1 = -(-lo // BLOCK), hi // BLOCK  # the whole blocks inside: b0 .. b1 - 1
    if b1 - b0 < 2:
        return ys.index(pick(ys[lo:hi]), lo, hi)
    left, right = ys[lo : b0 * BLOCK], ys[b1 * BLOCK : hi]
    middle = pick(blocks[b0:b1])
    best = pick([middle, *([pick(left)] if left else []), *([pick(right)] if right else [])])
    if left and pick(left) == best:
        return ys.index(best, lo, b0 * BLOCK)
    if middle == best:
        block = blocks.index(best, b0, b1)
        return ys.index(best, block * BLOCK, (block + 1) * BLOCK)
    return ys.index(best, b1 * BLOCK, hi)


def _kept(ys: array[float], mins: array[float], maxs: array[float], max_points: int) -> list[int]:
    """The indices :func:`downsample` keeps of ``ys`` (``mins``/``maxs``: its block summary)."""
    if max_points < 4:
        raise ValueError(
            f"max_points must be at least 4 (first, last, one bucket); got {max_points}."
        )
    n = len(ys)
    if n <= max_points:
        return list(range(n))
    inner = n - 2
    buckets = (max_points - 2) // 2
    kept = [0]
    for b in range(buckets):
        lo = 1 + (b * inner) // buckets
        hi = 1 + ((b + 1) * inner) // buckets
        if lo >= hi:
            continue
        low = _first_extreme(ys, mins, lo, hi, min)
        high = _first_extreme(ys, maxs, lo, hi, max)
        kept.extend(sorted({low, high}))
    kept.append(n - 1)
    return kept


def downsample(points: Sequence[tuple[Any, ...]], max_points: int = 2000) -> list[tuple[Any, ...]]:
    """At most ``max_points`` of ``points`` (sorted by x): first, last, each bucket's min and max.

    The points between the first and the last are cut into equal buckets (by
    position); each bucket keeps its smallest and its largest value (the first
    of equal ones; in x order, once if they are one point), so every peak and dip
    survives the cut. The values (``point[1]``) must be numbers, NaN excluded.
    """
    ys = array("d", (p[1] for p in points))
    return [points[i] for i in _kept(ys, *_summary(ys), max_points)]


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
