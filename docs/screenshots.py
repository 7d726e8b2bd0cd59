"""The README's pictures of the store browser, taken from the demo's store.

Run: ``uv run python docs/screenshots.py [ROOT] [--out docs/images] [--steps 600]``

Where ROOT holds no store yet, ``theseus demo ROOT --steps STEPS`` runs first (about 30 s
on two cores); ROOT defaults to a temporary folder. The script then serves ROOT's store
read-only with ``theseus-store ui``'s own app on a free loopback port, drives Debian's
Chromium (``/usr/bin/chromium``) with Playwright, and saves three PNGs into ``--out``:

* ``ui-slider.png``: the time slider on the demo's ``attention-pattern`` artifact, moved
  to the lineage's middle validation with the arrow keys, as a user would;
* ``ui-curves.png``: the demo's training loss over seq;
* ``ui-features.png``: the features page of the SAE on the residual stream after the last
  block, the last node's densest feature followed one checkpoint back with the arrow key (the SAEs are
  trained over the demo's checkpoints first, as the README's "Features over training"
  does, where ROOT holds none yet).

Nothing in ROOT is written by the browser (the store is opened read-only).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

from playwright.sync_api import Page, expect, sync_playwright

from theseus.store import Store
from theseus.store.ui import open_readonly, running

ARTIFACT = "attention-pattern"
FEATURES = "features/blocks_1/512/features.json"  # the demo's SAE after its last block
VIEWPORT = {"width": 1280, "height": 1040}


def _demo(root: Path, steps: int) -> None:
    """Run ``theseus demo`` into ``root`` (this environment's own command)."""
    command = [str(Path(sys.executable).with_name("theseus")), "demo", str(root)]
    print(f"running: {' '.join(command)} --steps {steps}", flush=True)
    subprocess.run([*command, "--steps", str(steps)], check=True, stdout=subprocess.DEVNULL)


def _features(root: Path, lineage: str) -> None:
    """The README's "Features over training" commands, where ROOT holds no SAE yet."""
    theseus = str(Path(sys.executable).with_name("theseus"))
    config = root / "features.yaml"
    demo = ["--import", "theseus.analysis.demo"]
    print("training the demo's SAEs over its checkpoints", flush=True)
    subprocess.run([theseus, "configure", "demo/analyze/features", str(config), *demo],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    subprocess.run([theseus, "run", "features", str(config), str(root), "--over", lineage,
                    *demo], check=True, stdout=subprocess.DEVNULL)  # fmt: skip


def _demo_lineage(store: Store) -> str:
    """``name~nonce`` of the newest lineage that holds the tandem attention pattern."""
    nodes = store.query().artifact(ARTIFACT).all()
    if not nodes:
        raise SystemExit(f"no node of this store holds a {ARTIFACT!r} artifact: is it a demo's?")
    newest = max(nodes, key=lambda node: store.get(node)[ARTIFACT].created)
    return f"{newest.name}~{newest.nonce}"


def _image_loaded(tab: Page, selector: str) -> None:
    image = tab.locator(selector).first
    deadline = time.monotonic() + 20
    while not image.evaluate("img => img.complete && img.naturalWidth > 0"):
        if time.monotonic() > deadline:
            raise SystemExit(f"{selector} did not load in 20 s")
        time.sleep(0.05)


def shoot(root: Path, out: Path) -> list[Path]:
    """Save the slider and curves screenshots of ``root``'s demo lineage into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with open_readonly(root) as store:
        lineage = _demo_lineage(store)
        trained = bool(store.query().artifact(FEATURES).all())
    if not trained:
        _features(root, lineage)
    with running(root) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=shutil.which("chromium") or "/usr/bin/chromium",
            args=["--no-sandbox", "--disable-gpu"],
        )
        tab = browser.new_page(viewport=VIEWPORT)
        tab.goto(url + "/slider?" + urlencode({"l": lineage, "name": ARTIFACT}))
        info = tab.locator("#frame-info")
        expect(info).to_contain_text("seq")
        frames = int(info.inner_text().split("/", 1)[1].split()[0])
        for _ in range(frames // 2):
            tab.keyboard.press("ArrowRight")
        expect(info).to_contain_text(f"{frames // 2 + 1}/{frames}")
        _image_loaded(tab, "#frame-image")
        slider = out / "ui-slider.png"
        tab.screenshot(path=slider)

        tab.set_viewport_size({"width": VIEWPORT["width"], "height": 700})
        tab.goto(url + "/curves?" + urlencode({"key": "train/loss", "l": lineage}))
        expect(tab.locator("#legend")).to_contain_text("points")
        curves = out / "ui-curves.png"
        tab.screenshot(path=curves)

        tab.set_viewport_size(VIEWPORT)
        tab.goto(url + "/features?" + urlencode({"l": lineage, "name": FEATURES}))
        expect(tab.locator("#feature-title")).to_contain_text("Feature #")
        info = tab.locator("#frame-info")
        shown = info.inner_text()
        tab.keyboard.press("ArrowLeft")  # the last node's densest feature, one checkpoint back
        expect(info).not_to_have_text(shown)
        expect(tab.locator("#story")).not_to_contain_text("The chain's first SAE")
        features = out / "ui-features.png"
        tab.screenshot(path=features)
        browser.close()
    return [slider, curves, features]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", type=Path, help="a demo's root (default: a new one)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("images"))
    parser.add_argument("--steps", type=int, default=600, help="the demo's steps when it runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="theseus-screenshots-") as scratch:
        root = (args.root or Path(scratch) / "theseus-demo").absolute()
        if not (root / "store").exists():
            _demo(root, args.steps)
        for path in shoot(root, args.out):
            print(f"saved {path} ({path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
