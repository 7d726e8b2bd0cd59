"""The store browser's memory of one store: what it read before, kept exact per request.

The runs listing and the curves (:mod:`theseus.store.ui._data`) are served from a
per-store memory of what was read before (:class:`Memory`), brought up to date on
each request through the store's public read methods (``Store.data_version``,
``Store.written_since``, ``Store.lineage_growth``...; the SQL is the store's own):

- ``Store.data_version()`` says whether any other connection committed since the
  last request; when none did, the memory is the answer as it stands.
- Otherwise only what changed is read. Every write marks its node (``nodes.written``,
  the writer's clock), so the nodes written since the newest mark seen (less
  :data:`OVERLAP_S`, for writers whose clocks disagree a little; the rows already
  handled are skipped) are exactly the nodes whose values may differ from what was
  read, new nodes included. That is a short read (the ``nodes_written`` index):
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

Each store read is its own snapshot, never older than the version noted before it:
what a read finds past that version is read again on the next change, never missed
(the marks and ids that say where to read from come from the rows read).
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from theseus.store._browse import HOLDINGS, WrittenNode
from theseus.store._node import Node
from theseus.store._store import Store
from theseus.store.ui._curve import Curve

__all__ = ["MAX_REMEMBERED_POINTS", "OVERLAP_S", "REBUILD_S", "Lineage", "Memory", "memory_of"]

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


class Memory:
    """What was read of one store before; see the module's docstring.

    Every method but :meth:`reset` expects :attr:`lock` held and the store it remembers.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """Forget everything read (the lock stays)."""
        self.version: int | None = None  # the data version of the lineage summaries
        self.synced: int | None = None  # the data version the written marks were read at
        self.indexed: bool | None = None  # whether the store keeps write marks
        self.mark: float | None = None  # the newest ``written`` seen
        self.recent: dict[int, float] = {}  # node id -> ``written`` handled, near the mark
        self.status_seq: dict[tuple[str, str], int] = {}  # the seq holding the last status
        # Where each lineage left another (``left``), kept while the written marks say
        # no node of it gained a parent in another lineage.
        self.branches: dict[tuple[str, str], tuple[int, Node] | None] = {}
        self.statuses_stale = True
        self.node_id = 0  # the highest node id read
        self.lineages: dict[tuple[str, str], Lineage] = {}
        self.tables = dict.fromkeys(HOLDINGS, (0, 0))  # (rows, highest id)
        self.counts: dict[str, dict[tuple[str, str], int]] = {t: {} for t in HOLDINGS}
        self.status: dict[tuple[str, str], Any] = {}
        self.statuses: list[str] = []
        self.numeric_keys: list[str] | None = None
        self.last: dict[tuple[str, str], dict[str, _Last]] = {}
        self.curves: collections.OrderedDict[tuple[str, str, str], Curve] = (
            collections.OrderedDict()
        )

    # -- what was written since the last request ---------------------------------------

    def sync(self, store: Store) -> int:
        """Apply what was written since the last request; return the store's data version.

        Reads the nodes written since the newest mark seen, and patches the curves, marks
        the last values and sets the last statuses they touch. Without write marks, or on
        the first request, only notes where things stand.
        """
        version = store.data_version()
        if version == self.synced:
            return version
        top = store.write_mark()
        indexed = top is not None
        if self.indexed is not None and indexed != self.indexed:
            self.reset()  # a writer added the index: start again from it
        self.indexed = indexed
        if top is not None:
            if self.mark is None:
                self.mark = top
                self._written(store)  # noted as handled: everything is read from here on
            else:
                self._apply(store, self._written(store))
        self.synced = version
        return version

    def _written(self, store: Store) -> list[WrittenNode]:
        """The nodes written since the mark (less the overlap) not handled before; moves it."""
        assert self.mark is not None
        rows = store.written_since(self.mark - OVERLAP_S)
        recent = self.recent
        touched = []
        for row in rows:
            if recent.get(row.id) == row.written:
                continue
            recent[row.id] = row.written
            self.mark = max(self.mark, row.written)
            touched.append(row)
        floor = self.mark - OVERLAP_S
        if len(recent) > len(rows):
            self.recent = {k: w for k, w in recent.items() if w >= floor}
        return touched

    def _apply(self, store: Store, touched: list[WrittenNode]) -> None:
        """Bring the statuses, last values and curves up to date with the written nodes."""
        if not touched:
            return
        by_lineage: dict[tuple[str, str], list[WrittenNode]] = collections.defaultdict(list)
        for row in touched:
            by_lineage[(row.name, row.nonce)].append(row)
        for lineage, rows in by_lineage.items():
            if any(r.branches for r in rows):
                self.branches.pop(lineage, None)
            first = min(r.seq for r in rows)
            for item in self.last.get(lineage, {}).values():
                item.dirty = first if item.dirty is None else min(item.dirty, first)
            if self.version is not None:  # statuses were read: the last one per lineage
                held = [r for r in rows if r.has_status]
                if held:
                    self.statuses_stale = True
                    top = max(held, key=lambda r: r.seq)
                    if top.seq >= self.status_seq.get(lineage, -1):
                        self.status_seq[lineage] = top.seq
                        self.status[lineage] = top.status
        for wanted, curve in list(self.curves.items()):
            self._patch(store, wanted, curve, by_lineage)

    def _patch(
        self,
        store: Store,
        wanted: tuple[str, str, str],
        curve: Curve,
        by_lineage: dict[tuple[str, str], list[WrittenNode]],
    ) -> None:
        """Patch ``curve``'s points at the written nodes it holds (or forget it: a new branch)."""
        last = len(curve.chain) - 1
        ids: dict[int, int] = {}  # node id -> x
        for part, ((name, nonce, upto), offset) in enumerate(
            zip(curve.chain, curve.offsets, strict=True)
        ):
            for row in by_lineage.get((name, nonce), ()):
                seq = row.seq
                # A parent in another lineage at or before where the stretch left the one
                # before (anywhere in the first) may change the chain: read it again then,
                # unless it is the very branch point the chain already has.
                if row.branches and (part == 0 or seq <= curve.starts[part]):
                    same = (
                        part > 0
                        and seq == curve.starts[part]
                        and _parents_elsewhere(store, row) == [curve.chain[part - 1]]
                    )
                    if not same:
                        self.curves.pop(wanted)
                        return
                if seq < curve.seen if part == last else seq <= upto:
                    ids[row.id] = offset + seq
        if not ids:
            return
        values = store.numeric_values(wanted[2], list(ids))
        curve.patch(sorted((x, values.get(nid)) for nid, x in ids.items()))

    # -- the runs listing ------------------------------------------------------------------

    def refresh(self, store: Store) -> int:
        """Bring the lineage summaries up to date; return the store's data version."""
        version = self.sync(store)
        if version == self.version:
            return version
        for grown in store.lineage_growth(self.node_id):
            item = self.lineages.get((grown.name, grown.nonce))
            if item is None:
                self.lineages[(grown.name, grown.nonce)] = Lineage(
                    grown.name,
                    grown.nonce,
                    nodes=grown.nodes,
                    last_seq=grown.last_seq,
                    started=grown.started,
                    checkpoints=0,
                    artifacts=0,
                    first_id=grown.first_id,
                )
            else:
                item.nodes += grown.nodes
                item.last_seq = max(item.last_seq, grown.last_seq)
                item.started = min(item.started, grown.started)
                item.first_id = min(item.first_id, grown.first_id)
            self.node_id = max(self.node_id, grown.last_id)
        totals = store.holding_totals()
        for table in HOLDINGS:
            if totals[table] != self.tables[table]:
                self._count(store, table)
        for (name, nonce), item in self.lineages.items():
            item.checkpoints = self.counts["checkpoints"].get((name, nonce), 0)
            item.artifacts = self.counts["artifacts"].get((name, nonce), 0)
        if not self.indexed or self.version is None:
            # The last job/status of each lineage. (With write marks, ``sync`` keeps them
            # from the written nodes.)
            found = store.last_statuses()
            self.status = {k: value for k, (_, value) in found.items()}
            self.status_seq = {k: seq for k, (seq, _) in found.items()}
            self.statuses_stale = True
        for key, item in self.lineages.items():
            state = self.status.get(key)
            item.status = "-" if state is None else str(state)
        if self.statuses_stale:
            self.statuses = store.status_values()
            self.statuses_stale = False
        self.numeric_keys = None
        self.version = version
        return version

    def _count(self, store: Store, table: str) -> None:
        """Bring the per-lineage row counts of ``table`` up to date."""
        counts = self.counts[table]
        had, seen = self.tables[table]
        rows, top, added = store.holdings_by_lineage(table, seen)
        if rows < had or top < seen or had + sum(added.values()) != rows:
            counts.clear()  # a row was deleted: count again from scratch
            rows, top, added = store.holdings_by_lineage(table, 0)
        for lineage, count in added.items():
            counts[lineage] = counts.get(lineage, 0) + count
        self.tables[table] = (rows, top)

    def last_value(self, store: Store, version: int, item: Lineage, key: str) -> Any:
        """The value of ``key`` at the lineage's last node that has it (None: no node has it)."""
        kept = self.last.setdefault((item.name, item.nonce), {})
        found = kept.get(key)
        if found is not None and not self.indexed and found.version != version:
            # No written marks: the last node seen and the holder may have more values now,
            # an older node only once the memory is old.
            found.dirty = 0 if time.monotonic() - found.built > REBUILD_S else found.upto
        if found is not None and found.dirty is None:
            return found.value
        start = 0 if found is None else found.dirty
        assert start is not None
        if found is not None and found.holder >= 0:
            start = min(start, found.holder) if not self.indexed else start
        row = store.last_value(item.name, item.nonce, key, start)
        if row is not None:
            now = _Last(version, item.last_seq, row[0], row[1])
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

    # -- branch points, jobs and curves ----------------------------------------------------

    def left(self, store: Store, name: str, nonce: str) -> tuple[int, Node] | None:
        """``Store.branch_point`` of the lineage, remembered while the written marks can say
        it stays so (``sync`` ran for this request)."""
        if not self.indexed:
            return store.branch_point(name, nonce)
        if (name, nonce) not in self.branches:
            self.branches[(name, nonce)] = store.branch_point(name, nonce)
        return self.branches[(name, nonce)]

    def chain_starts(
        self, store: Store, name: str, nonce: str
    ) -> tuple[list[tuple[str, str, int]], list[int]]:
        """The stretches a lineage stitches: ``(name, nonce, last seq taken)``, oldest first,
        and the seq at which each stretch left the one before (first: -1)."""
        last = store.lineage_end(name, nonce)
        if last is None:
            return [], []
        chain = [(name, nonce, last)]
        starts = []
        seen = {(name, nonce)}
        while (up := self.left(store, *chain[-1][:2])) is not None:
            parent = up[1]
            if (parent.name, parent.nonce) in seen:
                break
            seen.add((parent.name, parent.nonce))
            starts.append(up[0])
            chain.append((parent.name, parent.nonce, parent.seq))
        return chain[::-1], [-1, *starts[::-1]][: len(chain)]

    def job(self, store: Store, node: Node) -> tuple[str, str] | None:
        """``(job, config)`` in effect at ``node`` (``Store.job_config``'s walk, with the
        branch points remembered)."""
        self.sync(store)
        seen: set[tuple[str, str]] = set()
        current: Node | None = node
        while current is not None and (current.name, current.nonce) not in seen:
            seen.add((current.name, current.nonce))
            found = store.job_in_lineage(current)
            if found is not None:
                return found
            up = self.left(store, current.name, current.nonce)
            current = None if up is None or up[0] > current.seq else up[1]
        return None

    def curve(self, store: Store, name: str, nonce: str, key: str) -> Curve:
        """The curve of ``key`` along the lineage, read or brought up to date."""
        version = self.sync(store)
        wanted = (name, nonce, key)
        curve = self.curves.get(wanted)
        # With the written marks, sync patched what changed before the last node read;
        # without them, the memory is trusted for REBUILD_S.
        fresh = curve is not None and (
            bool(self.indexed) or time.monotonic() - curve.built < REBUILD_S
        )
        if curve is not None and fresh and curve.version == version:
            self.curves.move_to_end(wanted)
            return curve
        chain: list[tuple[str, str, int]] | None = None
        starts: list[int] = []
        if curve is not None and fresh:
            # The stretches before the lineage's own stay as they were, unless a fresh
            # lineage's new nodes left another one (looking at the new nodes only: a
            # lineage's whole length is a long walk).
            last = store.lineage_end(name, nonce)
            left = len(curve.chain) == 1 and store.branch_point(name, nonce, curve.seen) is not None
            if last is not None and not left:
                chain, starts = [*curve.chain[:-1], (name, nonce, last)], curve.starts
        if chain is None:
            chain, starts = self.chain_starts(store, name, nonce)
        if not chain:
            self.curves.pop(wanted, None)
            return Curve([(name, nonce, -1)], version)
        if (
            curve is None
            or not fresh
            or chain[:-1] != curve.chain[:-1]
            or chain[-1][:2] != curve.chain[-1][:2]
            or chain[-1][2] < curve.seen
        ):
            curve = Curve(chain, version, starts)
            points: list[tuple[int, float]] = []
            for (part_name, part_nonce, upto), offset in zip(chain, curve.offsets, strict=True):
                points += _shifted(store, part_name, part_nonce, key, 0, upto, offset)
            curve.append(points)
        else:
            # Read again from the last node read (it may have more values now).
            offset = curve.offsets[-1]
            curve.cut(offset + curve.seen)
            curve.append(_shifted(store, name, nonce, key, curve.seen, chain[-1][2], offset))
            curve.chain = chain
            curve.version = version
        self.curves[wanted] = curve
        self.curves.move_to_end(wanted)
        held = sum(len(c.ys) for c in self.curves.values())
        while held > MAX_REMEMBERED_POINTS and len(self.curves) > 1:
            _, dropped = self.curves.popitem(last=False)
            held -= len(dropped.ys)
        return curve


_MEMORIES: weakref.WeakKeyDictionary[Store, Memory] = weakref.WeakKeyDictionary()
_MEMORIES_LOCK = threading.Lock()


def memory_of(store: Store) -> Memory:
    """The memory of ``store`` (one per open store, made on first use)."""
    with _MEMORIES_LOCK:
        memory = _MEMORIES.get(store)
        if memory is None:
            memory = _MEMORIES[store] = Memory()
        return memory


def _parents_elsewhere(store: Store, row: WrittenNode) -> list[tuple[str, str, int]]:
    """The parents of a written node in other lineages: ``(name, nonce, seq)``."""
    return [
        (p.name, p.nonce, p.seq)
        for p in store.parents(Node(row.name, row.nonce, row.seq))
        if (p.name, p.nonce) != (row.name, row.nonce)
    ]


def _shifted(
    store: Store, name: str, nonce: str, key: str, first: int, last: int, offset: int
) -> list[tuple[int, float]]:
    """``(offset + seq, value)`` of ``Store.numeric_series``."""
    return [(offset + seq, y) for seq, y in store.numeric_series(name, nonce, key, first, last)]
