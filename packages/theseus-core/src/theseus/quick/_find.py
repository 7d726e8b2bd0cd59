"""``Finder``: the store's query cursor plus ``resume()`` and ``branch()`` for a quick session."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from theseus.errors import TheseusError
from theseus.store import Node

if TYPE_CHECKING:
    from theseus.quick._session import Quick


class QuickError(TheseusError, RuntimeError):
    """A quick session used out of order, or a selection that is not exactly one node."""


class Finder:
    """A chainable query over the session's store (every :class:`theseus.store.Query` method).

    Filters return the finder, so ``q.find().spec(run="x").checkpoint().latest()``
    reads like the store's cursor; terminals (``all``, ``first``, ``count``,
    ``select``) return what the cursor returns. :meth:`resume` and
    :meth:`branch` pick the base node of the job ``q.create()`` builds.
    """

    def __init__(self, session: Quick, query: Any) -> None:
        self._session = session
        self._query = query
        self._calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._query, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
            self._calls.append(f".{name}({', '.join(shown)})")
            result = attr(*args, **kwargs)
            return self if result is self._query else result

        return call

    def describe(self) -> str:
        """The chain so far, as written: ``find().spec(run='x').latest()``."""
        return "find()" + "".join(self._calls)

    def _one(self, verb: str) -> Node:
        nodes = self._query.all()
        if not nodes:
            raise QuickError(
                f"{verb}() selected no node: {self.describe()} matched nothing in the store "
                f"at {str(self._session.store.root)!r}. Check the run name and filters (list "
                f"runs with `theseus-store runs {self._session.store.root}`)."
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

    def __repr__(self) -> str:
        return f"<Finder {self.describe()}>"
