"""The browser's choices at the HTTP level: pickers, unknown names, versions, the strip.

Each page without its parameters offers a picker; an unknown curve key, artifact or
version is a 404 that names the choices (never another one drawn silently); the view of
the curves lives in the URL; the slider says which version each node shows and lets one
choose; the lineage strip keeps the nodes that hold artifacts; a damaged PDF is a 404.
References: what the test itself wrote into the store (names, versions, seqs). Last, a
mechanical check that the browser holds no SQL of its own.
"""

from __future__ import annotations

import ast
import doctest
import json
import re
from pathlib import Path
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette", reason="the ui extra is not installed (theseus-store[ui])")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")

import _ui_store
from starlette.testclient import TestClient

import theseus.store.ui
from theseus.store import Node, Store
from theseus.store.ui import create_app


def _key(node: Node) -> str:
    return f"{node.name}~{node.nonce}"


# -- item 9: a page without its parameters offers a picker -----------------------------------


def test_bare_slider_and_compare_offer_pickers(client: TestClient, built) -> None:
    _, nodes = built
    slider = client.get("/slider")
    assert slider.status_code == 200, slider.text
    picked = re.findall(r'<select name="l"[^>]*>(.*?)</select>', slider.text, re.S)
    assert len(picked) == 1
    offered = re.findall(r'<option value="([^"]+)"', picked[0])
    assert sorted(offered) == sorted(_key(nodes[n]) for n in ("base0", "tune0"))
    # the lineage selected at first is one that holds artifacts (the branch holds none)
    assert offered[0] == _key(nodes["base0"]) and "· 0 artifacts" in picked[0]

    compare = client.get("/compare")
    assert compare.status_code == 200, compare.text
    assert re.search(r'<input type="text" name="a"', compare.text)
    assert re.search(r'<input type="text" name="b"', compare.text)
    listed = re.findall(r'<datalist id="last-nodes">(.*?)</datalist>', compare.text, re.S)[0]
    assert sorted(re.findall(r'<option value="([^"]+)"', listed)) == sorted(
        [nodes["base11"].serialize(), nodes["tune3"].serialize()]
    )
    # One side given (the node page's form with b left empty): the picker keeps it.
    half = client.get("/compare?" + urlencode({"a": nodes["base3"].serialize(), "b": ""}))
    assert half.status_code == 200
    assert f'value="{nodes["base3"].serialize()}"' in half.text


def test_the_header_links_every_page(client: TestClient) -> None:
    nav = re.search(r"<nav>(.*?)</nav>", client.get("/").text, re.S)
    assert nav is not None
    links = ["/", "/curves", "/slider", "/features", "/compare"]
    assert re.findall(r'href="([^"]+)"', nav[1]) == links


# -- item 10: unknown names answer 404 naming the choices; the view lives in the URL ----------


def test_an_unknown_curve_key_is_a_404_naming_the_keys(client: TestClient) -> None:
    got = client.get("/curves?" + urlencode({"key": "val/lose"}))
    assert got.status_code == 404
    assert "No numeric key &#39;val/lose&#39;" in got.text
    assert "&#39;val/loss&#39;" in got.text  # the closest one is named
    assert client.get("/curves?" + urlencode({"key": "train/step"})).status_code == 200


def test_log_scale_and_smoothing_come_from_the_url(client: TestClient) -> None:
    plain = client.get("/curves").text
    assert re.search(r'id="logy"[^>]*\bchecked\b', plain) is None
    assert re.search(r'id="smooth"[^>]*value="0"', plain)
    kept = client.get("/curves?" + urlencode({"key": "val/loss", "log": "1", "smooth": "0.6"}))
    assert kept.status_code == 200
    assert re.search(r'id="logy"[^>]*\bchecked\b', kept.text)
    assert re.search(r'id="smooth"[^>]*value="0.6"', kept.text)
    bad = client.get("/curves?smooth=2")
    assert bad.status_code == 400 and "smooth must be a number from 0 to 0.99" in bad.text


def test_an_unknown_slider_artifact_is_a_404_naming_the_artifacts(
    client: TestClient, built
) -> None:
    _, nodes = built
    lineage = _key(nodes["base0"])
    got = client.get("/slider?" + urlencode({"l": lineage, "name": "pictures"}))
    assert got.status_code == 404
    assert "holds no artifact &#39;pictures&#39;" in got.text
    assert "&#39;picture&#39;" in got.text
    unknown = client.get("/slider?" + urlencode({"l": "lm.base.nope~abcdef", "name": "picture"}))
    assert unknown.status_code == 404


def test_the_slider_offers_the_artifacts_that_are_pictures_only(client: TestClient, built) -> None:
    """The base holds a PDF ``picture``, JSON ``metrics`` and text ``notes``: only the PDF is
    a slider's frame, on the slider and on the lineage page; a JSON artifact asked for by
    name is a page saying it is not a picture, with no frames to step through."""
    _, nodes = built
    lineage = _key(nodes["base0"])
    page = client.get("/slider?" + urlencode({"l": lineage}))
    (select,) = re.findall(r'<select name="name">(.*?)</select>', page.text, re.S)
    assert re.findall(r'<option value="([^"]*)"', select) == ["picture"]
    links = re.findall(r">slider: ([^<]*)</a>", client.get(f"/lineage/{lineage}").text)
    assert links == ["picture"]
    json_page = client.get("/slider?" + urlencode({"l": lineage, "name": "metrics"}))
    assert json_page.status_code == 200
    assert 'id="not-picture"' in json_page.text and "metrics is not a picture" in json_page.text
    assert 'id="frame"' not in json_page.text and 'data-name=""' in json_page.text


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Node]]:
    """A lineage whose ``plot`` has v1 at seqs 0-3 and a v2 at seqs 1 and 3 (as ``--over
    --force`` leaves it), v2 a different file name."""
    root = tmp_path_factory.mktemp("versions") / "store"
    node = Node.new("train", project="p", group="g")
    nodes = []
    with Store(root) as store:
        for seq in range(4):
            node = node.next() if seq else node
            store.log(node, {"val/loss": 1.0 / (1 + seq)})
            store.put(node, "plot", "plot.pdf", _ui_store.tiny_pdf((1.0, 0.0, 0.0)))
            nodes.append(node)
        for seq in (1, 3):
            store.put(nodes[seq], "plot", "plot-again.pdf", _ui_store.tiny_pdf((0.0, 0.0, 1.0)))
    return root, nodes


def test_the_slider_says_which_version_and_lets_one_choose(versions) -> None:
    root, nodes = versions
    lineage = _key(nodes[0])
    with Store(root, readonly=True) as store, TestClient(create_app(store)) as client:
        page = client.get("/slider?" + urlencode({"l": lineage, "name": "plot"})).text
        assert 'id="mixed"' in page
        assert "v1 at 2 nodes, v2 at 2 nodes" in page
        options = re.findall(r'<select name="version"[^>]*>(.*?)</select>', page, re.S)[0]
        assert re.findall(r'<option value="([^"]+)"', options) == ["newest", "1", "2"]

        def frames(version: str) -> list[tuple[int, int, list[int], str]]:
            query = {"l": lineage, "name": "plot", "version": version}
            got = client.get("/api/frames?" + urlencode(query))
            assert got.status_code == 200, got.text
            return [
                (f["seq"], f["version"], f["versions"], f["filename"]) for f in got.json()["frames"]
            ]

        assert frames("newest") == [
            (0, 1, [1], "plot.pdf"),
            (1, 2, [1, 2], "plot-again.pdf"),
            (2, 1, [1], "plot.pdf"),
            (3, 2, [1, 2], "plot-again.pdf"),
        ]
        assert frames("1") == [(s, 1, v, "plot.pdf") for s, v in enumerate([[1], [1, 2]] * 2)]
        assert frames("2") == [(1, 2, [1, 2], "plot-again.pdf"), (3, 2, [1, 2], "plot-again.pdf")]
        shown = client.get("/slider?" + urlencode({"l": lineage, "name": "plot", "version": 2}))
        assert 'data-version="2"' in shown.text and 'id="mixed"' not in shown.text
        for bad in ("/slider", "/api/frames"):
            missing = client.get(
                bad + "?" + urlencode({"l": lineage, "name": "plot", "version": 7})
            )
            assert missing.status_code == 404
            assert "has versions 1, 2; not 7" in missing.text
            word = client.get(bad + "?" + urlencode({"l": lineage, "name": "plot", "version": "x"}))
            assert word.status_code == 400


def test_the_strip_of_a_long_lineage_keeps_the_nodes_with_artifacts(tmp_path: Path) -> None:
    root = tmp_path / "store"
    node = Node.new("long")
    pictured = {250, 640}
    with Store(root) as store, store.batch():
        for seq in range(1000):
            store.log(node, {"val/loss": 1.0})
            if seq in pictured:
                store.put(node, "plot", "plot.json", json.dumps({"seq": seq}).encode())
            node = node.next() if seq < 999 else node
    with Store(root, readonly=True) as store, TestClient(create_app(store)) as client:
        html = client.get(f"/lineage/{_key(node)}").text
    shown = [int(s) for s in re.findall(r'title="seq (\d+)', html)]
    assert shown == [0, 1, 2, 3, 4, 250, 640, 995, 996, 997, 998, 999]
    assert re.findall(r'title="seq (\d+) · artifacts"', html) == ["250", "640"]


# -- item 11: a damaged PDF is a 404 like every other bad artifact -----------------------------


def test_the_picture_of_a_damaged_pdf_is_a_404(tmp_path: Path) -> None:
    root = tmp_path / "store"
    node = Node.new("broken")
    with Store(root) as store:
        store.put(node, "plot", "plot.pdf", b"%PDF-1.4\nthis is no PDF at all\n%%EOF\n")
    with Store(root, readonly=True) as store, TestClient(create_app(store)) as client:
        got = client.get("/png?" + urlencode({"node": node.serialize(), "name": "plot"}))
        assert got.status_code == 404
        assert "is a damaged PDF" in got.text
        page = client.get("/artifact?" + urlencode({"node": node.serialize(), "name": "plot"}))
        assert page.status_code == 200


# -- the browser reads through the store's public read API -------------------------------------

UI = Path(theseus.store.ui.__file__).parent
SQL = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|PRAGMA|sqlite_master|CREATE\s+(TABLE|INDEX))\b|"
    r"\bFROM\s+(nodes|vals|edges|jobs|artifacts|checkpoints|blobs)\b"
)


def test_the_browser_holds_no_sql_of_its_own() -> None:
    sources = sorted(UI.rglob("*.py"))
    assert len(sources) >= 8, sources
    for path in sources:
        text = path.read_text()
        tree = ast.parse(text)
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
        found = [s for s in strings if isinstance(s, str) and SQL.search(s)]
        assert not found, f"{path.name} holds SQL: {found[:3]}"
        calls = [
            n.func.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        ]
        for banned in ("execute", "executemany", "read", "read_one", "write", "connection"):
            assert banned not in calls, f"{path.name} calls .{banned}(): SQL through a connection"
        assert "sqlite3" not in text, f"{path.name} uses sqlite3"


def test_the_data_module_imports_no_private_name_of_the_memory() -> None:
    tree = ast.parse((UI / "_data.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "theseus.store.ui._memory":
            private = [a.name for a in node.names if a.name.startswith("_")]
            assert not private, private
    assert len((UI / "_memory.py").read_text().splitlines()) < 500


# -- an imported suite's revisions are no resumes, and only their own settings applied -------

CONFIG = "job: hf/suite\ntraining:\n  lr: 0.001  # peak\narchitecture:\n  n_layers: 2  # blocks\n"


def test_imported_revisions_then_a_real_resume(tmp_path: Path) -> None:
    """Nodes holding ``import/revision`` (each with a job record, as ``theseus import hf
    --revisions`` writes them; ``main`` without a step) are named as imported revisions, a
    job started after them is a resume; an imported node shows the import's keys and the
    architecture only, the resumed node its whole configuration."""
    from theseus.store.ui import _imports

    result = doctest.testmod(_imports)
    assert result.attempted > 0 and result.failed == 0
    root = tmp_path / "store"
    node = Node.new("tiny", project="p", group="g")
    with Store(root) as store:
        for k, (seq, revision) in enumerate([(1, "step1"), (2, "step2"), (5, "main")]):
            node = Node(node.name, node.nonce, seq, parent=None if k == 0 else node)
            store.record_job(node, "hf/suite", CONFIG)
            values = {"import/revision": revision, "import/sha256": "ab" * 32}
            if revision != "main":
                values["import/step"] = seq
            store.log(node, values)
        resumed = Node(node.name, node.nonce, 6, parent=node)
        store.record_job(resumed, "hf/suite", CONFIG)
        store.log(resumed, {"train/loss": 2.5})
    reader = theseus.store.ui.open_readonly(root)
    with reader, TestClient(create_app(reader)) as client:
        tree = client.get(f"/lineage/{_key(node)}").text
        assert "imported revisions: step 1, 2, main</span>" in tree
        assert "resumed at seq 6</span>" in tree
        imported = client.get(f"/node/{node.name}~{node.nonce}~2").text
        assert 'id="imported"' in imported and "<th>import/sha256</th>" in imported
        (shown,) = re.findall(r'<pre class="yaml">(.*?)</pre>', imported, re.S)
        assert shown == "job: hf/suite\narchitecture:\n  n_layers: 2  # blocks\n"
        whole = client.get(f"/node/{resumed.serialize()}").text
        assert 'id="imported"' not in whole
        assert re.findall(r'<pre class="yaml">(.*?)</pre>', whole, re.S) == [CONFIG]
