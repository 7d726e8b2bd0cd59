"""docs/screenshots.py makes the README's pictures from a demo's store, in Chromium."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


@pytest.mark.slow
def test_the_script_shoots_a_fresh_demo_store(tmp_path: Path) -> None:
    pytest.importorskip("playwright")
    if not Path("/usr/bin/chromium").exists() and not shutil.which("chromium"):
        if os.environ.get("CI"):
            pytest.fail("CI is set and there is no Chromium (apt-get install chromium)")
        pytest.skip("no Chromium")
    root = tmp_path / "demo"
    out = tmp_path / "images"
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "screenshots.py"), str(root), "--out", str(out),
         "--steps", "40"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (root / "store").is_dir(), "the script runs the demo where ROOT has no store"
    assert _png_size(out / "ui-slider.png") == (1280, 1040)
    assert _png_size(out / "ui-curves.png") == (1280, 700)
    assert _png_size(out / "ui-features.png") == (1280, 1040)
    # The slider's picture is the attention pattern, not an empty page: many distinct bytes.
    assert (out / "ui-slider.png").stat().st_size > 20_000
