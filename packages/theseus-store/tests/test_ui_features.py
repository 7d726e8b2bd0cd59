"""The features page (``/features``): an SAE's features along a lineage, a feature followed.

The store (``_ui_store.build_features``) holds one lineage whose nodes at seqs 1, 3, 5, 7
hold an SAE's features.json, matched by ``_ui_store.SAE_MATCHES``, beside the values
``sae/...``; a second SAE whose features.json is not JSON at seq 3 and another format at
seq 5; and a lineage without any. References: the matches the test wrote, walked here
one step at a time (forward: the feature whose match is the one followed; back: its own
match; else the index kept), for every start, feature and target; the token texts the
test wrote, escaped by the standard library's ``html.escape``. Last, the page in Debian's
Chromium (Playwright, as ``test_ui_browser.py``): the arrow keys and a jump of the slider
follow a feature, and a screenshot of each view.
"""

from __future__ import annotations

import doctest
import html
import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

pytest.importorskip("starlette", reason="the ui extra is not installed (theseus-store[ui])")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")

import _ui_store
from starlette.testclient import TestClient

from theseus.store import Node
from theseus.store.ui import CSP, create_app, open_readonly, running
from theseus.store.ui import _features as features_module
from theseus.store.ui._features import FeaturesError, contexts, parse, visible

SAE = _ui_store.SAE + "/features.json"
BROKEN = "features/blocks_0/mlp/8/features.json"
MATCHES = _ui_store.SAE_MATCHES


@pytest.fixture(scope="module")
def sae(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Node]]:
    root = tmp_path_factory.mktemp("sae") / "store"
    return root, _ui_store.build_features(root)


@pytest.fixture(scope="module")
def client(sae: tuple[Path, dict[str, Node]]):
    store = open_readonly(sae[0])
    with TestClient(create_app(store, allowed_hosts=["testserver"])) as c:
        yield c
    store.close()


def _lineage(node: Node) -> str:
    return f"{node.name}~{node.nonce}"


def _url(nodes: dict[str, Node], **query: object) -> str:
    return "/features?" + urlencode({"l": _lineage(nodes["sae0"]), "name": SAE, **query})


def _view(page: str) -> dict[str, str]:
    """The data attributes of the page's ``#view`` (the node and feature it shows)."""
    tag = re.search(r'<div id="view"([^>]*)>', page)
    assert tag is not None, page[:500]
    return {k: html.unescape(v) for k, v in re.findall(r'data-([a-z]+)="([^"]*)"', tag[1])}


def _error(page: str) -> str:
    found = re.search(r'<p class="error">(.*?)</p>', page, re.S)
    assert found is not None, page[:500]
    assert "\n" not in found[1].strip(), found[1]
    return html.unescape(found[1])


def _reference(start: int, index: int, end: int) -> tuple[int, list[str]]:
    """Feature ``index`` of SAE ``start`` walked to SAE ``end`` over MATCHES, and what
    happened at each step (``matched``, ``gone``, ``born``)."""
    hows = []
    k = start
    while k != end:
        if end > k:
            found = [j for j, i in MATCHES[k + 1].items() if i == index]
            hows.append("matched" if found else "gone")
            index = found[0] if found else index
            k += 1
        else:
            match = MATCHES[k][index]
            hows.append("born" if match is None else "matched")
            index = index if match is None else match
            k -= 1
    return index, hows


# -- the picker and the links to the page ------------------------------------------------------


def test_the_picker_lists_the_lineages_that_hold_features(client: TestClient, sae) -> None:
    _, nodes = sae
    page = client.get("/features")
    assert page.status_code == 200
    rows = re.findall(r"<tr>(.*?)</tr>", page.text.split("<tbody>")[1], re.S)
    assert len(rows) == 1 and _lineage(nodes["sae0"]) in rows[0]
    assert _lineage(nodes["plain"]) not in page.text
    links = re.findall(r'<a class="mono sae" href="([^"]+)">([^<]+)</a>', rows[0])
    assert [name for _, name in links] == sorted([SAE, BROKEN])
    for href, name in links:
        query = parse_qs(urlsplit(html.unescape(href)).query)
        assert query == {"l": [_lineage(nodes["sae0"])], "name": [name]}
        assert client.get(html.unescape(href)).status_code == 200


def test_the_node_artifact_slider_lineage_pages_and_header_link_it(client: TestClient, sae) -> None:
    _, nodes = sae
    node = nodes["sae1"]
    lineage = _lineage(node)
    wanted = "/features?" + urlencode({"l": lineage, "name": SAE, "node": node.serialize()})
    node_page = client.get(f"/node/{node.serialize()}").text
    assert f'href="{html.escape(wanted)}">browse features</a>' in node_page
    artifact = client.get("/artifact?" + urlencode({"node": node.serialize(), "name": SAE})).text
    assert f'href="{html.escape(wanted)}">browse features</a>' in artifact
    slider = client.get("/slider?" + urlencode({"l": lineage, "name": SAE})).text
    bare = "/features?" + urlencode({"l": lineage, "name": SAE})
    assert f'href="{html.escape(bare)}">browse features</a>' in slider
    assert (
        f'href="{html.escape(bare)}">features: {SAE}</a>' in client.get(f"/lineage/{lineage}").text
    )
    assert '<a href="/features">features</a>' in client.get("/").text
    # an artifact of another name gets no such link
    plain = nodes["plain"].serialize()
    notes = client.get("/artifact?" + urlencode({"node": plain, "name": "notes"})).text
    assert "browse features" not in notes
    assert "browse features" not in client.get(f"/node/{plain}").text


# -- what the page shows --------------------------------------------------------------------------


def test_every_features_page_answers_with_the_csp_and_no_inline_code(client: TestClient, sae):
    _, nodes = sae
    urls = [
        "/features",
        _url(nodes),
        _url(nodes, node=nodes["sae2"].serialize(), feature=7),
        _url(nodes, node=nodes["sae3"].serialize(), feature=1, **{"from": nodes["sae0"].serialize()}),
        "/features?" + urlencode({"l": _lineage(nodes["sae0"]), "name": BROKEN}),
        "/features?" + urlencode({"l": _lineage(nodes["sae0"]), "name": BROKEN, "node": nodes["sae1"].serialize()}),
    ]  # fmt: skip
    for url in urls:
        got = client.get(url)
        assert got.status_code == 200, (url, got.text[:300])
        assert got.headers["content-security-policy"] == CSP
        for tag in re.findall(r"<script\b[^>]*>", got.text):
            assert 'src="/static/' in tag, (url, tag)
        tags = re.findall(r"<[a-zA-Z][^>]*>", got.text)
        assert not [t for t in tags if t.startswith("<style") or re.search(r"\s(style|on\w+)=", t)]


def test_the_defaults_are_the_last_node_and_its_densest_feature(client: TestClient, sae) -> None:
    _, nodes = sae
    shown = _view(client.get(_url(nodes)).text)
    assert shown["node"] == nodes["sae3"].serialize()
    assert shown["feature"] == "0"  # density 0.4 / (1 + index): #0 is the densest
    assert shown["index"] == "3"
    assert shown["info"].startswith(f"4/4 · {nodes['sae3'].serialize()} · seq 7 · step 700")


def test_the_measures_are_the_documents_and_link_their_curves(client: TestClient, sae) -> None:
    _, nodes = sae
    node = nodes["sae1"]
    page = client.get(_url(nodes, node=node.serialize(), feature=3)).text
    measures = re.search(r'<table class="kv measures">(.*?)</table>', page, re.S)
    assert measures is not None
    rows = re.findall(
        r'<th><a href="([^"]+)"[^>]*>([^<]+)</a></th><td class="num">([^<]+)</td>', measures[1]
    )
    doc = _ui_store.features_doc(node, nodes["sae0"], MATCHES[1])
    assert [name for _, name, _ in rows] == list(doc["measures"])  # the known ones, in order
    assert [name for _, name, _ in rows][:7] == [
        "l0",
        "fvu",
        "dead",
        "loss_recovered",
        "matched",
        "born",
        "gone",
    ]
    for href, name, value in rows:
        assert float(value) == pytest.approx(doc["measures"][name], rel=1e-5)
        query = parse_qs(urlsplit(html.unescape(href)).query)
        assert query == {"l": [_lineage(node)], "key": [f"sae/{_ui_store.SAE}/{name}"]}
        assert client.get(html.unescape(href)).status_code == 200  # the curves page knows it
    assert "(1: no match in the previous SAE)" in page  # born here: #2
    first = client.get(_url(nodes, node=nodes["sae0"].serialize(), feature=1)).text
    assert "The chain's first SAE: no previous one to match." in first
    assert "matched" not in re.search(r'<table class="kv measures">(.*?)</table>', first, re.S)[1]


def test_the_feature_shows_its_numbers_story_and_densest_list(client: TestClient, sae) -> None:
    _, nodes = sae
    node = nodes["sae1"]
    page = client.get(_url(nodes, node=node.serialize(), feature=3)).text
    doc = _ui_store.features_doc(node, nodes["sae0"], MATCHES[1])
    feature = doc["features"][3]
    assert (
        f'Feature #3 <span class="muted">density {feature["density"]:.6g} · max {feature["max"]:.6g}'
        in page
    )
    previous = _url(nodes, node=nodes["sae0"].serialize(), feature=1)
    assert (
        f'Matched to <a href="{html.escape(previous)}">#1</a> at cosine {feature["cosine"]:.6g}'
        in page
    )
    chips = re.findall(r'<a class="chip( current)?" href="[^"]+">#(\d+) <span', page)
    by_density = sorted(range(8), key=lambda i: (-doc["features"][i]["density"], i))
    assert [int(i) for _, i in chips] == by_density
    assert [i for current, i in chips if current] == ["3"]
    born = client.get(_url(nodes, node=node.serialize(), feature=2)).text
    assert "<b>Born here</b>: no match in the previous SAE." in born
    dead = client.get(_url(nodes, node=node.serialize(), feature=7)).text
    assert "Never active on the inspection batch: no contexts." in dead


def test_tokens_are_escaped_shaded_and_their_whitespace_visible(client: TestClient, sae) -> None:
    _, nodes = sae
    node = nodes["sae2"]
    page = client.get(_url(nodes, node=node.serialize(), feature=0)).text
    assert _ui_store.HOSTILE not in page and "<b>" not in page.replace("<b>Born", "")
    rows = re.findall(r'<div class="ctx">(.*?)</div>', page, re.S)
    doc = _ui_store.features_doc(node, nodes["sae1"], MATCHES[2])
    top = doc["features"][0]["top"]
    assert len(rows) == len(top) == 3
    for row, context in zip(rows, top, strict=True):
        spans = re.findall(
            r'<span class="tok lv(\d+)( at)?( blank)?" title="([^"]*)">([^<]*)</span>', row
        )
        assert len(spans) == len(context["tokens"]) == 16
        peak = doc["features"][0]["max"]
        for k, (level, at, blank, title, shown) in enumerate(spans):
            text, value = context["tokens"][k], context["activations"][k]
            expected = "∅" if text == "" else text.replace("\n", "⏎").replace("\t", "⇥")
            if text.strip() == "":
                expected = expected.replace(" ", "·")
            assert html.unescape(shown) == expected, (k, text)
            assert not set(shown) & set("<>\"'"), (k, shown)  # escaped, all four
            assert bool(blank) == (text.strip() == "")
            assert bool(at) == (k == context["at"])
            assert int(level) == (0 if value <= 0 else max(1, min(10, round(10 * value / peak))))
            assert html.unescape(title) == f"{json.dumps(text, ensure_ascii=False)} {value:.4g}"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


# -- following a feature -----------------------------------------------------------------------


@pytest.mark.parametrize("start", range(4))
def test_following_a_feature_matches_the_walk_over_the_matches(
    client: TestClient, sae, start: int
) -> None:
    """Every feature of SAE ``start`` followed to every SAE: the page shows the feature the
    walk over the matches reaches, and tells each step."""
    _, nodes = sae
    origin = nodes[f"sae{start}"].serialize()
    for index in range(8):
        for end in range(4):
            url = _url(
                nodes, node=nodes[f"sae{end}"].serialize(), feature=index, **{"from": origin}
            )
            page = client.get(url).text
            reached, hows = _reference(start, index, end)
            shown = _view(page)
            assert shown["feature"] == str(reached), (start, index, end)
            assert shown["node"] == nodes[f"sae{end}"].serialize()
            told = re.findall(r'<li class="how-(\w+)">', page)
            assert told == hows, (start, index, end)
            canonical = parse_qs(urlsplit(shown["canonical"]).query)
            assert canonical["feature"] == [str(reached)] and "from" not in canonical


def test_the_steps_are_told_and_the_neighbour_links_name_their_target(client: TestClient, sae):
    _, nodes = sae
    seq1, seq3 = nodes["sae0"].serialize(), nodes["sae1"].serialize()
    page = client.get(_url(nodes, node=seq3, feature=1, **{"from": seq1})).text
    assert "#1 at seq 1 → #3 at seq 3 (matched at cosine 0.96)." in page
    gone = client.get(_url(nodes, node=seq3, feature=5, **{"from": seq1})).text
    assert (
        "#5 at seq 1 is gone at seq 3: no feature there matches it; #5 shown at seq 3 is another "
        "feature that has the same index." in html.unescape(gone)
    )
    assert _view(gone)["feature"] == "5"
    born = client.get(_url(nodes, node=seq1, feature=2, **{"from": seq3})).text
    assert "#2 at seq 3 was born there: it has no match at seq 1" in html.unescape(born)
    # the links to the neighbours: the feature each reaches, or what happens to it
    first = client.get(_url(nodes, node=seq1, feature=5)).text
    assert re.search(r'<a id="step-next" href="[^"]+">seq 3: gone, #5 kept →</a>', first)
    assert "← the first node" in first and 'id="step-prev"' not in first
    middle = client.get(_url(nodes, node=seq3, feature=3)).text
    assert re.search(r'<a id="step-prev" href="[^"]+">← seq 1: #1</a>', middle)
    assert re.search(r'<a id="step-next" href="[^"]+">seq 5: #0 →</a>', middle)
    href = re.search(r'<a id="step-next" href="([^"]+)"', middle)[1]
    assert _view(client.get(html.unescape(href)).text)["feature"] == "0"


def test_a_long_jump_tells_the_last_steps(client: TestClient, sae) -> None:
    _, nodes = sae
    url = _url(
        nodes, node=nodes["sae3"].serialize(), feature=1, **{"from": nodes["sae0"].serialize()}
    )
    page = html.unescape(client.get(url).text)
    assert re.findall(r"#\d+ at seq \d → #\d+ at seq \d", page) == [
        "#1 at seq 1 → #3 at seq 3",
        "#3 at seq 3 → #0 at seq 5",
        "#0 at seq 5 → #6 at seq 7",
    ]


# -- errors ----------------------------------------------------------------------------------


def test_bad_parameters_are_one_line_naming_the_choices(client: TestClient, sae) -> None:
    _, nodes = sae
    lineage = _lineage(nodes["sae0"])
    seq1 = nodes["sae0"].serialize()
    cases = [
        ({"l": "lm.sae.nope~abcdef", "name": SAE}, 404, ["lm.sae.nope~abcdef", lineage]),
        ({"l": "nosuch", "name": SAE}, 404, ["project.group.run~nonce"]),
        ({"l": _lineage(nodes["plain"])}, 404, ["holds no SAE features", f"'{lineage}'"]),
        ({"l": lineage, "name": "picture"}, 404, ["no features artifact 'picture'", f"'{SAE}'", f"'{BROKEN}'"]),
        ({"l": lineage, "name": SAE, "node": nodes["seq0"].serialize()}, 404, [f"'{seq1}'", "4 nodes do"]),
        ({"l": lineage, "name": SAE, "node": "a.b~c"}, 404, ["project.group.run~nonce~seq"]),
        ({"l": lineage, "name": SAE, "from": nodes["seq2"].serialize()}, 404, ["from: node", f"'{seq1}'"]),
        ({"l": lineage, "name": SAE, "feature": "x"}, 400, ["feature must be a whole number", "'x'"]),
        ({"l": lineage, "name": SAE, "feature": "1.5"}, 400, ["feature must be a whole number"]),
        ({"l": lineage, "name": SAE, "feature": "8"}, 404, ["has features 0 to 7; not 8"]),
        ({"l": lineage, "name": SAE, "feature": "-1"}, 404, ["has features 0 to 7; not -1"]),
    ]  # fmt: skip
    for query, code, words in cases:
        got = client.get("/features?" + urlencode(query))
        assert got.status_code == code, (query, got.status_code, got.text[:300])
        line = _error(got.text)
        for word in words:
            assert word in line, (query, word, line)


def test_a_broken_features_json_is_shown_on_the_page_never_a_500(client: TestClient, sae) -> None:
    _, nodes = sae
    lineage = _lineage(nodes["sae0"])

    def get(node: str, **query: object):
        return client.get(
            "/features?" + urlencode({"l": lineage, "name": BROKEN, "node": node, **query})
        )

    seq1, seq3, seq5, seq7 = (nodes[f"sae{k}"].serialize() for k in range(4))
    not_json = get(seq3, feature=2)
    assert not_json.status_code == 200
    assert "The features.json at seq 3 (v1) cannot be shown: it is not UTF-8 JSON" in _error(
        not_json.text
    )
    other = get(seq5)
    assert other.status_code == 200
    assert "its format is 'x/2', not 'theseus-sae-features/1'" in _error(other.text)
    # a step over a broken node keeps the index and says why
    over = get(seq3, feature=4, **{"from": seq1})
    assert over.status_code == 200 and _view(over.text)["feature"] == "4"
    assert "The features.json at seq 3 cannot be read (it is not UTF-8 JSON" in html.unescape(
        over.text
    )
    assert _view(get(seq7, feature=4, **{"from": seq1}).text)["feature"] == "4"
    # the readable nodes of that artifact show (the chain's first SAE each: no previous)
    assert "The chain's first SAE: no previous one to match." in get(seq7, feature=0).text


BASE = {
    "format": "theseus-sae-features/1",
    "previous": None,
    "measures": {"l0": 1.0},
    "features": [
        {"index": 0, "density": 0.5, "max": 2.0, "previous": None, "cosine": None, "top": []}
    ],
}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"format": "theseus-sae-features/2"}, "its format is 'theseus-sae-features/2'"),
        ({"features": {}}, "'features' is not a list"),
        ({"measures": {"l0": "high"}}, "'measures' is not an object of numbers"),
        ({"previous": 3}, "'previous' is 3, not a node"),
        ({"width": 2}, "'width' is 2 but 'features' holds 1"),
        ({"features": [{"index": 1}]}, "feature 0 has index 1"),
        ({"features": [{"index": 0, "density": None, "max": 1}]}, "feature 0's 'density' is None"),
        ({"features": [{"index": 0, "density": 1, "max": True}]}, "feature 0's 'max' is True"),
        ({"features": [{"index": 0, "density": 1, "max": 1, "previous": -1}]}, "'previous' is -1"),
        ({"features": [{"index": 0, "density": 1, "max": 1, "cosine": "x"}]}, "'cosine' is 'x'"),
    ],
)
def test_parse_refuses_what_is_not_the_format_in_one_line(change: dict, words: str) -> None:
    with pytest.raises(FeaturesError) as caught:
        parse(json.dumps({**BASE, **change}).encode())
    assert words in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("content", [b"\xff\xfe", b"[1, 2]", b"", b"{", b"null"])
def test_parse_refuses_what_is_not_a_json_object(content: bytes) -> None:
    with pytest.raises(FeaturesError) as caught:
        parse(content)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("top", "words"),
    [
        ({}, "'top' is not a list"),
        ([3], "context 0 is not an object"),
        ([{"tokens": "ab", "activations": [], "at": 0, "activation": 1}], "'tokens' is not a list"),
        ([{"tokens": ["a"], "activations": [1, 2], "at": 0, "activation": 1}], "not one number per token"),
        ([{"tokens": ["a"], "activations": [1], "at": 1, "activation": 1}], "'at' is 1"),
        ([{"tokens": ["a"], "activations": [1], "at": 0}], "'activation' is None"),
    ],
)  # fmt: skip
def test_contexts_refuse_what_is_not_the_format(top: object, words: str) -> None:
    doc = parse(json.dumps({**BASE, "features": [{**BASE["features"][0], "top": top}]}).encode())
    with pytest.raises(FeaturesError, match=re.escape(words)):
        contexts(doc, 0)


def test_a_context_not_in_the_format_is_shown_on_the_page(tmp_path: Path) -> None:
    root = tmp_path / "store"
    from theseus.store import Store

    node = Node.new("bad", project="lm", group="sae")
    doc = _ui_store.features_doc(node, None, {})
    doc["features"][0]["top"][0]["at"] = 99
    with Store(root) as store:
        store.put(node, SAE, "features.json", json.dumps(doc).encode())
    with open_readonly(root) as store, TestClient(create_app(store)) as c:
        got = c.get("/features?" + urlencode({"l": _lineage(node), "name": SAE, "feature": 0}))
        assert got.status_code == 200
        assert (
            "Its top contexts cannot be shown: feature 0&#39;s context 0&#39;s &#39;at&#39; is 99"
            in got.text
        )
        assert (
            c.get(
                "/features?" + urlencode({"l": _lineage(node), "name": SAE, "feature": 1})
            ).status_code
            == 200
        )


def test_visible_shows_every_control_character_and_its_doctests_run() -> None:
    assert visible("a\x00b\x1b") == ("a␀b␛", False)
    assert visible("\r\n") == ("␍⏎", True)
    assert visible("\x7f") == ("␡", False)
    assert visible("<\"'&>") == ("<\"'&>", False)  # escaping is the template's
    result = doctest.testmod(features_module)
    assert result.attempted > 0 and result.failed == 0


# -- in a real browser ---------------------------------------------------------------------------


_chromium = _ui_store.chromium


def test_the_arrow_keys_and_the_slider_follow_a_feature_in_chromium(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    executable = _chromium()
    expect = sync_api.expect
    shots = Path(os.environ.get("THESEUS_UI_SCREENSHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    root = tmp_path / "store"
    nodes = _ui_store.build_features(root)
    problems: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-gpu"]
        )
        tab = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        tab.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
        tab.on(
            "console",
            lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
        )
        tab.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        with running(root) as url:
            tab.goto(url + "/")
            tab.locator("header").get_by_role("link", name="features").click()
            expect(tab.locator("h1")).to_have_text("Features")
            tab.screenshot(path=shots / "features-1-picker.png", full_page=True)
            tab.get_by_role("link", name=SAE).click()
            title, info = tab.locator("#feature-title"), tab.locator("#frame-info")
            expect(info).to_contain_text("4/4 · ")
            tab.goto(url + _url(nodes, node=nodes["sae0"].serialize(), feature=1))
            expect(title).to_contain_text("Feature #1")
            expect(tab.locator(".ctx").first).to_contain_text(_ui_store.HOSTILE)  # text, not markup
            tab.screenshot(path=shots / "features-2-seq1.png", full_page=True)
            for reached, frame in ((3, "2/4"), (0, "3/4"), (6, "4/4")):
                tab.keyboard.press("ArrowRight")
                expect(title).to_contain_text(f"Feature #{reached} ")
                expect(info).to_contain_text(f"{frame} · ")
            expect(tab.locator("#story")).to_contain_text("Matched to #0 at cosine")
            expect(tab.locator(".trail")).to_contain_text("#0 at seq 5 → #6 at seq 7")
            assert parse_qs(urlsplit(tab.url).query)["feature"] == ["6"]  # the address follows
            assert tab.locator("#frame").input_value() == "3"
            tab.screenshot(path=shots / "features-3-followed.png", full_page=True)
            tab.keyboard.press("ArrowLeft")
            tab.keyboard.press("ArrowLeft")  # two at once: the second starts where the first ends
            expect(title).to_contain_text("Feature #3 ")
            expect(info).to_contain_text("2/4 · ")
            # a feature that is gone at the next node: kept, and said
            tab.goto(url + _url(nodes, node=nodes["sae0"].serialize(), feature=5))
            expect(tab.locator("#step-next")).to_have_text("seq 3: gone, #5 kept →")
            tab.keyboard.press("ArrowRight")
            expect(tab.locator(".trail")).to_contain_text("#5 at seq 1 is gone at seq 3")
            expect(title).to_contain_text("Feature #5 ")
            tab.screenshot(path=shots / "features-4-gone.png", full_page=True)
            # a jump of the slider follows the feature node by node, also when it comes
            # before the page has its list of frames (held back here: a loaded machine)
            held: list[Any] = []
            tab.route("**/api/frames?*", lambda route: held.append(route))
            tab.goto(url + _url(nodes, node=nodes["sae0"].serialize(), feature=1))
            expect(title).to_contain_text("Feature #1 ")
            tab.locator("#frame").evaluate(
                "(el) => { el.max = '3'; el.value = '3'; el.dispatchEvent(new Event('change')); }"
            )
            tab.wait_for_timeout(300)
            expect(title).to_contain_text("Feature #1 ")  # nothing to jump to yet
            assert held, "the page asked for its frames"
            for route in list(held):  # the frames arrive now
                route.continue_()
            tab.unroute("**/api/frames?*")
            expect(title).to_contain_text("Feature #6 ")
            expect(tab.locator(".trail li")).to_have_count(3)
            # the other SAE's unreadable features.json: said on the page
            broken = {
                "l": _lineage(nodes["sae0"]),
                "name": BROKEN,
                "node": nodes["sae1"].serialize(),
            }
            tab.goto(url + "/features?" + urlencode(broken))
            expect(tab.locator("#view .error")).to_contain_text("it is not UTF-8 JSON")
            tab.screenshot(path=shots / "features-5-broken.png", full_page=True)
        browser.close()
    assert problems == []


def test_the_documents_kept_are_bounded_by_count_and_bytes(sae) -> None:
    """The parsed documents kept: the last ``count`` within ``size`` bytes, the newest always;
    one read again is the same object (not parsed again)."""
    from theseus.store.ui._data import artifact_frames
    from theseus.store.ui._feature_page import Documents

    root, nodes = sae
    with open_readonly(root) as store:
        frames = artifact_frames(store, nodes["sae0"].name, nodes["sae0"].nonce, SAE)
        sizes = [store.history(Node.deserialize(f["node"]), SAE)[-1].size for f in frames]
        kept = Documents(count=2)
        first = kept.of(store, frames[0], SAE)
        assert kept.of(store, frames[0], SAE) is first
        for frame in frames:
            kept.of(store, frame, SAE)
            assert len(kept.kept) <= 2
        assert [size for size, _ in kept.kept.values()] == sizes[-2:]
        tiny = Documents(size=1)  # smaller than any document: the newest alone
        for frame in frames:
            assert isinstance(tiny.of(store, frame, SAE), features_module.Features)
            assert len(tiny.kept) == 1
