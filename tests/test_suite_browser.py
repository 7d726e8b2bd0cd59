"""The store browser over an imported training suite, in a real browser (Playwright driving
Debian's Chromium, as packages/theseus-store/tests/test_ui_browser.py).

A suite of four GPT-2 revisions (step1, step2, step4, step1000) is imported with
`import_suite`, as `theseus import hf --revisions all` does; pictures (PDF, SVG), an
SAE's files (cfg.json, sae_weights.safetensors) and a value are then put on its nodes,
as analyses over the suite would. The references are what the import wrote (each
revision's step, its node's seq) and the pixels Chromium draws (a marker is colour
above and below a flat line; the y axis's label is text left of the tick labels).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette", reason="the ui extra is not installed (theseus-store[ui])")
pytest.importorskip("playwright", reason="playwright is not installed (the dev group has it)")

from playwright.sync_api import Page, expect, sync_playwright

from theseus.experiments.models.suite import import_suite
from theseus.registry import import_module_or_file
from theseus.store import Node, Store
from theseus.store.ui import running

pytestmark = pytest.mark.tokenizers

HERE = Path(__file__).parents[1] / "packages"
folders = import_module_or_file(str(HERE / "theseus-core" / "tests" / "gpt2_folder.py"))
suites = import_module_or_file(str(HERE / "theseus-core" / "tests" / "suite_folders.py"))
ui_store = import_module_or_file(str(HERE / "theseus-store" / "tests" / "_ui_store.py"))

STEPS = (1, 2, 4, 1000)
SAE = "sae/blocks_1/8"
SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" width="120" height="60">'
    b'<rect x="10" y="10" width="100" height="40" fill="#1c8a4a"/></svg>'
)
BLUE = (42, 93, 176)  # the first series' colour (#2a5db0)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The imported suite's root and lineage, its nodes holding pictures, an SAE's files
    and ``eval/score`` (0.5 at every revision); a trained lineage ``long`` of 30 nodes
    logging the same value."""
    base = tmp_path_factory.mktemp("suite")
    revisions = {
        f"step{step}": folders.write_gpt2_folder(
            base / "src" / f"step{step}", n_layer=2, n_embd=16, n_head=2, seed=k
        )
        for k, step in enumerate(STEPS)
    }
    cache = suites.hf_cache(base / "models--org--tiny", revisions)
    lineage = import_suite(cache, base / "root", "tiny").lineage
    name, nonce = lineage.split("~")
    with Store(base / "root" / "store") as store:
        for k, step in enumerate(STEPS):
            node = Node(name, nonce, step)
            store.put(node, "attention-map", "attention-map.pdf", ui_store.tiny_pdf((k / 4, 0, 1)))
            store.put(node, "diagram", "diagram.svg", SVG)
            store.put(node, f"{SAE}/cfg.json", "cfg.json", b'{"d_sae": 8}')
            store.put(node, f"{SAE}/sae_weights.safetensors", "sae_weights.safetensors", b"\0" * 64)
            store.log(node, {"eval/score": 0.5})
        node = Node.new("long", project="lm", group="base")
        for _ in range(30):
            store.log(node, {"eval/score": 0.5})
            node = node.next()
    return base / "root", lineage


@pytest.fixture
def tab() -> Iterator[tuple[Page, list[str]]]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=ui_store.chromium(), args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        yield page, problems
        browser.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("THESEUS_UI_SCREENSHOTS", tmp_path / "screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _loaded(page: Page, selector: str) -> None:
    image = page.locator(selector).first
    deadline = time.monotonic() + 10
    while not image.evaluate("img => img.complete && img.naturalWidth > 0"):
        assert time.monotonic() < deadline, f"{selector} did not load in 10 s"
        time.sleep(0.05)


def test_the_lineage_page_names_imported_revisions_not_resumes(suite, tab, shots: Path) -> None:
    root, lineage = suite
    page, problems = tab
    with running(root) as url:
        page.goto(f"{url}/lineage/{lineage}")
        head = page.locator("li.focus > .lhead")
        expect(head).to_contain_text("imported revisions: step 1, 2, 4, 1000")
        expect(head).not_to_contain_text("resumed")
        expect(page.locator("p.actions")).to_contain_text("slider: attention-map")
        expect(page.locator("p.actions")).not_to_contain_text("slider: sae/")
        page.screenshot(path=shots / "suite-1-lineage.png", full_page=True)
    assert problems == []


def test_an_imported_node_shows_only_the_settings_that_applied(suite, tab, shots: Path) -> None:
    root, lineage = suite
    page, problems = tab
    with running(root) as url:
        page.goto(f"{url}/node/{lineage}~1000")
        expect(page.locator("#imported")).to_contain_text("imported revision")
        job = page.locator("section").nth(1)
        expect(job).to_contain_text("import/revision")
        expect(job).to_contain_text("step1000")
        config = page.locator("pre.yaml")
        expect(config).to_contain_text("architecture:")
        expect(config).to_contain_text("n_layers: 2")
        for never in ("lr:", "batch_size:", "tokens:", "optimization:", "training:"):
            expect(config).not_to_contain_text(never)
        page.screenshot(path=shots / "suite-2-node.png", full_page=True)
    assert problems == []


def test_the_slider_steps_through_pictures_labelled_by_step(suite, tab, shots: Path) -> None:
    root, lineage = suite
    page, problems = tab
    with running(root) as url:
        page.goto(f"{url}/slider?" + urlencode({"l": lineage}))
        offered = page.locator('select[name="name"] option').all_text_contents()
        assert offered == ["attention-map", "diagram"]  # cfg.json, safetensors: no frames
        info = page.locator("#frame-info")
        expect(info).to_contain_text(f"1/4 · {lineage}~1 · seq 1 · step 1 ·")
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        expect(info).to_contain_text(f"4/4 · {lineage}~1000 · seq 1000 · step 1000 ·")
        _loaded(page, "#frame-image")
        page.screenshot(path=shots / "suite-3-slider.png", full_page=True)
        page.goto(f"{url}/slider?" + urlencode({"l": lineage, "name": "diagram"}))
        expect(info).to_contain_text("step 1 ·")
        _loaded(page, "#frame-image")  # an SVG is drawn
        page.goto(f"{url}/slider?" + urlencode({"l": lineage, "name": f"{SAE}/cfg.json"}))
        expect(page.locator("#not-picture")).to_contain_text("is not a picture")
        expect(page.locator("#frame-image")).to_have_count(0)
        page.screenshot(path=shots / "suite-4-slider-not-a-picture.png", full_page=True)
    assert problems == []


def _pixels(page: Page) -> tuple[int, int, list[int]]:
    """The chart's width, height and RGBA bytes, as drawn."""
    width, height, data = page.locator("#chart").evaluate(
        "c => [c.width, c.height, Array.from(c.getContext('2d')"
        ".getImageData(0, 0, c.width, c.height).data)]"
    )
    return width, height, data


def _blue(data: list[int], width: int, x: int, y: int) -> bool:
    r, _, b = data[4 * (y * width + x) : 4 * (y * width + x) + 3]
    return b - r > 60 and b > 120  # the series' blue, antialiased; no grid line or text is


def _marked_columns(page: Page) -> tuple[list[int], int]:
    """The columns where the flat series is coloured 3 px above its line (a marker, 4 px
    in radius; the line is 1.6 px wide), and how many text pixels lie left of x = 22 (the y label)."""
    width, height, data = _pixels(page)
    rows = [y for y in range(height) if _blue(data, width, width // 2, y)]
    assert rows, "the series' line crosses the middle of the chart"
    above = min(rows) - 3
    marked = [x for x in range(width) if _blue(data, width, x, above)]
    text = sum(
        1
        for x in range(22)
        for y in range(height)
        if max(data[4 * (y * width + x) : 4 * (y * width + x) + 3]) < 200
    )
    return marked, text


@pytest.mark.slow  # the default suite's budget: nox -s slow runs it
def test_curves_label_the_y_axis_and_mark_few_points(suite, tab, shots: Path) -> None:
    root, lineage = suite
    page, problems = tab
    with running(root) as url:
        page.goto(f"{url}/curves?" + urlencode({"key": "eval/score", "l": lineage}))
        expect(page.locator("#legend")).to_contain_text("4 of 4 points")
        expect(page.locator("#chart")).to_have_attribute("aria-label", "eval/score over nodes")
        marked, text = _marked_columns(page)
        width = page.locator("#chart").evaluate("c => c.width")
        # the markers sit at the ends (x = 1, 2, 4 at the left, 1000 at the right): none
        # in the middle, where the line runs alone
        assert marked and min(marked) < width // 4 and max(marked) > 3 * width // 4
        assert not [x for x in marked if width // 4 < x < 3 * width // 4]
        assert text > 30, "the y axis's label is written left of the tick labels"
        page.screenshot(path=shots / "suite-5-curves.png", full_page=True)
        page.goto(f"{url}/curves?" + urlencode({"key": "eval/score", "l": _long(root)}))
        expect(page.locator("#legend")).to_contain_text("30 of 30 points")
        marked, text = _marked_columns(page)
        assert marked == []  # 30 points (more than 20): a line only
        assert text > 30
        page.screenshot(path=shots / "suite-6-curves-many.png", full_page=True)
    assert problems == []


def _long(root: Path) -> str:
    with Store(root / "store", readonly=True) as store:
        (run,) = [r for r in store.runs() if r["name"] == "lm.base.long"]
    return f"{run['name']}~{run['nonce']}"
