"""The store's read API for the browser (``Store.data_version`` ... ``artifact_names``).

Reference: what the test itself wrote (seqs, values, versions, the branch point), kept
in plain Python as it writes; the store is read through a second, read-only ``Store``
as the browser reads it.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from theseus.store import Node, QueryError, Store


@pytest.fixture
def stores(tmp_path: Path):
    root = tmp_path / "store"
    with Store(root) as writer:
        writer.touch(Node.new("seed"))
        with Store(root, readonly=True) as reader:
            yield writer, reader


def test_a_lineage_its_branch_and_what_they_hold(stores, tmp_path: Path) -> None:
    writer, reader = stores
    base = Node.new("train", project="p", group="g")
    node = base
    for seq in range(6):
        node = node.next() if seq else node
        writer.log(node, {"val/loss": 1.0 / (seq + 1), "note": "x", "bad": math.nan})
        if seq in (1, 4):
            writer.put(node, "plot", "plot.json", b"{}")
        if seq == 3:
            folder = tmp_path / "ckpt"
            folder.mkdir()
            writer.checkpoint(node, folder)
    writer.put(Node(base.name, base.nonce, 4), "plot", "plot-2.json", b"[]")
    writer.record_job(Node(base.name, base.nonce, 2), "a/job", "lr: 1\n")
    branch = Node.new("tune", project="p", group="g", parent=Node(base.name, base.nonce, 3))
    writer.log(branch, {"val/loss": 0.1, "job/status": "running"})
    writer.log(branch.next(), {"val/loss": 0.05, "job/status": "finished"})

    assert reader.lineage_end(base.name, base.nonce) == 5
    assert reader.lineage_end("p.g.none", "abcdef") is None
    assert reader.branch_point(branch.name, branch.nonce) == (0, Node(base.name, base.nonce, 3))
    assert reader.branch_point(base.name, base.nonce) is None
    assert reader.lineage_chain(branch.name, branch.nonce) == [
        (base.name, base.nonce, 3),
        (branch.name, branch.nonce, 1),
    ]
    assert reader.numeric_series(base.name, base.nonce, "val/loss", 2, 4) == [
        (2, 1 / 3),
        (3, 1 / 4),
        (4, 1 / 5),
    ]
    assert reader.numeric_series(base.name, base.nonce, "bad", 0, 5) == []  # NaN left out
    assert reader.numeric_keys() == ["val/loss"]
    assert reader.held_keys(["note", "nope", "val/loss"]) == ["note", "val/loss"]
    assert reader.last_value(base.name, base.nonce, "val/loss") == (5, 1 / 6)
    assert reader.last_value(branch.name, branch.nonce, "job/status") == (1, "finished")
    assert reader.last_statuses() == {(branch.name, branch.nonce): (1, "finished")}
    assert reader.status_values() == ["finished", "running"]
    assert reader.job_in_lineage(Node(base.name, base.nonce, 5)) == ("a/job", "lr: 1\n")
    assert reader.job_in_lineage(Node(base.name, base.nonce, 1)) is None

    outline = reader.lineage_outline(base.name, base.nonce)
    assert outline["seqs"] == [0, 1, 2, 3, 4, 5]
    assert outline["checkpoints"] == [3]
    assert outline["artifacts"] == [1, 4]
    assert outline["jobs"] == [2]
    assert outline["branch_points"] == [3]
    assert outline["branch"] is None
    assert outline["children"] == [(branch.name, branch.nonce)]

    assert reader.artifact_names(branch.name, branch.nonce) == ["plot"]  # along the chain
    frames = reader.artifact_frames(branch.name, branch.nonce, "plot")
    assert [(f["seq"], f["versions"]) for f in frames] == [(1, [(1, "plot.json")])]
    frames = reader.artifact_frames(base.name, base.nonce, "plot")
    assert [(f["seq"], f["versions"]) for f in frames] == [
        (1, [(1, "plot.json")]),
        (4, [(1, "plot.json"), (2, "plot-2.json")]),
    ]
    assert reader.artifact_files(base.name, base.nonce) == {"plot": ["plot-2.json", "plot.json"]}
    growth = {(g.name, g.nonce): g for g in reader.lineage_growth()}
    assert growth[(base.name, base.nonce)].nodes == 6
    assert growth[(branch.name, branch.nonce)].last_seq == 1
    rows, top, by_lineage = reader.holdings_by_lineage("artifacts")
    assert rows == 3 and by_lineage == {(base.name, base.nonce): 3}
    assert reader.holding_totals()["artifacts"] == (rows, top)
    assert reader.holdings_by_lineage("artifacts", top) == (rows, top, {})
    assert reader.holding_totals()["checkpoints"][0] == 1
    with pytest.raises(QueryError, match="table must be one of checkpoints, artifacts"):
        reader.holdings_by_lineage("vals")
    writer.put(branch, "map", "map.png", b"png")
    # along the chain: the base's plot up to the branch point (seq 1's, not seq 4's)
    assert reader.artifact_files(branch.name, branch.nonce) == {
        "map": ["map.png"],
        "plot": ["plot.json"],
    }


def test_what_changed_since_a_mark(stores) -> None:
    writer, reader = stores
    before = reader.data_version()
    mark = reader.write_mark()
    assert mark is not None and mark > -math.inf
    assert reader.data_version() == before  # nothing committed since
    time.sleep(0.01)
    node = Node.new("train")
    writer.log(node, {"job/status": "running"})
    writer.log(node.next(), {"val/loss": 1.0})
    assert reader.data_version() != before
    written = reader.written_since(mark + 1e-6)
    assert [(w.name, w.seq, w.has_status, w.status, w.branches) for w in written] == [
        (node.name, 0, True, "running", False),
        (node.name, 1, False, None, False),
    ]
    assert reader.numeric_values("val/loss", [w.id for w in written]) == {written[1].id: 1.0}
    newest = reader.write_mark()
    assert newest is not None and newest >= max(w.written for w in written)


_SCALARS = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.none(),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.dictionaries(
        st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=6),
        st.lists(_SCALARS, min_size=1, max_size=4),
        min_size=1,
        max_size=6,
    )
)
@example({"inf": [-math.inf], "low": [-1.7e308], "flags": [True, "x", None, math.nan], "z": [-0.0]})
def test_numeric_keys_are_the_keys_holding_a_plain_number(store: Store, held: dict) -> None:
    # Reference: Python's own types of what was written. A number is an int or a float
    # that is not NaN (infinities and -0.0 count); a bool, None, NaN or text does not.
    if store.dialect.name == "postgresql":  # PostgreSQL keeps no NUL in text (refused)
        held = {k: [v.replace("\x00", "") if isinstance(v, str) else v for v in vs]
                for k, vs in held.items()}  # fmt: skip
    prefix = f"e{len(store.numeric_keys())}-{time.monotonic_ns()}/"
    base = Node.new("keys")
    for seq in range(max(len(values) for values in held.values())):
        node = base if seq == 0 else Node(base.name, base.nonce, seq)
        store.log(node, {prefix + k: v[seq] for k, v in held.items() if seq < len(v)})

    def plain(value: object) -> bool:
        return type(value) in (int, float) and not (isinstance(value, float) and math.isnan(value))

    want = sorted(prefix + k for k, values in held.items() if any(map(plain, values)))
    assert [k for k in store.numeric_keys() if k.startswith(prefix)] == want
    assert set(want) <= set(store.held_keys([prefix + k for k in held]))


def test_a_frames_step_is_the_imported_then_the_trained_step_then_the_seq(
    stores, tmp_path: Path
) -> None:
    """An imported revision's ``import/step`` wins over ``train/step``, which wins over the
    step of the node's checkpoint (a validation node between two reports logs no
    ``train/step``: the demo's first validation, seq 0, saved step 1), which wins over
    the seq (a node that logged neither and holds no checkpoint)."""
    writer, reader = stores
    node = Node.new("suite")
    logged = [
        {"import/step": 1000, "train/step": 7},
        {"train/step": 20},
        {},
        {"import/step": 4, "val/loss": 0.5},
        {"val/loss": 0.25},
    ]
    for seq, values in enumerate(logged):
        node = node.next() if seq else node
        writer.log(node, values)
        writer.put(node, "map", "map.pdf", b"%PDF-1.4")
        if seq in (1, 4):  # checkpoints: behind train/step at seq 1, the step at seq 4
            folder = tmp_path / "ckpt" / str(seq)
            folder.mkdir(parents=True)
            writer.checkpoint(node, folder, step=10 * seq + 1)
    frames = reader.artifact_frames(node.name, node.nonce, "map")
    assert [(f["seq"], f["step"], f["val_loss"]) for f in frames] == [
        (0, 1000, None),
        (1, 20, None),
        (2, 2, None),
        (3, 4, 0.5),
        (4, 41, 0.25),
    ]
