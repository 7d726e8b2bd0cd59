"""Exports: identical bytes for identical figures, TrueType fonts, no warnings, suffix dispatch."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

import theseus.plot as tp
from theseus.plot.gallery import EXAMPLES


def _figure() -> Figure:
    values = np.linspace(-1.0, 1.0, 24).reshape(4, 6)
    return tp.heatmap(
        values, title="Attention \N{MINUS SIGN} logits", xlabel="Feature", ylabel="Token"
    )


def test_to_pdf_twice_gives_the_same_bytes():
    fig = _figure()
    first = tp.to_pdf(fig)
    assert first.startswith(b"%PDF-")
    assert tp.to_pdf(fig) == first


def test_bytes_do_not_depend_on_what_was_rendered_before():
    fig = _figure()
    first = tp.to_pdf(fig)
    tp.to_png(fig)  # a raster draw at another resolution in between
    fig.draw_without_rendering()
    assert tp.to_pdf(fig) == first
    assert tp.to_pdf(_figure()) == first


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_every_helpers_first_pdf_is_its_last(kind: str):
    """The first PDF of a freshly built figure (the gallery's: legends, hues, a colorbar)
    equals one drawn after a PNG at another resolution: constrained layout settles on
    the first draw."""
    fig = EXAMPLES[kind](np.random.default_rng(0))
    first = tp.to_pdf(fig)
    tp.to_png(fig)
    fig.draw_without_rendering()
    assert tp.to_pdf(fig) == first


@pytest.mark.parametrize("shape", [(16, 20), (80, 80), (30, 7)])
def test_a_heatmap_whose_layout_takes_several_draws_to_settle_exports_one_pdf(shape):
    """Constrained layout moves a colorbar heatmap's axes over its first draws; at these
    sizes three exports in a row used to give three PDFs. Every export is the settled one,
    the first as the fourth, and an identically built figure's too."""
    fig = tp.heatmap(np.random.default_rng(0).normal(size=shape))
    exports = [tp.to_pdf(fig) for _ in range(4)]
    assert all(pdf == exports[0] for pdf in exports)
    assert tp.to_pdf(tp.heatmap(np.random.default_rng(0).normal(size=shape))) == exports[0]


def test_two_identically_built_figures_give_the_same_bytes():
    assert tp.to_pdf(_figure()) == tp.to_pdf(_figure())
    assert tp.to_png(_figure()) == tp.to_png(_figure())


def test_pdf_has_no_timestamp():
    pdf = tp.to_pdf(_figure())
    assert b"/CreationDate" not in pdf and b"/ModDate" not in pdf


def test_pdf_fonts_are_embedded_truetype():
    pdf = tp.to_pdf(_figure())
    assert b"/FontFile2" in pdf  # embedded TrueType program (Type 42)
    assert b"/Subtype /Type3" not in pdf
    assert b"/Subtype /Type1" not in pdf
    names = set(re.findall(rb"/BaseFont /(?:[A-Z]{6}\+)?([\w-]+)", pdf))
    assert names and all(name.startswith(b"STIX") for name in names), names


def test_png_is_a_200_dpi_png():
    png = tp.to_png(Figure(figsize=(2, 1)))
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (400, 200)


def test_saving_emits_no_warnings_or_font_logs(caplog: pytest.LogCaptureFixture):
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.DEBUG - 9):
        warnings.simplefilter("always")
        fig = _figure()
        tp.to_pdf(fig)
        tp.to_png(fig)
    assert caught == []
    noisy = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING or "findfont: Font family" in r.getMessage()
    ]
    assert noisy == []


@pytest.mark.parametrize(
    ("suffix", "magic"), [(".pdf", b"%PDF-"), (".png", b"\x89PNG"), (".SVG", b"<?xml")]
)
def test_save_picks_format_from_suffix(tmp_path: Path, suffix: str, magic: bytes):
    fig = _figure()
    path = tp.save(fig, tmp_path / f"figure{suffix}")
    assert path == tmp_path / f"figure{suffix}"
    assert path.read_bytes().startswith(magic)
    assert tp.save(_figure(), tmp_path / f"again{suffix}").read_bytes() == path.read_bytes()


def test_save_pdf_matches_to_pdf(tmp_path: Path):
    fig = _figure()
    assert tp.save(fig, tmp_path / "f.pdf").read_bytes() == tp.to_pdf(fig)


@pytest.mark.parametrize("name", ["figure.jpeg", "figure", "figure.pdf.bak"])
def test_save_unknown_suffix(tmp_path: Path, name: str):
    with pytest.raises(
        tp.PlotValueError, match=r"from its suffix .*use one of \.pdf, \.png, \.svg"
    ):
        tp.save(_figure(), tmp_path / name)
    assert not (tmp_path / name).exists()


def test_save_into_a_missing_folder_says_to_create_it(tmp_path: Path):
    folder = tmp_path / "nodir" / "sub"
    with pytest.raises(tp.PlotValueError) as error:
        tp.save(_figure(), folder / "out.pdf")
    assert str(error.value) == (
        f"save() cannot write {folder / 'out.pdf'}: the folder {folder} does not exist; "
        f"create it first (mkdir -p {folder})."
    )
    assert not (tmp_path / "nodir").exists()


@pytest.mark.parametrize("below", ["out.pdf", "sub/out.pdf"], ids=["folder", "above"])
def test_save_below_a_file_names_the_file_and_advises_no_mkdir(tmp_path: Path, below: str):
    """A file as the folder, or as a folder above it: mkdir -p cannot help there."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(tp.PlotValueError) as error:
        tp.save(_figure(), afile / below)
    assert str(error.value) == (
        f"save() cannot write {afile / below}: {afile} is a file, not a folder; choose a "
        "path in another folder."
    )
    assert afile.read_text() == "x"


def test_export_rejects_non_figures():
    with pytest.raises(tp.PlotTypeError, match=r"expected a matplotlib\.figure\.Figure"):
        tp.to_pdf(Figure().add_subplot())  # an Axes, a common slip


def test_export_does_not_restyle_a_plain_figure():
    fig = Figure()
    fig.add_subplot().plot([0, 1], [0, 1])
    assert tp.to_png(fig) == tp.to_png(fig)
    # Saving under the export settings must not have themed the figure's Axes.
    assert fig.axes[0].spines["top"].get_visible()


def test_large_heatmaps_are_one_raster_image_with_vector_text() -> None:
    """Past RASTERIZE_CELLS cells the PDF holds the cells as one image (not a rectangle
    per cell) and keeps its text as text; small heatmaps and rasterized=False stay vector."""
    from theseus.plot._heatmap import RASTERIZE_CELLS

    rng = np.random.default_rng(0)
    large = rng.random((65, 64))  # 4,160 cells: just past the threshold
    assert large.size > RASTERIZE_CELLS
    raster = tp.to_pdf(tp.heatmap(large, xlabel="Key", ylabel="Query"))
    vector = tp.to_pdf(tp.heatmap(large, xlabel="Key", ylabel="Query", rasterized=False))
    small = tp.to_pdf(tp.heatmap(rng.random((32, 32)), xlabel="Key"))
    # the colour bar is an image in every case (matplotlib draws it so); the cells are
    # one more image only when rasterized
    assert raster.count(b"/Subtype /Image") == vector.count(b"/Subtype /Image") + 1
    assert small.count(b"/Subtype /Image") == vector.count(b"/Subtype /Image")
    assert len(raster) * 3 < len(vector)  # measured: 22 kB against 110 kB
    for pdf in (raster, vector):
        assert b"/Type /Font" in pdf  # tick labels and axis labels are still text
