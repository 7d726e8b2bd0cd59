"""Names a user writes for a node, resolved: a run, a lineage, or one node.

``theseus-store runs`` prints lineages as ``project.group.run~nonce``; commands
take that, ``~seq`` for one node, the run's name alone for its one lineage, and
``name~nonce`` with the run's name alone. A name that fits nothing is an error
that lists what the store does have.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from theseus.store._errors import InvalidNodeError, UnknownNodeError
from theseus.store._node import Node
from theseus.store._query import Query
from theseus.store._records import Scalar

__all__ = ["Named", "never_started", "resolve", "resolve_run"]


class Named(Protocol):
    """What resolving a name asks of a store (``StoreReader`` is one)."""

    root: Path

    def query(self) -> Query:
        """A query over every node."""

    def values(self, node: Node) -> dict[str, Scalar]:
        """``node``'s values."""

    def runs(self) -> list[dict[str, Any]]:
        """A summary of each lineage."""


def resolve(store: Named, text: str) -> Node:
    """The node a user wrote: ``project.group.run~nonce~seq``, ``...~nonce`` for the
    last node of that lineage (the form ``theseus-store runs`` prints; the run's name
    alone may stand for ``project.group.run``), or a run alone (``run`` or
    ``project.group.run``) for the last node of its one lineage.

    Raises:
        InvalidNodeError: ``text`` is none of these forms.
        InvalidNodeError: a run alone that has several lineages (the message
            lists them, each as ``name~nonce``).
        UnknownNodeError: the store has no such run, lineage or node in it; the
            message names what it does have (the lineage's full name when only its
            nonce matched, the range of its nodes when only the seq is wrong).
    """
    if "~" not in text:
        return resolve_run(store, text)
    name, nonce, *rest = text.split("~")
    seq = None
    if rest:  # checks the form (a run alone is checked as if its project were general)
        node = Node.deserialize(text if "." in name else f"general.default.{text}")
        nonce, seq = node.nonce, node.seq
    nodes = store.query().name(name).nonce(nonce).all()
    if not nodes and "." not in name:  # a run's name alone, with the lineage's nonce
        nodes = [n for n in store.query().nonce(nonce).all() if n.name.split(".")[-1] == name]
        if len({n.name for n in nodes}) == 1:
            name = nodes[0].name
        else:
            nodes = []
    listing = f"List them with `theseus-store runs {shlex.quote(str(store.root))}`."
    if not nodes:
        named = sorted({n.name for n in store.query().nonce(nonce).all()})
        if named:
            hint = f"lineage {nonce} is {' and '.join(f'{n}~{nonce}' for n in named)}"
            raise UnknownNodeError(
                f"The store has no lineage {name}~{nonce}; {hint}. A node is written "
                "project.group.run~nonce (~seq for one node); pass that name."
            )
        raise UnknownNodeError(
            f"The store has no lineage {name}~{nonce} (a lineage is written "
            f"project.group.run~nonce, as `theseus-store runs` prints it). {listing}"
        )
    last = max(nodes, key=lambda node: node.seq)
    if seq is None:
        return last
    if not any(node.seq == seq for node in nodes):
        first = min(nodes, key=lambda node: node.seq)
        lineage = f"{name}~{nonce}"
        raise UnknownNodeError(
            f"The store has no node {lineage}~{seq}: the {_count(len(nodes), 'node')} of "
            f"lineage {lineage} run from seq {first.seq} to {last.seq}. Pass one of them as "
            f"{lineage}~SEQ, or {lineage} for its last node; `theseus-store lineage "
            f"{shlex.quote(str(store.root))} {lineage}` lists them with their checkpoints."
        )
    return Node(name, nonce, seq)


def _empty(store: Named, text: str) -> str:
    """Why a store without a single run cannot hold ``text``: most often the ROOT given
    is another spelling of the one the runs wrote into."""
    return (
        f"The store at {store.root} holds no runs yet, so none named {text!r}. Pass the ROOT "
        "your runs wrote into (the folder that holds store/), or train one there first."
    )


def resolve_run(store: Named, text: str) -> Node:
    """The last node of the one lineage of the run ``text`` names (see :func:`resolve`)."""
    runs = store.runs()
    mine = [r for r in runs if text in (r["name"], r["name"].split(".", 2)[-1])]
    if not runs:
        raise UnknownNodeError(_empty(store, text))
    if not mine:
        known = sorted({r["name"] for r in runs})
        shown = ", ".join(known[:8]) + (", ..." if len(known) > 8 else "") or "none"
        raise UnknownNodeError(
            f"The store at {store.root} has no run named {text!r} (its runs: {shown}). "
            "Pass a run name, project.group.run, or a node as `theseus-store runs` "
            "prints it (project.group.run~nonce, or project.group.run~nonce~seq)."
        )
    if len(mine) > 1:  # a lineage that never started does not compete with one that did
        mine = [r for r in mine if never_started(store, r) is None] or mine
    if len(mine) > 1:
        listed = "; ".join(
            f"{r['name']}~{r['nonce']} ({_count(r['nodes'], 'node')}, "
            f"{_count(r['checkpoints'], 'checkpoint')})"
            for r in mine
        )
        raise InvalidNodeError(
            f"Run {text!r} has {len(mine)} lineages: {listed}. Pass one of them as "
            "name~nonce (its last node) or name~nonce~seq."
        )
    return Node(mine[0]["name"], mine[0]["nonce"], mine[0]["last_seq"])


#: What `never_started` says of a lineage whose node still says ``setting up``.
KILLED_IN_SETUP = (
    "no outcome recorded after `setting up`: the process was killed while setting up "
    "(out of memory, SIGKILL), or is setting up now"
)


def never_started(store: Named, run: Mapping[str, Any]) -> str | None:
    """Why a lineage's job never started (failed or was killed while setting up), else None.

    `run` is one of ``Store.runs()``' summaries. theseus-core records
    ``job/status = setting up`` on a new lineage's one node before its setup runs, then
    ``ready`` when it is done, or ``failed`` with ``job/failed_in = setup`` and the error
    when it raised; such a lineage has that node only and no checkpoint. A node still
    ``setting up`` gives :data:`KILLED_IN_SETUP`.
    """
    if run["nodes"] != 1 or run["checkpoints"]:
        return None
    values = store.values(Node(run["name"], run["nonce"], run["last_seq"]))
    if values.get("job/status") == "setting up":
        return KILLED_IN_SETUP
    if values.get("job/status") != "failed" or values.get("job/failed_in") != "setup":
        return None
    return str(values.get("job/error", ""))


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"
