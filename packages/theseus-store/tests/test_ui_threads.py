"""The browser's server renders PDF pictures for many requests at once.

PDFium allows one call at a time in a process; uvicorn answers requests on a pool
of threads, so a page that asks for several pictures (the time slider prefetches
its neighbours) used to crash the server (SIGSEGV, SIGTRAP) or fail a render.
The server runs in a child process here, so a crash fails this test instead of
the test run. Reference: each picture's pixel inside the rectangle has the
colour the PDF was drawn with, decoded by Pillow.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the ui extra is not installed (theseus-store[ui])")
pytest.importorskip("pypdfium2", reason="the ui extra is not installed (theseus-store[ui])")
pytest.importorskip("PIL.Image")

from theseus.store import Node, Store

N = 48


def _tiny_pdf():
    import _ui_store  # this folder is on sys.path: see conftest.py

    return _ui_store.tiny_pdf


CHILD = textwrap.dedent(
    """
    import io, json, sys, urllib.parse, urllib.request
    from concurrent.futures import ThreadPoolExecutor
    from PIL import Image
    from theseus.store.ui import running

    root, nodes = sys.argv[1], json.loads(sys.argv[2])

    def fetch(args):
        url, node = args
        query = urllib.parse.urlencode({"node": node, "name": "picture"})
        with urllib.request.urlopen(f"{url}/png?{query}", timeout=60) as response:
            image = Image.open(io.BytesIO(response.read())).convert("RGB")
        return image.size, image.getpixel((350, 350))

    with running(root) as url, ThreadPoolExecutor(16) as pool:
        for _ in range(2):  # the second round is served from the cache
            answers = list(pool.map(fetch, [(url, node) for node in nodes]))
    print(json.dumps(answers))
    """
)


def test_many_pictures_at_once_render_each_its_own_pdf(tmp_path: Path) -> None:
    tiny_pdf = _tiny_pdf()
    root = tmp_path / "store"
    nodes = []
    with Store(root) as store:
        node = Node.new("pictures", project="ui", group="render")
        for seq in range(N):
            node = node.next() if seq else node
            store.log(node, {"seq": seq})
            store.put(
                node, "picture", "picture.pdf", tiny_pdf((0.0, seq / (N - 1), 1.0), detail=10)
            )
            nodes.append(node.serialize())
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), json.dumps(nodes)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"the server's process ended with {done.returncode}:\n{done.stderr[-3000:]}"
    )
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(answers) == N
    for seq, (size, pixel) in enumerate(answers):
        assert size == [1400, 700]
        green = round(255 * seq / (N - 1))
        assert pixel[0] == 0 and pixel[2] == 255 and abs(pixel[1] - green) <= 1, (seq, pixel)
