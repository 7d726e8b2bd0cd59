"""What the library's plots share: a node's short label, and a figure that says why
there is nothing to draw (so every node still gets its plot and its stamp)."""

from __future__ import annotations

from typing import Any

from theseus.store import Node

__all__ = ["note", "short"]


def short(node: Node) -> str:
    """`run~nonce~seq`: the node without its project and group."""
    return f"{node.name.rsplit('.', 1)[-1]}~{node.nonce}~{node.seq}"


def note(title: str, text: str) -> Any:
    """A themed Figure with `title` that says `text` (host zero; imports matplotlib)."""
    from matplotlib.figure import Figure

    from theseus.plot import theme

    with theme():
        figure = Figure(figsize=(5.0, 3.0))
        axes = figure.subplots()
        axes.set_axis_off()
        axes.set_title(title)
        axes.text(0.5, 0.5, text, ha="center", va="center")
    return figure
