"""``Finder``: the store's query cursor plus ``resume()``, ``branch()`` and ``over()`` for a quick session."""

from __future__ import annotations

import shlex
from typing import Any, Protocol

from theseus.errors import TheseusError
from theseus.job import from_host_zero, is_primary
from theseus.store import Node, Query, Store


class Session(Protocol):
    """What a finder uses of its quick session (`theseus.quick.Quick`): the store, and
    where a chosen base node goes."""

    @property
    def store(self) -> Store: ...
    def _select(self, node: Node, resume: bool) -> Node: ...
    def _select_over(self, nodes: list[Node], force: bool) -> list[Node]: ...


class _Same:
    """A filter's answer: the cursor itself (one object on every host, even unpickled)."""

    def __reduce__(self) -> str:
        return "_SAME"


_SAME = _Same()


class QuickError(TheseusError, RuntimeError):
    """A quick session used out of order, or a selection that is not exactly one node."""


class Finder:
    """A chainable query over the session's store (every :class:`theseus.store.Query` method).

    Filters return the finder, so ``q.find().spec(run="x").checkpoint().latest()``
    reads like the store's cursor; terminals (``all``, ``first``, ``count``,
    ``select``) return what the cursor returns. :meth:`resume` and
    :meth:`branch` pick the base node of the job ``q.create()`` builds;
    :meth:`over` picks every checkpoint of a lineage for one analysis.
    """

    def __init__(self, session: Session) -> None:
        self._session = session
        # The cursor lives on host zero only; the other hosts receive each call's answer.
        self._query: Query | None = session.store.query() if is_primary() else None
        self._calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if not callable(getattr(Query, name)):  # an unknown name raises AttributeError here
            return from_host_zero(lambda: getattr(self._query, name))

        def call(*args: Any, **kwargs: Any) -> Any:
            shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
            self._calls.append(f".{name}({', '.join(shown)})")
            answer = from_host_zero(lambda: self._apply(name, args, kwargs))
            return self if answer is _SAME else answer

        return call

    def _apply(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """On host zero: call the cursor; a filter (which returns a cursor) answers `_SAME`."""
        assert self._query is not None, "the cursor lives on host zero"
        result = getattr(self._query, name)(*args, **kwargs)
        if isinstance(result, Query):
            self._query = result
            return _SAME
        return result

    def describe(self) -> str:
        """The chain so far, as written: ``find().spec(run='x').latest()``."""
        return "find()" + "".join(self._calls)

    def _one(self, verb: str) -> Node:
        nodes: list[Node] = from_host_zero(lambda: self._apply("all", (), {}))
        if not nodes:
            raise QuickError(
                f"{verb}() selected no node: {self.describe()} matched nothing in the store "
                f"at {str(self._session.store.root)!r}. Check the run name and filters (list "
                f"runs with `theseus-store runs {shlex.quote(str(self._session.store.root))}`)."
            )
        if len(nodes) > 1:
            raise QuickError(
                f"{verb}() needs exactly one node, but {self.describe()} matched {len(nodes)} "
                f"(e.g. {nodes[0]} and {nodes[1]}). Chain .latest() to take the most recent, "
                "or filter further (.seq(i), .nonce(s), .where(...))."
            )
        return nodes[0]

    def resume(self) -> Node:
        """Select the one matching node as the base to resume (the job attaches to it).

        Loads the configuration saved in its lineage into ``q.config``: saved
        values win over defaults; your assignments win over both.

        Returns:
            The selected node.

        Raises:
            QuickError: no node, or more than one node, matches.
        """
        return self._session._select(self._one("resume"), resume=True)

    def branch(self) -> Node:
        """Select the one matching node as the base of a new lineage (see :meth:`resume`).

        Returns:
            The selected node.

        Raises:
            QuickError: no node, or more than one node, matches.
        """
        return self._session._select(self._one("branch"), resume=False)

    def over(self, *, force: bool = False) -> list[Node]:
        """Select every checkpoint of the lineage the query comes down to, for one analysis.

        The matching nodes must belong to one lineage (``.spec(run=...)`` of a run with
        one lineage, ``.nonce(...)``, or ``.latest()`` for the latest one's); the job
        ``q.create()`` builds is set up at its first checkpointed node, and calling it
        analyzes every checkpointed node in seq order on that one instance (compiled
        once), attaching each result to its own node as ``.resume()`` would. Loads
        the configuration saved at the lineage's last checkpoint into ``q.config``
        (your assignments win, as with ``.resume()``).

        Args:
            force: also recompute the nodes that already hold this analysis's result
                for the same configuration (a new artifact version); by default they
                are skipped.

        Returns:
            The checkpointed nodes, in seq order.

        Raises:
            QuickError: no node matches, the nodes span several lineages, the lineage
                has no checkpoint, or the job built is not an analysis.
        """
        nodes: list[Node] = from_host_zero(self._lineage_checkpoints)
        return self._session._select_over(nodes, force)

    def _lineage_checkpoints(self) -> list[Node]:
        """On host zero: the checkpointed nodes of the one lineage the cursor matches."""
        assert self._query is not None, "the cursor lives on host zero"
        matched = self._query.all()
        store = self._session.store
        if not matched:
            raise QuickError(
                f"over() selected no lineage: {self.describe()} matched nothing in the store "
                f"at {str(store.root)!r}. Check the run name and filters (list runs with "
                f"`theseus-store runs {shlex.quote(str(store.root))}`)."
            )
        lineages = sorted({f"{n.name}~{n.nonce}" for n in matched})
        if len(lineages) > 1:
            shown = ", ".join(lineages[:3]) + (", ..." if len(lineages) > 3 else "")
            raise QuickError(
                f"over() walks one lineage, but {self.describe()} matched nodes of "
                f"{len(lineages)} ({shown}). Chain .nonce(NONCE) to pick one, or .latest() "
                "for the lineage of the most recent node."
            )
        name, nonce = matched[0].name, matched[0].nonce
        saved = store.query().name(name).nonce(nonce).checkpoints()
        nodes = sorted({c.node for c in saved}, key=lambda n: n.seq)
        if not nodes:
            raise QuickError(
                f"over() found no checkpoint in lineage {name}~{nonce} ({len(matched)} "
                "matching node(s), none checkpointed): there is nothing to analyze. Train "
                "it with checkpoints (logging/checkpoint_interval), or pick another lineage."
            )
        return nodes

    def __repr__(self) -> str:
        return f"<Finder {self.describe()}>"
