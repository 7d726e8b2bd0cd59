"""The browser's errors at the HTTP level: every unknown name and bad parameter refused alike.

An unknown lineage on ``/curves`` is a 404 naming it (as on ``/slider`` and
``/lineage``); a ``log`` other than 0/1 is a 400 (as ``smooth`` is); every ``/api/``
error is JSON ``{"error": ...}`` with its status, never the HTML page; an unknown
series key is a 404 naming the keys; a malformed node is explained in the browser's
terms (``project.group.run~nonce~seq``), not Python's; a blob whose bytes are gone or
changed is a 404 naming the artifact, never a 500. References: the names the test
wrote into the store, and blob files found by a SHA-256 computed here.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette", reason="the ui extra is not installed (theseus-store[ui])")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")

import _ui_store
from starlette.testclient import TestClient

from theseus.store import Node, Store
from theseus.store.ui import create_app


def _key(node: Node) -> str:
    return f"{node.name}~{node.nonce}"


def _one_line(text: str) -> str:
    assert "\n" not in text.strip(), text
    return text


def test_an_unknown_lineage_on_curves_is_a_404_naming_it(client: TestClient, built) -> None:
    _, nodes = built
    for lineage in ("lm.base.nope~abcdef", "nosuch"):
        got = client.get("/curves?" + urlencode({"l": lineage, "key": "val/loss"}))
        assert got.status_code == 404, (lineage, got.status_code)
        assert lineage in got.text
    known = _key(nodes["tune0"])
    mixed = client.get(
        "/curves?" + urlencode([("l", known), ("l", "lm.base.nope~abcdef"), ("key", "val/loss")])
    )
    assert mixed.status_code == 404 and "lm.base.nope~abcdef" in mixed.text
    good = client.get("/curves?" + urlencode({"l": known, "key": "val/loss"}))
    assert good.status_code == 200


@pytest.mark.parametrize("log", ["maybe", "2", "true", "yes"])
def test_a_log_other_than_0_or_1_is_a_400(client: TestClient, log: str) -> None:
    got = client.get("/curves?" + urlencode({"key": "val/loss", "log": log}))
    assert got.status_code == 400
    assert "log must be 0 (linear) or 1 (log scale)" in got.text
    assert f"got &#39;{log}&#39;" in got.text


def test_log_0_and_1_and_none_are_accepted(client: TestClient) -> None:
    for query in ({"log": "0"}, {"log": "1"}, {"log": ""}, {}):
        assert client.get("/curves?" + urlencode(query)).status_code == 200, query
    page = client.get("/curves?log=1").text
    assert re.search(r'id="logy"[^>]*\bchecked\b', page)


def test_every_api_error_is_json(client: TestClient, built) -> None:
    _, nodes = built
    lineage = _key(nodes["base0"])
    cases = [
        ("/api/series?" + urlencode({"l": "lm.base.nope~abcdef", "key": "val/loss"}), 404),
        ("/api/series?" + urlencode({"l": "nosuch", "key": "val/loss"}), 404),
        ("/api/series?" + urlencode({"l": lineage, "key": "val/loss", "max": "x"}), 400),
        ("/api/frames?" + urlencode({"l": "nosuch", "name": "picture"}), 404),
        ("/api/frames?" + urlencode({"l": "lm.base.nope~abcdef", "name": "picture"}), 404),
        ("/api/frames?" + urlencode({"l": lineage, "name": "picture", "version": "x"}), 400),
        ("/api/frames?" + urlencode({"l": lineage, "name": "picture", "version": 9}), 404),
        ("/api/lineage?" + urlencode({"l": "nosuch"}), 404),
        ("/api/lineage?" + urlencode({"l": "lm.base.nope~abcdef"}), 404),
        ("/api/runs?page=x", 400),
        ("/api/nosuch", 404),
    ]
    for url, code in cases:
        got = client.get(url)
        assert got.status_code == code, (url, got.status_code, got.text[:200])
        assert got.headers["content-type"].startswith("application/json"), url
        body = got.json()
        assert list(body) == ["error"], (url, body)
        assert isinstance(body["error"], str) and body["error"], (url, body)
        _one_line(body["error"])
    assert "lm.base.nope~abcdef" in client.get(cases[0][0]).json()["error"]
    # The pages keep their HTML error page.
    page = client.get("/lineage/lm.base.nope~abcdef")
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")


def test_an_unknown_series_key_is_a_404_naming_the_keys(client: TestClient, built) -> None:
    _, nodes = built
    lineage = _key(nodes["base0"])
    got = client.get("/api/series?" + urlencode({"l": lineage, "key": "val/lose"}))
    assert got.status_code == 404
    error = got.json()["error"]
    assert "No numeric key 'val/lose'" in error and "'val/loss'" in error
    missing = client.get("/api/series?" + urlencode({"l": lineage}))
    assert missing.status_code == 404 and "'val/loss'" in missing.json()["error"]
    known = client.get("/api/series?" + urlencode({"l": lineage, "key": "val/loss"}))
    assert known.status_code == 200
    assert known.json()["series"][0]["total"] == 12  # the 12 nodes of lm.base.train


@pytest.mark.parametrize("side", ["nosuch~1~2", "lm.base~abc~2", "a.b.c~ABC~1", "a.b.c~abc~x"])
def test_a_malformed_node_is_explained_in_the_browsers_terms(
    client: TestClient, built, side: str
) -> None:
    _, nodes = built
    for url in (
        "/compare?" + urlencode({"a": nodes["base3"].serialize(), "b": side}),
        f"/node/{side}",
        "/artifact?" + urlencode({"node": side, "name": "picture"}),
    ):
        got = client.get(url)
        assert got.status_code == 404, url
        assert "Node.new" not in got.text and "serialize()" not in got.text, url
        assert "project.group.run~nonce~seq" in got.text, url
    lineage = client.get("/lineage/" + side.rsplit("~", 1)[0])
    assert lineage.status_code == 404 and "Node.new" not in lineage.text


def test_a_malformed_lineage_is_explained_in_the_browsers_terms(client: TestClient) -> None:
    for lineage in ("nosuch~1", "lm.base~abc", "a.b.c~ABC", "a.b.c"):
        for url in (f"/lineage/{lineage}", "/slider?" + urlencode({"l": lineage})):
            got = client.get(url)
            assert got.status_code == 404, url
            assert "Node.new" not in got.text and "Node(" not in got.text, url
            assert "project.group.run~nonce" in got.text, url


def _blob(store_folder: Path, content: bytes) -> Path:
    digest = hashlib.sha256(content).hexdigest()
    found = [p for p in store_folder.rglob(digest) if p.is_file()]
    assert len(found) == 1, found
    return found[0]


def test_a_corrupt_or_missing_blob_is_a_404(tmp_path: Path) -> None:
    root = tmp_path / "store"
    node = Node.new("blobs")
    # Over the store's 64 KiB inline limit: each is a file under blobs/.
    pdf = _ui_store.tiny_pdf((0.0, 1.0, 0.0), detail=3000)
    notes = b"notes that will go missing\n" * 4000
    assert min(len(pdf), len(notes)) > 64 * 1024
    with Store(root) as store:
        store.put(node, "plot", "plot.pdf", pdf)
        store.put(node, "notes", "notes.txt", notes)
    changed = _blob(root, pdf)
    os.chmod(changed, 0o644)
    damaged = pdf.replace(b"0.0 1.0 0.0 rg", b"1.0 1.0 0.0 rg")
    assert len(damaged) == len(pdf) and damaged != pdf
    changed.write_bytes(damaged)
    _blob(root, notes).unlink()
    with Store(root, readonly=True) as store, TestClient(create_app(store)) as client:
        for name, word in (("plot", "corrupt"), ("notes", "missing")):
            for path in ("/png", "/artifact", "/raw"):
                if path == "/png" and name == "notes":
                    continue
                got = client.get(path + "?" + urlencode({"node": node.serialize(), "name": name}))
                assert got.status_code == 404, (path, name, got.status_code)
                detail = re.search(r'<p class="error">(.*?)</p>', got.text, re.S)
                assert detail is not None, got.text
                _one_line(detail[1])
                assert f"Artifact &#39;{name}&#39; (v1) of {node.serialize()}" in detail[1]
                assert word in detail[1] and "theseus-store fsck" in detail[1]
        # The node's page still lists them (it reads no bytes).
        assert client.get(f"/node/{node.serialize()}").status_code == 200
