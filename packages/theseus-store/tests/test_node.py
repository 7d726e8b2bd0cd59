"""The node: identity, serialization, successors, validation."""

from __future__ import annotations

import pickle
import re

import pytest

from theseus.store import InvalidNodeError, Node


def test_new_defaults_and_parts() -> None:
    node = Node.new("train-gpt")
    assert node.name == "general.default.train-gpt"
    assert (node.project, node.group, node.run) == ("general", "default", "train-gpt")
    assert node.seq == 0 and node.parent is None
    assert re.fullmatch(r"[0-9a-f]{8}", node.nonce)
    other = Node.new("train-gpt")
    assert other.nonce != node.nonce  # two lineages of one name are told apart


def test_next_is_successor_with_parent() -> None:
    node = Node.new("r", project="p", group="g")
    nxt = node.next()
    assert (nxt.name, nxt.nonce, nxt.seq) == (node.name, node.nonce, 1)
    assert nxt.parent == node
    # The parent is kept without its own parent so that long lineages stay small.
    assert nxt.next().parent is not None and nxt.next().parent.parent is None  # type: ignore[union-attr]


def test_identity_ignores_parent() -> None:
    base = Node.new("base")
    a = Node("p.g.r", "abc", 3, parent=base)
    b = Node("p.g.r", "abc", 3)
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert Node("p.g.r", "abc", 2) < a  # ordered by (name, nonce, seq)


def test_serialize_round_trip_is_url_safe() -> None:
    node = Node("proj.grp.train-gpt_2", "3f9a1c2b", 41, parent=Node.new("x"))
    text = node.serialize()
    assert text == "proj.grp.train-gpt_2~3f9a1c2b~41"
    assert re.fullmatch(r"[A-Za-z0-9._~-]+", text)
    back = Node.deserialize(text)
    assert back == node and back.parent is None
    assert str(node) == text
    assert pickle.loads(pickle.dumps(node)) == node


@pytest.mark.parametrize(
    "text", ["", "a.b.c~n", "a.b.c~n~x", "a.b~n~1", "a.b.c~N!~1", "a.b.c~n~-1", "a.b.c~n~²"]
)
def test_deserialize_rejects_malformed(text: str) -> None:
    with pytest.raises(InvalidNodeError, match=r"project\.group\.run~nonce~seq|nonce|name"):
        Node.deserialize(text)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("a.b", "n", 0), "three dotted parts"),
        (("a.b.c d", "n", 0), "run name"),
        (("a.b.c", "N", 0), "nonce"),
        (("a.b.c", "n", -1), "seq"),
        (("a.b.c", "n", True), "seq"),
    ],
)
def test_constructor_validates(args: tuple[str, str, int], fragment: str) -> None:
    with pytest.raises(InvalidNodeError, match=fragment):
        Node(*args)


def test_new_rejects_bad_run_name_with_suggestion() -> None:
    with pytest.raises(InvalidNodeError, match=r"got 'my run'.*'my-run'"):
        Node.new("my run")
    assert isinstance(InvalidNodeError("x"), ValueError)


def test_a_name_with_accented_letters_is_refused_as_not_ascii() -> None:
    # "letters" alone reads as if "café" were fine: the message says ASCII, and the
    # suggestion keeps the letter without its accent
    with pytest.raises(InvalidNodeError) as caught:
        Node.new("café-run")
    message = str(caught.value)
    assert "ASCII letters (A-Z, a-z)" in message and "no accents" in message
    assert message.endswith("Rename it, e.g. 'cafe-run'.") and "\n" not in message
