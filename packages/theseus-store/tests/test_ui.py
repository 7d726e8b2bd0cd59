"""The store browser at the HTTP level (Starlette's TestClient): pages, safety, numbers.

References: the store's own API for what each page must show; a direct NumPy
computation for the downsampling (first and last point, each bucket's min and
max); SHA-256 of every file for "the store is never written"; Pillow's PNG
decoder for the rendered PDF page.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette", reason="the ui extra is not installed (theseus-store[ui])")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")

import _ui_store
import numpy as np
from starlette.testclient import TestClient

from theseus.store import Node, Store
from theseus.store._errors import CorruptStoreError, NotAStoreError, StorePermissionError
from theseus.store.ui import CSP, create_app, downsample, open_readonly, running
from theseus.store.ui._data import stitched_series
from theseus.store.ui._serve import store_folder

HOSTILE, HOSTILE_IMG, build = _ui_store.HOSTILE, _ui_store.HOSTILE_IMG, _ui_store.build


@pytest.fixture(scope="module")
def client(built: tuple[Path, dict[str, Node]]):
    store = open_readonly(built[0])
    with TestClient(create_app(store, allowed_hosts=["testserver"])) as c:
        yield c
    store.close()


def _pages(nodes: dict[str, Node]) -> list[str]:
    last = nodes["base11"].serialize()
    tune = nodes["tune3"]
    lineage = f"{tune.name}~{tune.nonce}"
    return [
        "/",
        "/?q=tune",
        "/?status=running",
        "/?page=2",
        f"/lineage/{lineage}",
        f"/lineage/{nodes['base0'].name}~{nodes['base0'].nonce}",
        f"/node/{last}",
        f"/node/{tune.serialize()}",
        "/artifact?" + urlencode({"node": last, "name": "metrics"}),
        "/artifact?" + urlencode({"node": last, "name": "metrics", "version": 1}),
        "/artifact?" + urlencode({"node": last, "name": HOSTILE}),
        "/artifact?" + urlencode({"node": last, "name": "notes"}),
        "/artifact?" + urlencode({"node": nodes["base9"].serialize(), "name": "picture"}),
        "/png?" + urlencode({"node": nodes["base9"].serialize(), "name": "picture"}),
        "/raw?" + urlencode({"node": last, "name": "notes"}),
        "/curves?" + urlencode({"l": lineage, "key": "val/loss"}),
        "/slider?" + urlencode({"l": lineage, "name": "picture"}),
        "/compare?" + urlencode({"a": nodes["base5"].serialize(), "b": tune.serialize()}),
        "/slider",
        "/compare",
        "/curves?" + urlencode({"key": "val/loss", "log": "1", "smooth": "0.5"}),
        "/slider?" + urlencode({"l": lineage, "name": "picture", "version": 1}),
        "/api/frames?" + urlencode({"l": lineage, "name": "picture", "version": 1}),
        "/api/runs",
        "/api/lineage?" + urlencode({"l": lineage}),
        "/api/series?" + urlencode({"l": lineage, "key": "val/loss"}),
        "/api/frames?" + urlencode({"l": lineage, "name": "picture"}),
        "/static/app.js",
        "/static/app.css",
    ]


def test_every_page_answers_200_with_the_csp(client: TestClient, built) -> None:
    for url in _pages(built[1]):
        response = client.get(url)
        assert response.status_code == 200, (url, response.text[:300])
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-content-type-options"] == "nosniff"
    assert "default-src 'self'" in CSP and "unsafe-inline" not in CSP


def test_pages_have_no_inline_script_or_style(client: TestClient, built) -> None:
    for url in _pages(built[1]):
        response = client.get(url)
        if not response.headers["content-type"].startswith("text/html"):
            continue
        html = response.text
        for tag in re.findall(r"<script\b[^>]*>", html):
            assert 'src="/static/' in tag, (url, tag)
        tags = re.findall(r"<[a-zA-Z][^>]*>", html)  # the markup's own tags, not escaped text
        assert not [
            t for t in tags if t.startswith("<style") or re.search(r"\s(style|on\w+)=", t)
        ], url


def test_hostile_text_is_escaped_everywhere(client: TestClient, built) -> None:
    nodes = built[1]
    last = nodes["base11"].serialize()
    urls = [
        f"/node/{last}",
        "/artifact?" + urlencode({"node": last, "name": HOSTILE}),
        "/artifact?" + urlencode({"node": last, "name": "metrics"}),
        "/compare?" + urlencode({"a": nodes["base0"].serialize(), "b": last}),
    ]
    for url in urls:
        html = client.get(url).text
        assert HOSTILE not in html and HOSTILE_IMG not in html, url
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, url


def test_traversal_and_unknown_names_are_404(client: TestClient, built) -> None:
    last = built[1]["base11"].serialize()
    attempts = [
        "/static/../_app.py",
        "/static/..%2f_app.py",
        "/static/%2e%2e%2f%2e%2e%2fpyproject.toml",
        "/static/%2e%2e/_store.py",
        "/static/app.js%00",
        "/static/_app.py",
        "/raw?" + urlencode({"node": last, "name": "../../store.sqlite"}),
        "/raw?" + urlencode({"node": last, "name": "/etc/passwd"}),
        "/raw?" + urlencode({"node": "../../etc~passwd~0", "name": "notes"}),
        "/raw?" + urlencode({"node": last, "name": "%2e%2e%2fstore.sqlite"}),
        "/raw?" + urlencode({"node": last, "name": "notes", "version": 9}),
        "/png?" + urlencode({"node": last, "name": "notes"}),
        "/node/..%2f..%2fstore.sqlite",
        "/node/lm.base.train~00000000~0",
        "/lineage/..%2f..",
        "/lineage/lm.base.train~00000000",
        "/api/series?" + urlencode({"l": "../x", "key": "val/loss"}),
    ]
    for url in attempts:
        response = client.get(url)
        assert response.status_code == 404, (url, response.status_code)
        assert response.headers["content-security-policy"] == CSP


def test_pages_show_what_the_store_holds(client: TestClient, built) -> None:
    root, nodes = built
    with Store(root, readonly=True) as store:
        runs = store.runs()
        last = nodes["base11"]
        values = store.values(last)
        history = store.history(last, "metrics")
    html = client.get("/").text
    for run in runs:
        assert run["nonce"] in html
    listed = {r["lineage"]: r for r in client.get("/api/runs").json()["rows"]}
    assert {
        f"{r['name']}~{r['nonce']}": (r["nodes"], r["last_seq"], r["checkpoints"], r["artifacts"])
        for r in runs
    } == {
        k: (r["nodes"], r["last_seq"], r["checkpoints"], r["artifacts"]) for k, r in listed.items()
    }
    node_html = client.get(f"/node/{last.serialize()}").text
    assert "gpt/train/pretrain" in node_html and "step" in node_html
    for key in values:
        assert key in node_html
    assert [f"v{a.version} metrics.json" in node_html for a in history] == [True, True]
    tree = client.get(f"/lineage/{nodes['tune0'].name}~{nodes['tune0'].nonce}").text
    assert nodes["base5"].serialize() in tree  # where the branch left its parent
    assert "branch" in tree and "fresh" in tree and "resumed at seq 6" in tree
    assert re.findall(r'title="seq (\d+) · checkpoint', tree) == ["5", "11"]
    running = client.get("/?status=running").text
    assert "tune" in running and ">train<" not in running
    assert client.get("/api/runs?q=tune").json()["total"] == 1
    json_page = client.get("/artifact?" + urlencode({"node": last.serialize(), "name": "metrics"}))
    assert "nested" in json_page.text and "[1.5, 1.25]" in json_page.text
    assert (
        "plain text\nsecond line"
        in client.get("/artifact?" + urlencode({"node": last.serialize(), "name": "notes"})).text
    )
    raw = client.get("/raw?" + urlencode({"node": last.serialize(), "name": "notes"}))
    assert raw.content == b"plain text\nsecond line\n"
    assert raw.headers["content-disposition"].startswith("attachment")


def test_runs_are_paginated_on_the_server(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with Store(root) as store, store.batch():
        for i in range(120):
            store.log(Node.new(f"r{i:03d}"), {"val/loss": float(i)})
    with Store(root, readonly=True) as store, TestClient(create_app(store)) as client:
        first = client.get("/").text
        third = client.get("/?page=3").text
        assert first.count("<tr data-lineage=") == 50 and third.count("<tr data-lineage=") == 20
        assert "r119" in first and "r000" not in first and "r000" in third  # newest first
        assert "page 1 of 3" in first


def test_pdf_is_rendered_as_a_picture(client: TestClient, built) -> None:
    image_module = pytest.importorskip("PIL.Image")
    node = built[1]["base0"].serialize()
    response = client.get("/png?" + urlencode({"node": node, "name": "picture"}))
    assert response.headers["content-type"] == "image/png"
    image = image_module.open(io.BytesIO(response.content)).convert("RGB")
    width, height = image.size
    assert (width, height) == (1400, 700)  # 200 x 100 points, longer side 1400 px
    scale = width / 200
    # The rectangle spans x 20..80, y 20..80 (PDF y counts from the bottom).
    inside = image.getpixel((int(50 * scale), int((100 - 50) * scale)))
    outside = image.getpixel((int(150 * scale), int((100 - 50) * scale)))
    assert inside == (255, 0, 0) and outside == (255, 255, 255)


def test_series_is_stitched_through_the_branch_point(built) -> None:
    root, nodes = built
    tune = nodes["tune0"]
    with Store(root, readonly=True) as store:
        points = stitched_series(store, tune.name, tune.nonce, "val/loss")
        expected = [(seq, store.values(nodes[f"base{seq}"])["val/loss"]) for seq in range(6)]
        expected += [(6 + s, store.values(nodes[f"tune{s}"])["val/loss"]) for s in range(4)]
    assert [(x, v) for x, v, _ in points] == expected
    assert points[5][2] == nodes["base5"].serialize() and points[6][2] == tune.serialize()


@pytest.mark.parametrize("n, cap", [(10, 2000), (2001, 2000), (50_000, 2000), (9_999, 64), (7, 4)])
def test_downsampling_keeps_ends_and_each_buckets_extremes(n: int, cap: int) -> None:
    rng = np.random.default_rng(n)
    y = np.cumsum(rng.normal(size=n))
    y[rng.integers(0, n, size=5)] += rng.choice([-50.0, 50.0], size=5)  # spikes
    points = [(i, float(v)) for i, v in enumerate(y)]
    kept = downsample(points, cap)
    assert len(kept) <= cap
    if n <= cap:
        assert kept == points
        return
    assert kept[0] == points[0] and kept[-1] == points[-1]
    xs = [p[0] for p in kept]
    assert xs == sorted(set(xs))
    buckets = (cap - 2) // 2
    edges = 1 + (np.arange(buckets + 1) * (n - 2)) // buckets
    reference = {0, n - 1}
    for lo, hi in itertools.pairwise(edges):
        if hi > lo:
            reference |= {lo + int(np.argmin(y[lo:hi])), lo + int(np.argmax(y[lo:hi]))}
    assert set(xs) == reference
    assert max(p[1] for p in kept) == y.max() and min(p[1] for p in kept) == y.min()


def test_series_endpoint_caps_points(tmp_path: Path) -> None:
    root = tmp_path / "store"
    node = Node.new("long")
    with Store(root) as store, store.batch():
        for seq in range(5000):
            store.log(node, {"val/loss": float(np.sin(seq / 50.0))})
            node = node.next()
    with Store(root, readonly=True) as store, TestClient(create_app(store)) as client:
        lineage = f"{node.name}~{node.nonce}"
        data = client.get("/api/series?" + urlencode({"l": lineage, "key": "val/loss"})).json()
    (series,) = data["series"]
    assert series["total"] == 5000 and len(series["x"]) <= 2000
    assert series["x"][0] == 0 and series["x"][-1] == 4999


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_visiting_every_page_leaves_the_store_unchanged(tmp_path: Path) -> None:
    root = tmp_path / "store"
    nodes = build(root)
    before = _hashes(root)
    store = open_readonly(root)
    with TestClient(create_app(store)) as client:
        for url in _pages(nodes):
            assert client.get(url).status_code == 200
    store.close()
    after = _hashes(root)
    # SQLite's read-only connection may create the (empty) write-ahead log and the
    # shared-memory index beside a WAL database; no byte of any other file changes.
    extra = set(after) - set(before)
    assert extra <= {"store.sqlite-wal", "store.sqlite-shm"}
    if "store.sqlite-wal" in extra:
        assert (root / "store.sqlite-wal").stat().st_size == 0
    assert {k: after[k] for k in before} == before


def test_running_serves_on_a_free_loopback_port_until_the_block_ends(built) -> None:
    import urllib.error
    import urllib.request

    root, nodes = built
    with running(root) as url:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url), url
        with urllib.request.urlopen(url + "/", timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Security-Policy"] == CSP
            assert nodes["base0"].name.split(".")[-1] in response.read().decode()
    with pytest.raises(urllib.error.URLError):  # stopped: nothing listens there any more
        urllib.request.urlopen(url + "/", timeout=2)
    with pytest.raises(NotAStoreError), running(root / "nowhere"):
        pass


def test_the_readonly_store_refuses_writes(built) -> None:
    with Store(built[0], readonly=True) as store, pytest.raises(StorePermissionError):
        store.log(Node.new("x"), {"a": 1})


def test_a_theseus_root_or_its_store_folder(built) -> None:
    root = built[0]
    assert store_folder(root.parent) == root and store_folder(root) == root


def test_unreadable_stores_are_errors_at_open(tmp_path: Path) -> None:
    with pytest.raises(NotAStoreError, match="does not exist"):
        open_readonly(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("x")
    with pytest.raises(NotAStoreError, match="holds no store"):
        open_readonly(tmp_path / "plain")
    newer = tmp_path / "newer"
    Store(newer).close()
    (newer / "theseus-store.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(CorruptStoreError, match="format 99"):
        open_readonly(newer)


@pytest.mark.parametrize("case", ["missing", "plain", "newer", "damaged"])
def test_the_command_fails_in_one_line_with_status_2(tmp_path: Path, case: str) -> None:
    target = tmp_path / case
    if case == "plain":
        target.mkdir()
        (target / "notes.txt").write_text("x")
    elif case == "newer":
        Store(target).close()
        (target / "theseus-store.json").write_text(json.dumps({"format": 99}))
    elif case == "damaged":
        Store(target).close()
        (target / "store.sqlite").write_bytes(b"this is not sqlite" * 10)
    result = subprocess.run(
        [sys.executable, "-m", "theseus.store.cli", "ui", str(target), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("theseus-store: error: "), result.stderr
    assert "Traceback" not in result.stderr


def test_another_host_warns_that_the_store_becomes_visible(built) -> None:
    # Binding is not needed to see the warning: a port already in use stops uvicorn after it.
    code = (
        "import sys; from theseus.store.ui import serve; import socket;"
        "s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen(); port = s.getsockname()[1];"
        f"serve({str(built[0])!r}, host='0.0.0.0', port=port)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert "warning: serving on 0.0.0.0" in result.stderr
    assert "readable by anyone" in result.stderr


def test_unknown_host_header_is_refused(built) -> None:
    with Store(built[0], readonly=True) as store:
        app = create_app(store, allowed_hosts=["127.0.0.1", "localhost"])
        with TestClient(app, base_url="http://evil.example") as client:
            assert client.get("/").status_code == 400
        with TestClient(app, base_url="http://127.0.0.1:8765") as client:
            assert client.get("/").status_code == 200


def test_a_long_lineage_shows_its_landmarks_only(tmp_path: Path) -> None:
    root = tmp_path / "store"
    node = Node.new("long")
    saved = {99, 500, 873}
    with Store(root) as store, store.batch():
        for seq in range(1000):
            store.log(node, {"val/loss": 1.0})
            if seq in saved:
                folder = tmp_path / f"ckpt{seq}"
                folder.mkdir()
                store.checkpoint(node, folder)
            node = node.next() if seq < 999 else node
    with Store(root, readonly=True) as store, TestClient(create_app(store)) as client:
        html = client.get(f"/lineage/{node.name}~{node.nonce}").text
    shown = [int(s) for s in re.findall(r'title="seq (\d+)', html)]
    assert shown == [0, 1, 2, 3, 4, 99, 500, 873, 995, 996, 997, 998, 999]
    assert re.findall(r'title="seq (\d+) · checkpoint', html) == ["99", "500", "873"]
    assert html.count('class="gap"') == 4  # between 4 and 99, 99 and 500, 500 and 873, 873 and 995
