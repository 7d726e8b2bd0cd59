"""The store browser in a real browser: Playwright driving Debian's Chromium.

Clicks runs -> lineage -> node -> artifact -> slider -> compare -> curves, checks that
hostile text from the store shows as text and that no dialog opens, that the page
logs no error (a Content-Security-Policy violation is one), that a lineage still
being written updates without a reload, and saves a screenshot of each page
(under ``THESEUS_UI_SCREENSHOTS`` if set, else the test's temporary folder).

Chromium: ``/usr/bin/chromium`` (``apt-get install chromium``; Playwright's own
browser download is not used). Without it the tests skip, except under CI (the
``CI`` variable set), where they fail.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

pytest.importorskip("starlette", reason="the ui extra is not installed (theseus-store[ui])")
pytest.importorskip("playwright", reason="playwright is not installed (the dev group has it)")

import _ui_store
from playwright.sync_api import Browser, Page, expect, sync_playwright

from theseus.store import MARKER, Node, Store
from theseus.store.ui import running

HOSTILE = _ui_store.HOSTILE


_chromium = _ui_store.chromium


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = _chromium()
    with sync_playwright() as playwright:
        opened = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-gpu"]
        )
        yield opened
        opened.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("THESEUS_UI_SCREENSHOTS", tmp_path / "screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _loaded(tab: Page, selector: str) -> None:
    """Wait until the image ``selector`` names has loaded (a polled evaluate, not
    ``wait_for_function``, whose string evaluation the page's CSP rightly refuses)."""
    image = tab.locator(selector).first
    deadline = time.monotonic() + 10
    while not image.evaluate("img => img.complete && img.naturalWidth > 0"):
        assert time.monotonic() < deadline, f"{selector} did not load in 10 s"
        time.sleep(0.05)


@pytest.fixture
def page(browser: Browser) -> Iterator[tuple[Page, list[str]]]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    problems: list[str] = []
    opened.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    opened.on(
        "console",
        lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    opened.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    yield opened, problems
    context.close()


def test_click_through_every_page(tmp_path: Path, page, shots: Path) -> None:
    tab, problems = page
    root = tmp_path / "store"
    nodes = _ui_store.build(root)
    with running(root) as url:
        tab.goto(url + "/")
        expect(tab.locator("h1")).to_contain_text("2 lineages")
        tab.screenshot(path=shots / "1-runs.png", full_page=True)

        tab.get_by_role("link", name="tune", exact=True).click()
        expect(tab.locator(".tree")).to_contain_text("branch")
        expect(tab.locator(".tree")).to_contain_text("resumed at seq 6")
        scheduled = tab.locator('[data-field="scheduled"]')
        expect(scheduled).to_have_text("SLURM job 4242: running, requeued 1x (at seq 3)")
        tab.screenshot(path=shots / "2-lineage.png", full_page=True)

        base = nodes["base11"]
        tab.locator(f'a.cell[href="/node/{base.serialize()}"]').click()
        expect(tab.locator("h1")).to_have_text(base.serialize())
        expect(tab.get_by_text(HOSTILE, exact=True).first).to_be_visible()  # the value `note`
        tab.screenshot(path=shots / "3-node.png", full_page=True)

        tab.get_by_role("link", name="v2 metrics.json").click()
        expect(tab.locator(".jsonview")).to_contain_text("nested")
        expect(tab.locator(".jsonview")).to_contain_text(HOSTILE)
        tab.screenshot(path=shots / "4-artifact-json.png", full_page=True)
        tab.go_back()
        tab.get_by_role("link", name=f"v1 {_ui_store.HOSTILE_IMG}.txt").click()
        expect(tab.locator("pre.text")).to_have_text(f"text {HOSTILE}")

        picture = nodes["base9"]
        tab.goto(url + f"/node/{picture.serialize()}")
        tab.get_by_role("link", name="v1 picture.pdf").click()
        image = tab.locator("img.picture").first
        expect(image).to_be_visible()
        _loaded(tab, "img.picture")
        tab.screenshot(path=shots / "5-artifact-pdf.png", full_page=True)

        tab.locator("main").get_by_role("link", name="slider").click()
        info = tab.locator("#frame-info")
        expect(info).to_contain_text("1/4")
        expect(info).to_contain_text(f"{nodes['base0'].serialize()} · seq 0")
        first = tab.locator("#frame-image").get_attribute("src")
        tab.keyboard.press("ArrowRight")
        expect(info).to_contain_text("2/4")
        expect(info).to_contain_text("seq 3 · step 30")
        assert tab.locator("#frame-image").get_attribute("src") != first
        tab.keyboard.press("ArrowRight")
        tab.keyboard.press("ArrowRight")
        expect(info).to_contain_text("4/4")
        _loaded(tab, "#frame-image")
        tab.screenshot(path=shots / "6-slider.png", full_page=True)

        tune = nodes["tune0"]
        tab.goto(url + f"/node/{tune.serialize()}")
        tab.get_by_role("link", name="compare with parent").click()
        expect(tab.locator("pre.diff")).to_contain_text("+lr: 0.0001")
        expect(tab.locator("table.compare")).to_contain_text(HOSTILE)
        tab.screenshot(path=shots / "7-compare.png", full_page=True)

        lineages = [f"{n.name}~{n.nonce}" for n in (nodes["tune0"], nodes["base0"])]
        tab.goto(url + "/curves?" + urlencode({"key": "val/loss", "l": lineages}, doseq=True))
        expect(tab.locator("#legend")).to_contain_text("10 of 10 points")
        expect(tab.locator("#legend")).to_contain_text("12 of 12 points")
        tab.locator("#logy").check()
        assert "log=1" in tab.url  # the view is in the address: a reload keeps it
        tab.reload()
        expect(tab.locator("#logy")).to_be_checked()
        tab.screenshot(path=shots / "8-curves.png", full_page=True)

        # Live: a node written now shows on the open lineage page within 5 s, no reload.
        tab.goto(url + f"/lineage/{lineages[0]}")
        last = tab.locator('[data-field="last_seq"]')
        expect(last).to_have_text("3")
        with Store(root) as writer:
            writer.log(nodes["tune3"].next(), {"val/loss": 0.25})
        expect(last).to_have_text("4", timeout=5000)
        expect(tab.locator('[data-key="val/loss"]')).to_have_text("0.25", timeout=5000)
        expect(tab.locator("ul.tree")).to_contain_text("5 nodes, seq 0..4", timeout=5000)
        expect(tab.locator('li.focus > .strip > a.cell[title="seq 4"]')).to_have_count(1)
    assert problems == []


def test_the_pickers_and_the_version_chooser(tmp_path: Path, page, shots: Path) -> None:
    """The header's slider and compare open pickers; the slider of an artifact whose nodes
    hold different newest versions says so, names each frame's version, and shows one
    version when chosen."""
    tab, problems = page
    root = tmp_path / "store"
    nodes = _ui_store.build(root)
    base = nodes["base0"]
    with Store(root) as store:  # a second version of the picture at seqs 3 and 9 (--over --force)
        for seq in (3, 9):
            node = Node(base.name, base.nonce, seq)
            store.put(node, "picture", "picture-v2.pdf", _ui_store.tiny_pdf((0.0, 0.2, 1.0)))
    with running(root) as url:
        tab.goto(url + "/")
        tab.locator("header").get_by_role("link", name="slider").click()
        expect(tab.locator("h1")).to_have_text("Over time")
        tab.locator("#pick-lineage").select_option(f"{base.name}~{base.nonce}")
        tab.screenshot(path=shots / "9-slider-picker.png", full_page=True)
        tab.get_by_role("button", name="show").click()
        tab.locator('select[name="name"]').select_option("picture")
        tab.get_by_role("button", name="show").click()
        expect(tab.locator("#mixed")).to_contain_text("v1 at 2 nodes, v2 at 2 nodes")
        info = tab.locator("#frame-info")
        expect(info).to_contain_text("1/4")
        expect(info).to_contain_text("seq 0")
        expect(info).to_contain_text("· v1")
        tab.keyboard.press("ArrowRight")
        expect(info).to_contain_text("seq 3")
        expect(info).to_contain_text("· v2 of v1, v2")
        _loaded(tab, "#frame-image")
        tab.screenshot(path=shots / "10-slider-versions.png", full_page=True)
        tab.locator("#version").select_option("1")
        tab.get_by_role("button", name="show").click()
        expect(tab.locator("#mixed")).to_have_count(0)
        expect(info).to_contain_text("1/4 · ")  # loaded: now step
        tab.keyboard.press("ArrowRight")
        expect(info).to_contain_text("seq 3")
        expect(info).to_contain_text("· v1 of v1, v2")
        _loaded(tab, "#frame-image")

        tab.locator("header").get_by_role("link", name="compare").click()
        expect(tab.locator("h1")).to_have_text("Compare")
        tab.locator("#pick-a").fill(nodes["base5"].serialize())
        tab.locator("#pick-b").fill(nodes["tune0"].serialize())
        tab.screenshot(path=shots / "11-compare-picker.png", full_page=True)
        tab.get_by_role("button", name="compare").click()
        expect(tab.locator("pre.diff")).to_contain_text("+lr: 0.0001")
    assert problems == []


@pytest.mark.slow
def test_click_through_a_demo_run(
    backend: str, tmp_path: Path, page, shots: Path, request: pytest.FixtureRequest
) -> None:
    """The same walk over the store of a real (2-step) training run: `theseus demo` on a
    folder, and (``--postgres``) on a PostgreSQL URL whose files go to the same folder."""
    tab, problems = page
    theseus = Path(sys.executable).with_name("theseus")
    if not theseus.exists():
        pytest.skip("the theseus command (theseus-core, theseus-analysis) is not installed")
    root = str(tmp_path) if backend == "sqlite" else request.getfixturevalue("pg_url")(tmp_path)
    demo = subprocess.run(
        [str(theseus), "demo", "--steps", "2", root],
        check=True, timeout=300, capture_output=True, text=True,
    )  # fmt: skip
    assert "postgresql:/" not in "".join(p.name for p in Path.cwd().iterdir())
    assert str(tmp_path) in demo.stdout
    if backend == "postgres":
        assert not (tmp_path / "store" / "store.sqlite").exists()
    with Store(tmp_path / "store", readonly=True) as store:
        (run,) = [r for r in store.runs() if r["name"] == "theseus.demo.demo"]
    lineage = f"{run['name']}~{run['nonce']}"
    with running(tmp_path) as url:
        tab.goto(url + "/")
        if backend == "postgres":  # the header names the database, not a SQLite file
            expect(tab.locator("span.root")).to_contain_text("postgresql://")
        tab.get_by_role("link", name="demo", exact=True).click()
        expect(tab.locator("h1")).to_have_text(lineage)
        tab.screenshot(path=shots / "demo-1-lineage.png", full_page=True)
        tab.locator("a.cell.ckpt").last.click()
        expect(tab.locator("h1")).to_contain_text(lineage)
        tab.screenshot(path=shots / "demo-2-node.png", full_page=True)
        tab.locator("a.version").filter(has_text="attention-pattern.pdf").first.click()
        _loaded(tab, "img.picture")
        tab.screenshot(path=shots / "demo-3-artifact.png", full_page=True)
        tab.locator("main").get_by_role("link", name="slider").click()
        expect(tab.locator("#frame-info")).to_contain_text("val/loss")
        tab.keyboard.press("ArrowRight")
        tab.screenshot(path=shots / "demo-4-slider.png", full_page=True)
        tab.goto(url + "/curves?" + urlencode({"key": "val/loss", "l": lineage}))
        expect(tab.locator("#legend")).to_contain_text(lineage)
        tab.screenshot(path=shots / "demo-5-curves.png", full_page=True)
        last = Node(run["name"], run["nonce"], run["last_seq"])
        tab.goto(
            url
            + "/compare?"
            + urlencode({"a": Node(last.name, last.nonce, 0).serialize(), "b": last.serialize()})
        )
        expect(tab.locator("table.compare")).to_contain_text("val/loss")
        tab.screenshot(path=shots / "demo-6-compare.png", full_page=True)
    assert problems == []


def _lineage_row(store_folder: Path, run: str) -> dict | None:
    """The store's row (`Store.runs()`) of the run named ``run``, any project and group."""
    if not (store_folder / MARKER).exists():
        return None
    with Store(store_folder, readonly=True) as store:
        rows = [r for r in store.runs() if r["name"].split(".")[-1] == run]
    return rows[0] if rows else None


def _last_seq(store_folder: Path, run: str) -> int:
    """The newest seq of the run named ``run``; 0 before it has written."""
    row = _lineage_row(store_folder, run)
    return 0 if row is None else int(row["last_seq"])


def _tree_end(tab: Page) -> int:
    """The last seq the lineage page's tree shows ("N nodes, seq 0..LAST")."""
    found = re.search(r"seq \d+\.\.(\d+)", tab.locator("ul.tree").inner_text())
    return int(found[1]) if found else -1


@pytest.mark.slow
def test_an_open_lineage_page_follows_a_training_run(
    backend: str, tmp_path: Path, page, shots: Path, request: pytest.FixtureRequest
) -> None:
    """While `theseus run` trains a small GPT, the open lineage page shows each new node
    (one a validation) within 5 s of its write, without a reload (a folder store, and with
    ``--postgres`` a PostgreSQL one whose files are in the same folder)."""
    tab, problems = page
    theseus = Path(sys.executable).with_name("theseus")
    if not theseus.exists():
        pytest.skip("the theseus command (theseus-core, theseus-analysis) is not installed")
    run = [str(theseus), "data", "prepare", "synthetic", "--root", str(tmp_path)]
    subprocess.run([*run, "--tokens", "30000", "--val-tokens", "4000"], check=True, timeout=300)
    config = tmp_path / "gpt.yaml"
    subprocess.run([str(theseus), "configure", "gpt/train/pretrain", str(config)], check=True)
    root = str(tmp_path) if backend == "sqlite" else request.getfixturevalue("pg_url")(tmp_path)
    settings = {
        "architecture.n_layers": 1, "architecture.n_embd": 32, "architecture.n_head": 2,
        "architecture.block_size": 32, "training.batch_size": 8,
        "training.tokens": 8 * 32 * 100_000, "training.validation_steps": 1,
        "logging.validation_interval": 5, "logging.report_interval": 5,
        "logging.checkpoint_interval": 50,
    }  # fmt: skip
    log = tmp_path / "live.log"
    with log.open("wb") as out:
        training = subprocess.Popen(
            [str(theseus), "run", "live", str(config), root]
            + [f"{key}={value}" for key, value in settings.items()],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    name = "live"
    try:
        deadline = time.monotonic() + 300
        while _last_seq(tmp_path / "store", name) < 1:
            assert training.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "the run wrote no second node in 300 s"
            time.sleep(0.2)
        lineage = _lineage_row(tmp_path / "store", name)
        assert lineage is not None
        with running(tmp_path) as url:
            tab.goto(url + f"/lineage/{lineage['name']}~{lineage['nonce']}")
            shown = tab.locator('[data-field="last_seq"]')
            seen = []
            for _ in range(3):  # three new nodes, each on the page within 5 s of its write
                before = int(shown.text_content() or "-1")
                while (written := _last_seq(tmp_path / "store", name)) <= before:
                    assert training.poll() is None, "the run ended before three new nodes"
                    assert time.monotonic() < deadline, "the run wrote no new node in time"
                    time.sleep(0.05)
                written_at = time.monotonic()
                while int(shown.text_content() or "-1") < written or _tree_end(tab) < written:
                    assert time.monotonic() - written_at < 5, (
                        f"node {written} was written {time.monotonic() - written_at:.1f} s ago "
                        f"and the page still shows seq {shown.text_content()}, the tree "
                        f"{tab.locator('ul.tree').inner_text()!r}"
                    )
                    time.sleep(0.05)
                seen.append(written)
            tab.screenshot(path=shots / "live-lineage.png", full_page=True)
        assert seen == sorted(set(seen)), seen
    finally:
        os.killpg(training.pid, 9)
        training.wait()
    assert problems == []
