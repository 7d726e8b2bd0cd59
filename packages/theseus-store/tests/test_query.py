"""The query cursor: filters, sorting, latest(), terminals, unknown keys."""

from __future__ import annotations

import math

import pytest

from theseus.store import Node, QueryError, Store, UnknownKeyError, ValueTypeError


@pytest.fixture
def runs(store: Store) -> dict[str, list[Node]]:
    """Two projects, three lineages with losses, checkpoints and artifacts."""
    lineages: dict[str, list[Node]] = {}
    for project, run, losses in (
        ("lm", "train-gpt", [3.0, 2.5, 2.0]),
        ("lm", "train-llama", [4.0, 3.5]),
        ("vision", "train-vit", [1.0]),
    ):
        node = Node.new(run, project=project, group="base")
        nodes = []
        for loss in losses:
            store.log(node, {"train/loss": loss, "train/step": node.seq})
            nodes.append(node)
            node = node.next()
        lineages[run] = nodes
    return lineages


def test_filters_by_name_parts(store: Store, runs: dict[str, list[Node]]) -> None:
    gpt = runs["train-gpt"]
    assert store.query().spec(run="train-gpt").all() == gpt
    assert store.query().spec(project="lm").count() == 5
    assert store.query().spec(run="train-*").count() == 6
    assert store.query().spec(project="l*", run="*llama").all() == runs["train-llama"]
    assert store.query().name(gpt[0].name).nonce(gpt[0].nonce).seq(1).all() == [gpt[1]]
    assert store.query().node(gpt[2]).all() == [gpt[2]]
    assert store.query().spec(run="nothing").all() == []  # no match: empty, not an error
    with pytest.raises(ValueTypeError, match="wildcards"):
        store.query().spec(run="a.b")


def test_all_returns_nodes_with_parents(store: Store, runs: dict[str, list[Node]]) -> None:
    nodes = store.query().spec(run="train-gpt").all()
    assert [n.parent for n in nodes] == [None, runs["train-gpt"][0], runs["train-gpt"][1]]


def test_where_operators_on_folded_values(store: Store, runs: dict[str, list[Node]]) -> None:
    def losses(op: str, value: float) -> list[float]:
        return sorted(
            v["train/loss"] for v in store.query().where("train/loss", op, value).select()
        )

    assert losses("<", 2.5) == [1.0, 2.0]
    assert losses("<=", 2.5) == [1.0, 2.0, 2.5]
    assert losses(">", 3.5) == [4.0]
    assert losses(">=", 3.5) == [3.5, 4.0]
    assert losses("=", 3.0) == [3.0] and losses("==", 3.0) == [3.0]
    assert losses("!=", 3.0) == [1.0, 2.0, 2.5, 3.5, 4.0]
    with pytest.raises(QueryError, match="operator"):
        store.query().where("train/loss", "~", 1)


def test_ordering_compares_like_with_like(store: Store) -> None:
    a, b, c = Node.new("a"), Node.new("b"), Node.new("c")
    store.log(a, {"score": 2.0, "tag": "beta"})
    store.log(b, {"score": "high", "tag": "alpha"})
    store.log(c, {"score": 5, "tag": 3})
    # numbers order among numbers and strings among strings; neither sneaks into the other
    assert store.query().where("score", "<", 10).all() == [a, c]
    assert store.query().where("score", ">", "a").all() == [b]
    assert store.query().where("tag", ">=", "alpha").all() == [a, b]
    store.log(Node.new("d"), {"only_numbers": 1.5})
    with pytest.raises(QueryError, match="holds numbers") as info:
        store.query().where("only_numbers", "<", "abc")
    assert isinstance(info.value, ValueError)


def test_methods_that_take_a_node_refuse_a_string(store: Store) -> None:
    for method in (store.get, store.values, store.checkpoints, store.ancestors, store.job_config):
        with pytest.raises(ValueTypeError, match=r"Node\.deserialize"):
            method("general.default.x~abc~1")  # type: ignore[arg-type]
    with pytest.raises(ValueTypeError, match=r"^query\(\)\.node\(\) expects a .*Node\.deserialize"):
        store.query().node("general.default.x~abc~1")  # type: ignore[arg-type]


def test_seq_takes_an_integer_of_any_kind_and_nothing_else(
    store: Store, runs: dict[str, list[Node]]
) -> None:
    import numpy as np

    gpt = runs["train-gpt"]
    lineage = store.query().name(gpt[0].name).nonce(gpt[0].nonce)
    assert lineage.seq(np.int64(1)).all() == [gpt[1]]
    for wrong in ("1", 1.0, True, None):
        with pytest.raises(ValueTypeError, match=r"^query\(\)\.seq\(\) expects an int"):
            store.query().seq(wrong)  # type: ignore[arg-type]


def test_where_none_nan_and_bool(store: Store) -> None:
    a, b, c = Node.new("a"), Node.new("b"), Node.new("c")
    store.log(a, {"m": None, "ok": True})
    store.log(b, {"m": math.nan, "ok": False})
    store.log(c, {"m": 1.0})
    assert store.query().where("m", "=", None).all() == [a]
    assert store.query().where("m", "=", math.nan).all() == [b]
    assert store.query().where("m", "!=", None).all() == [b, c]
    assert store.query().where("ok", "=", True).all() == [a]
    assert store.query().has("ok").all() == [a, b]
    with pytest.raises(ValueTypeError, match="'=' or '!='"):
        store.query().where("m", "<", None)


def test_unknown_key_lists_close_names(store: Store, runs: dict[str, list[Node]]) -> None:
    with pytest.raises(UnknownKeyError, match="'train/loss'") as info:
        store.query().where("train/los", "<", 1.0)
    assert isinstance(info.value, KeyError) and "train/los" in str(info.value)
    with pytest.raises(UnknownKeyError, match="train/step"):
        store.query().sort("train/stpe")
    assert store.query().has("nowhere").all() == []


def test_sort_with_ties_and_missing(store: Store, runs: dict[str, list[Node]]) -> None:
    extra = Node.new("no-loss")
    store.log(extra, {"other": 1})
    ordered = store.query().sort("train/loss").select(return_nodes=True)
    assert [v.get("train/loss") for _, v in ordered] == [1.0, 2.0, 2.5, 3.0, 3.5, 4.0, None]
    assert ordered[-1][0] == extra  # nodes without the key come last
    down = store.query().sort("train/loss", ascending=False).select(keys=["train/loss"])
    assert down[:6] == [{"train/loss": x} for x in (4.0, 3.5, 3.0, 2.5, 2.0, 1.0)]
    # Secondary key: step descending breaks ties of the primary.
    two = store.query().has("train/loss").sort("train/step").sort("train/loss", ascending=False)
    assert [(v["train/step"], v["train/loss"]) for v in two.select()] == [
        (0, 4.0),
        (0, 3.0),
        (0, 1.0),
        (1, 3.5),
        (1, 2.5),
        (2, 2.0),
    ]


def test_latest_is_newest_node_not_newest_write(store: Store, runs: dict[str, list[Node]]) -> None:
    newest = runs["train-vit"][0]
    assert store.query().latest().all() == [newest]
    store.put(runs["train-gpt"][0], "late", "late.txt", b"x")  # an old node gets a write
    store.log(runs["train-gpt"][0], {"late": 1})
    assert store.query().latest().first() == newest
    assert store.query().spec(run="train-gpt").latest().first() == runs["train-gpt"][2]


def test_latest_with_checkpoint_is_last_recorded(store: Store, runs: dict[str, list[Node]]) -> None:
    gpt = runs["train-gpt"]
    for i, node in enumerate([gpt[2], gpt[0], gpt[1]]):  # recorded out of seq order
        path = store.root / "ckpt" / str(i)
        path.mkdir(parents=True)
        store.checkpoint(node, path)
    q = store.query().spec(run="train-gpt").checkpoint().latest()
    assert q.all() == [gpt[1]] and q.count() == 1
    # The order of calls does not matter.
    assert store.query().latest().checkpoint().spec(run="train-gpt").first() == gpt[1]
    entry = store.query().spec(run="train-gpt").latest_checkpoint()
    assert entry is not None and entry.path == str(store.root / "ckpt" / "2")
    assert store.query().spec(run="train-vit").checkpoint().latest().all() == []
    assert [c.path[-1] for c in store.query().spec(run="train-gpt").checkpoints()] == [
        "0",
        "1",
        "2",
    ]


def test_artifact_select_returns_bytes(store: Store, runs: dict[str, list[Node]]) -> None:
    node = runs["train-gpt"][1]
    store.put(node, "activations", "activations.pdf", b"%PDF-1 old")
    store.put(node, "activations", "activations.pdf", b"%PDF-1 new")
    store.put(node, "stats", "stats.json", b"{}")
    rows = store.query().node(node).artifact().select()
    assert [(r["name"], r["filename"], r["content"]) for r in rows] == [
        ("activations", "activations.pdf", b"%PDF-1 new"),
        ("stats", "stats.json", b"{}"),
    ]
    assert all(r["node"] == node for r in rows)
    only = store.query().artifact("stats").select(keys=["node", "content"])
    assert only == [{"node": node, "content": b"{}"}]
    assert store.query().artifact().count() == 1
    assert store.query().artifact("missing").select() == []
    with pytest.raises(UnknownKeyError, match="artifact field"):
        store.query().artifact().select(keys=["contents"])


def test_job_filter(store: Store, runs: dict[str, list[Node]]) -> None:
    gpt = runs["train-gpt"]
    store.record_job(gpt[0], "gpt/train/pretrain", "a: 1\n")
    assert store.query().job("gpt/train/pretrain").all() == gpt
    assert store.query().job("other").all() == []


def test_select_values_and_first(store: Store, runs: dict[str, list[Node]]) -> None:
    gpt = runs["train-gpt"]
    assert store.query().node(gpt[0]).select() == [{"train/loss": 3.0, "train/step": 0}]
    assert store.query().spec(run="train-gpt").select(keys=["train/loss"]) == [
        {"train/loss": 3.0},
        {"train/loss": 2.5},
        {"train/loss": 2.0},
    ]
    assert store.query().spec(run="none").first() is None
    with pytest.raises(UnknownKeyError):
        store.query().select(keys=["nope"])
