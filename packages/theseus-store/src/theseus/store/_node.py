"""The node: one point on a run's logical clock (name, nonce, seq).

A node's identity is ``(name, nonce, seq)``. ``name`` is ``project.group.run``;
``nonce`` tells apart two lineages that share a name; ``seq`` counts from 0.
The parent is carried along for convenience but is not part of the identity:
two nodes with the same triple are equal and hash alike whatever their parents.

Example:
    >>> n = Node("general.default.train", "3f9a1c2b", 0)
    >>> n.next().serialize()
    'general.default.train~3f9a1c2b~1'
    >>> Node.deserialize("general.default.train~3f9a1c2b~1") == n.next()
    True
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import unicodedata

from theseus.store._errors import InvalidNodeError

__all__ = ["DEFAULT_GROUP", "DEFAULT_PROJECT", "Node"]

DEFAULT_PROJECT = "general"
DEFAULT_GROUP = "default"

_PART = re.compile(r"[A-Za-z0-9_-]+")
MAX_PART = 200  # characters of a project, group or run name
_NONCE = re.compile(r"[a-z0-9]+")
_SEP = "~"
_SEQ = re.compile(r"[0-9]+")


def check_part(part: object, what: str) -> str:
    """Return ``part`` if it is a valid dotted-name part, else raise.

    Args:
        part: the candidate project, group or run name.
        what: which part it is, for the message.

    Returns:
        The part, unchanged.

    Raises:
        InvalidNodeError: if it is not a non-empty string of ASCII letters, digits, ``_``
            and ``-`` of at most ``MAX_PART`` characters.
    """
    if not isinstance(part, str) or not _PART.fullmatch(part):
        raise InvalidNodeError(
            f"A {what} name must be a non-empty string of ASCII letters (A-Z, a-z), digits, "
            f"'_' and '-' (no accents, dots, spaces or '~'); got {part!r}. Rename it, e.g. "
            f"{_suggest(part)!r}."
        )
    if len(part) > MAX_PART:
        raise InvalidNodeError(
            f"A {what} name must be at most {MAX_PART} characters (it names folders, and a "
            f"folder name is at most 255 bytes); got {len(part)} ({part[:20]}...). Shorten it."
        )
    return part


def _suggest(part: object) -> str:
    """A valid name close to `part`: accents dropped (`café` -> `cafe`), other runs -> `-`."""
    ascii_text = unicodedata.normalize("NFKD", str(part)).encode("ascii", "ignore").decode()
    return re.sub(r"[^A-Za-z0-9_-]+", "-", ascii_text).strip("-") or "run"


@dataclasses.dataclass(frozen=True, order=True)
class Node:
    """A point on a run's lineage.

    Args:
        name: ``project.group.run``, three dotted parts of ASCII letters, digits, ``_``, ``-``.
        nonce: lowercase letters and digits distinguishing lineages of one name.
        seq: the position on the lineage's clock, from 0.
        parent: the node this one follows (not part of the identity).

    Raises:
        InvalidNodeError: if a field is malformed.
    """

    name: str
    nonce: str
    seq: int
    parent: Node | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        """Validate every field so that a malformed node never reaches the database."""
        if not isinstance(self.name, str) or self.name.count(".") != 2:
            raise InvalidNodeError(
                f"A node name must be 'project.group.run' (three dotted parts); got "
                f"{self.name!r}. Use Node.new(run, project=..., group=...) to build one."
            )
        for part, what in zip(self.name.split("."), ("project", "group", "run"), strict=True):
            check_part(part, what)
        if not isinstance(self.nonce, str) or not _NONCE.fullmatch(self.nonce):
            raise InvalidNodeError(
                f"A node nonce must be lowercase letters and digits; got {self.nonce!r}. "
                "Let Node.new() draw one."
            )
        if isinstance(self.seq, bool) or not isinstance(self.seq, int) or self.seq < 0:
            raise InvalidNodeError(f"A node seq must be an int >= 0; got {self.seq!r}.")
        if self.parent is not None and not isinstance(self.parent, Node):
            raise InvalidNodeError(
                f"A node's parent must be a Node or None; got {type(self.parent).__name__}."
            )

    @classmethod
    def new(
        cls,
        run: str,
        project: str | None = None,
        group: str | None = None,
        parent: Node | None = None,
    ) -> Node:
        """Start a lineage: a fresh nonce and seq 0 (with ``parent``, a branch).

        Args:
            run: the run name.
            project: the project name (default ``general``).
            group: the group name (default ``default``).
            parent: the base node of a branch, or None for a fresh lineage.

        Returns:
            The first node of the new lineage.

        Raises:
            InvalidNodeError: if a name part is malformed.
        """
        name = ".".join(
            (
                check_part(project or DEFAULT_PROJECT, "project"),
                check_part(group or DEFAULT_GROUP, "group"),
                check_part(run, "run"),
            )
        )
        return cls(name, secrets.token_hex(4), 0, parent=parent)

    @classmethod
    def trusted(cls, name: str, nonce: str, seq: int, parent: Node | None = None) -> Node:
        """Build a node from fields the store validated when it recorded them (no checks)."""
        node = object.__new__(cls)
        object.__setattr__(node, "name", name)
        object.__setattr__(node, "nonce", nonce)
        object.__setattr__(node, "seq", seq)
        object.__setattr__(node, "parent", parent)
        return node

    def next(self) -> Node:
        """Return the successor: same name and nonce, ``seq + 1``, parent = this node.

        The parent keeps its own parent only when that one is in another lineage
        (a branch edge), so that a long-lived lineage does not keep a chain of
        every node in memory (the store keeps every edge).
        """
        base = self.parent
        if base is not None and (base.name, base.nonce) == (self.name, self.nonce):
            base = None
        me = Node(self.name, self.nonce, self.seq, parent=None if base is None else base.identity())
        return Node(self.name, self.nonce, self.seq + 1, parent=me)

    def identity(self) -> Node:
        """Return this node without its parent (the part that defines equality)."""
        if self.parent is None:
            return self
        return Node(self.name, self.nonce, self.seq)

    @property
    def project(self) -> str:
        """The first dotted part of the name."""
        return self.name.split(".")[0]

    @property
    def group(self) -> str:
        """The second dotted part of the name."""
        return self.name.split(".")[1]

    @property
    def run(self) -> str:
        """The third dotted part of the name."""
        return self.name.split(".")[2]

    def serialize(self) -> str:
        """Return the short URL-safe form ``project.group.run~nonce~seq`` (no parent)."""
        return f"{self.name}{_SEP}{self.nonce}{_SEP}{self.seq}"

    @classmethod
    def deserialize(cls, text: str) -> Node:
        """Read back a string made by :meth:`serialize`.

        Args:
            text: ``project.group.run~nonce~seq``.

        Returns:
            The node (its parent is None; ask the store for its edges).

        Raises:
            InvalidNodeError: if ``text`` is not of that form.
        """
        parts = text.split(_SEP) if isinstance(text, str) else []
        if len(parts) != 3 or not _SEQ.fullmatch(parts[2]):
            raise InvalidNodeError(
                f"Expected a serialized node 'project.group.run~nonce~seq' (as printed by "
                f"node.serialize() or `theseus-store runs`); got {text!r}."
            )
        return cls(parts[0], parts[1], int(parts[2]))

    def __str__(self) -> str:
        """Return the serialized form."""
        return self.serialize()

    def __repr__(self) -> str:
        """Return a constructor-like form that shows the parent's identity only."""
        parent = f", parent={self.parent.serialize()!r}" if self.parent is not None else ""
        return f"Node({self.name!r}, {self.nonce!r}, {self.seq}{parent})"
