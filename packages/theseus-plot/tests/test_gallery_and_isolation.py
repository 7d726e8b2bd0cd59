"""The gallery renders, docstring examples run, and a fresh process never imports JAX."""

from __future__ import annotations

import doctest
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import theseus.plot as tp
from theseus.plot import gallery

MODULES = ["_theme", "_heatmap", "_bar", "_relational", "_mixin", "_export", "_inputs"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str):
    module = importlib.import_module(f"theseus.plot.{name}")
    result = doctest.testmod(module, globs=vars(module).copy(), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    if name not in {"_export", "_inputs"}:
        assert result.attempted > 0


def test_gallery_renders_every_helper(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    gallery.main([str(tmp_path / "out")])
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    expected = sorted(
        f"{name}.{ext}" for name in ("heatmap", "bar", "line", "scatter") for ext in ("pdf", "png")
    )
    assert names == expected
    assert capsys.readouterr().out.split() == [
        str(tmp_path / "out" / f"{n}.{e}") for n in gallery.EXAMPLES for e in ("pdf", "png")
    ]
    for name in gallery.EXAMPLES:
        assert (tmp_path / "out" / f"{name}.pdf").read_bytes().startswith(b"%PDF-")
        png = (tmp_path / "out" / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG")
        # 6 x 4 inches at 200 dpi
        assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (1200, 800)


def test_gallery_heatmap_example_data():
    fig = gallery.heatmap_example(np.random.default_rng(0))
    values = np.asarray(fig.axes[0].collections[0].get_array()).reshape(64, 128)
    assert values[:, [7, 42, 99]].mean() > 5.0 > abs(np.delete(values, [7, 42, 99], axis=1).mean())


_FRESH = textwrap.dedent(
    """
    import json, logging, sys, warnings
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    import numpy as np
    import theseus.plot as tp
    logging.getLogger("matplotlib").addHandler(Keep(level=logging.INFO))
    logging.getLogger("matplotlib").setLevel(logging.INFO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        figures = [
            tp.heatmap(np.eye(3), title="Heat \u2212 map", xlabel="x", ylabel="y"),
            tp.bar(x=["a", "b"], y=[1.0, 2.0]),
            tp.line(x=[0, 1], y=[-1.0, 1.0]),
            tp.scatter(x=[0, 1], y=[1e-5, 2e-5]),
        ]
        sizes = [len(tp.to_pdf(f)) + len(tp.to_png(f)) for f in figures]
        notebook = [f._repr_png_() for f in figures]  # what Jupyter shows, pyplot never loaded
    print(json.dumps({
        "notebook": [
            [png == tp.to_png(f), shown["width"] / f.get_figwidth()]
            for f, (png, shown) in zip(figures, notebook)
        ],
        "jax": sorted(m for m in sys.modules if m == "jax" or m.startswith(("jax.", "jaxlib"))),
        "warnings": [str(w.message) for w in caught],
        "logs": [r for r in records if "font" in r.lower()],
        "sizes": sizes,
    }))
    """
)


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Run the helpers in a new interpreter with an empty matplotlib config and font cache."""
    env = {**os.environ, "MPLCONFIGDIR": str(tmp_path_factory.mktemp("mplconfig"))}
    done = subprocess.run(
        [sys.executable, "-c", _FRESH],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fresh_process_never_imports_jax(fresh_process: dict):
    assert fresh_process["jax"] == []
    assert all(size > 1000 for size in fresh_process["sizes"])


def test_the_helpers_figures_show_themselves_in_a_notebook(fresh_process: dict):
    # Jupyter shows a plain Figure only once pyplot has loaded its inline backend (at
    # the first pyplot figure); the helpers' figures carry their own PNG, the same
    # bytes as to_png, shown at 96 CSS px per inch
    assert fresh_process["notebook"] == [[True, 96.0]] * 4


def test_fresh_machine_saves_without_font_warnings(fresh_process: dict):
    assert fresh_process["warnings"] == []
    assert fresh_process["logs"] == []


def test_package_source_never_mentions_importing_jax():
    source = Path(tp.__file__).parent
    for path in source.glob("*.py"):
        text = path.read_text()
        assert "import jax" not in text and "from jax" not in text, path
