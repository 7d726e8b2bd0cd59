"""The store browser's memory of one store: what it read before, kept exact per request.

The runs listing and the curves (:mod:`theseus.store.ui._data`) are served from a
per-store memory of what was read before (:class:`_Memory`), brought up to date on
each request:

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
from theseus.store.ui._downsample import BLOCK

__all__ = ["MAX_REMEMBERED_POINTS", "OVERLAP_S", "REBUILD_S", "Lineage"]

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


def _chain_starts(
    conn: sqlite3.Connection, name: str, nonce: str, memory: _Memory | None = None
) -> tuple[list[tuple[str, str, int]], list[int]]:
    """The stretches a lineage stitches: ``(name, nonce, last seq taken)``, oldest first, and
    the seq at which each stretch left the one before (first: -1)."""
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
