"""How an artifact is shown in a page: JSON as a tree, text as text, a PDF as a PNG picture.

PDF pages are rendered on the server with pypdfium2 (PDFium, a self-contained
wheel) and encoded as PNG here with ``zlib``, so the browser needs no PDF viewer
and no third-party script. PDFium is not thread-safe, not even across documents,
and the server answers requests on a pool of threads: every PDFium call here holds
one process-wide lock (without it, two pictures asked at once crash the server).
"""

from __future__ import annotations

import functools
import json
import struct
import threading
import zlib
from typing import Any

__all__ = ["is_picture", "kind_of", "pdf_page_count", "pdf_to_png", "png_bytes"]

# The files a browser draws itself (an <img> of the bytes), by suffix: their media types.
IMAGES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".svg": "image/svg+xml",  # drawn by <img>, where an SVG runs no script
}
# The longest side of a rendered PDF page, in pixels.
RENDER_PX = 1400
# Held around every PDFium call: PDFium allows one call at a time in a process.
_PDFIUM = threading.Lock()


def is_picture(filename: str) -> bool:
    """Whether a file can be drawn as a picture: a PDF (its first page rendered here) or
    an image a browser draws (:data:`IMAGES`: PNG, JPEG, GIF, SVG), by its suffix."""
    lower = filename.lower()
    return lower.endswith(".pdf") or any(lower.endswith(ext) for ext in IMAGES)


def kind_of(filename: str, content: bytes) -> str:
    """``pdf``, ``image``, ``json``, ``text`` or ``binary``: how the page shows the bytes."""
    lower = filename.lower()
    if content.startswith(b"%PDF-"):
        return "pdf"
    if any(lower.endswith(ext) for ext in IMAGES):
        return "image"
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return "binary"
    if "\x00" in text:
        return "binary"
    if lower.endswith(".json"):
        try:
            json.loads(text)
        except ValueError:
            return "text"
        return "json"
    return "text"


def png_bytes(width: int, height: int, pixels: bytes, channels: int = 4) -> bytes:
    """Encode ``height`` rows of ``width`` RGB (3 channels) or RGBA (4) pixels as a PNG file."""
    if channels not in (3, 4):
        raise ValueError(f"Expected 3 (RGB) or 4 (RGBA) channels, got {channels}.")
    if len(pixels) != width * height * channels:
        raise ValueError(
            f"Expected {width}x{height}x{channels} = {width * height * channels} bytes of "
            f"pixels, got {len(pixels)}."
        )
    stride = width * channels
    raw = b"".join(b"\x00" + pixels[y * stride : (y + 1) * stride] for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 6 if channels == 4 else 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def pdf_page_count(content: bytes) -> int:
    """How many pages the PDF has."""
    import pypdfium2

    with _PDFIUM:
        document = pypdfium2.PdfDocument(content)
        try:
            return len(document)
        finally:
            document.close()


@functools.lru_cache(maxsize=256)
def pdf_to_png(content: bytes, page: int = 0) -> bytes:
    """Render one page of a PDF to PNG bytes, its longer side :data:`RENDER_PX` pixels.

    Raises:
        IndexError: the PDF has no such page.
    """
    import pypdfium2

    with _PDFIUM:
        document = pypdfium2.PdfDocument(content)
        try:
            if not 0 <= page < len(document):
                raise IndexError(f"The PDF has pages 0 to {len(document) - 1}; page {page} asked.")
            sheet = document[page]
            width, height = sheet.get_size()
            scale = RENDER_PX / max(width, height, 1)
            bitmap = sheet.render(scale=scale, fill_color=(255, 255, 255, 255), rev_byteorder=True)
            try:
                pixels: Any = bitmap.buffer
                data = bytes(pixels)
                w, h, stride = bitmap.width, bitmap.height, bitmap.stride
                channels = bitmap.n_channels
            finally:
                bitmap.close()
                sheet.close()
        finally:
            document.close()
    if stride != w * channels:  # rows padded: drop the padding
        data = b"".join(data[y * stride : y * stride + w * channels] for y in range(h))
    return png_bytes(w, h, data, channels)
